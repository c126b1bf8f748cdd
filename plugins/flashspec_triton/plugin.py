"""Registers the ``triton`` verifier (imports triton lazily).

``noise = "philox"`` (the default) draws the accept uniforms and the race's
exponentials inside the kernels from a device ``(seed, counter)`` state that each step
draws from its generator with one ``torch.randint`` on the device: the same generator
seed gives the same verdict (the Verifier contract), nothing is read back to the host,
and CUDA-graph replays with the default generator get fresh noise (torch advances the
captured generator on every replay). Streams differ from the reference verifier's for
the same generator; the distribution is the same. ``philox_draw`` picks how the recovered or
bonus token is drawn (``auto``: one race over the vocabulary, or at large batch and vocabulary
a block by its mass and then a race in it; :mod:`flashspec_kernels.verify`, "Philox draws").

Trees (:class:`flashspec_core.contracts.VerifiesTrees`): ``verify_tree`` and
``verify_tree_with_noise`` run :mod:`flashspec_kernels.verify_tree` with the same noise
conventions (exact mode: the reference verifier's tokens), graph-replayed per node count: the
tree's shape is copied into the graph as data, so a dynamic tree replays one graph. A tree has at
most ``max_tree_nodes`` (:data:`flashspec_kernels.verify_tree.MAX_NODES`, 64) nodes
(:class:`flashspec_core.contracts.LimitsTreeNodes`).
Inputs outside the contract are flagged per row in the verdict's ``flags`` on the device, on
every device (no host sync; the pipeline reads them with its one copy): the kernels flag draft
ids outside ``[0, V)`` and logits NaN, ``+inf`` or all ``-inf`` at a position as they read them,
and one reduction over ``q`` (:func:`flashspec_core.checks.draft_flags`) flags a ``q`` that is
not a distribution.

``noise = "exact"`` draws :class:`flashspec_core.sampling.Noise` from the generator
exactly as the reference verifier does (one ``[B, V]`` float32 exponential tensor per
step, which the race then reads) and so emits the reference's tokens.

On CUDA, steps replay a captured graph of the kernels instead of launching them from Python
(:mod:`flashspec_triton.stepgraphs`): without copying the logits once they come back at an
address seen before (``graph_pin``, as the fast target's static output buffer does), or over
copies of the inputs when the logits take up to ``graph_max_bytes`` bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import attrs
import torch

from flashspec_core import ComponentSpec, SamplingParams, Verdict, Verifier, hookimpl
from flashspec_core.checks import draft_flags, flagged, verifier_inputs
from flashspec_core.sampling import Noise, RowsOverVerify
from flashspec_core.tree import TreeVerdict, node_depths
from flashspec_triton.keys import COMPONENTS
from flashspec_triton.keys import TritonVerifierConfig as TritonVerifierConfig  # defined without torch
from flashspec_triton.stepgraphs import StepGraphs


class TritonVerifier(RowsOverVerify):
    """Rejection sampling in three Triton kernels (see :mod:`flashspec_kernels.verify`)."""

    def __init__(self, config: TritonVerifierConfig, device: torch.device | str | None = None) -> None:
        from flashspec_kernels import verify as ops  # triton is imported here, not at plugin load
        from flashspec_kernels.verify_tree import MAX_NODES

        self._ops = ops
        self.config = config
        self.max_tree_nodes = MAX_NODES  # LimitsTreeNodes: the pipeline refuses a larger tree arm when built
        self.max_chain_tokens = ops.MAX_GAMMA  # LimitsChainTokens: the pipeline refuses a longer chain arm when built
        self.device = torch.device(device) if device is not None else None
        self._graphs = StepGraphs(config.graph_max_bytes, pin=config.graph_pin)

    @property
    def graphs(self) -> StepGraphs:
        """The step graphs (:class:`~flashspec_core.contracts.CapturesGraphs`): a step whose
        verification captured one is timed as setup, not learned from."""
        return self._graphs

    def verify(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V]
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verdict:
        if sampling.greedy:
            return self._run(target_logits, draft_tokens, draft_probs, sampling, None, None)
        if self.config.noise == "exact":
            batch, gamma = draft_tokens.shape
            noise = Noise.draw(batch, gamma, target_logits.shape[-1], generator, target_logits.device)
            return self.verify_with_noise(target_logits, draft_tokens, draft_probs, sampling, noise)
        state = self._ops.new_philox_state(generator, target_logits.device)
        return self._run(target_logits, draft_tokens, draft_probs, sampling, None, state)

    def verify_with_noise(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V]
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None
        sampling: SamplingParams,
        noise: Noise,
    ) -> Verdict:
        """Same as :meth:`verify` with the reference's noise (token-exact comparisons)."""
        return self._run(target_logits, draft_tokens, draft_probs, sampling, noise, None)

    def _run(
        self,
        logits: torch.Tensor,
        tokens: torch.Tensor,
        probs: torch.Tensor | None,
        sampling: SamplingParams,
        noise: Noise | None,
        state: torch.Tensor | None,
    ) -> Verdict:
        """The kernels, launched directly or replayed from the graph captured for this shape.
        Inputs outside the contract are refused or flagged first (third parties call it directly)."""
        flags = verifier_inputs(logits, tokens, probs)
        if flags is not None:  # on an accelerator bad rows are only flagged: the kernels must not index by their ids
            tokens = tokens.clamp(0, logits.shape[-1] - 1)
        programs, draw = self.config.programs or None, self.config.philox_draw
        inputs, present = _pack(logits, tokens, probs, noise, state)

        def step(*inputs: torch.Tensor) -> Verdict:
            logits, tokens, probs, noise, state = _unpack(inputs, present)
            return self._ops.verify_triton(
                logits, tokens, probs, sampling, noise=noise, state=state, programs=programs, draw=draw
            )

        return flagged(self._graphs((sampling, *present, programs, draw), step, *inputs), flags)

    def verify_tree(
        self,
        target_logits: torch.Tensor,  # [B, N+1, V]
        draft_tokens: torch.Tensor,  # [B, N] int64
        parents: torch.Tensor,  # [N] int64 CPU, -1 = a child of the root
        draft_probs: torch.Tensor | None,  # [B, N, V] or None (every node deterministic)
        sampling: SamplingParams,
        generator: torch.Generator | None,
        *,
        without_replacement: bool = False,
    ) -> TreeVerdict:
        """Multi-draft rejection sampling over the tree (greedy descent at temperature 0).
        ``without_replacement``: each sibling was drawn without its elder siblings' tokens."""
        if sampling.greedy:
            return self._run_tree(target_logits, draft_tokens, parents, draft_probs, sampling, None, None,
                                  without_replacement)  # fmt: skip
        if self.config.noise == "exact":
            batch, nodes = draft_tokens.shape
            noise = Noise.draw(batch, nodes, target_logits.shape[-1], generator, target_logits.device)
            return self._run_tree(target_logits, draft_tokens, parents, draft_probs, sampling, noise, None,
                                  without_replacement)  # fmt: skip
        state = self._ops.new_philox_state(generator, target_logits.device)
        return self._run_tree(target_logits, draft_tokens, parents, draft_probs, sampling, None, state,
                              without_replacement)  # fmt: skip

    def verify_tree_with_noise(
        self,
        target_logits: torch.Tensor,  # [B, N+1, V]
        draft_tokens: torch.Tensor,  # [B, N] int64
        parents: torch.Tensor,  # [N] int64 CPU
        draft_probs: torch.Tensor | None,  # [B, N, V] or None
        sampling: SamplingParams,
        noise: Noise | None,  # None only when greedy
        *,
        without_replacement: bool = False,
    ) -> TreeVerdict:
        """Same as :meth:`verify_tree` with the reference's noise (token-exact comparisons)."""
        if not sampling.greedy and noise is None:
            raise ValueError("verify_tree_with_noise: sampling is not greedy, so noise is required")
        noise = None if sampling.greedy else noise
        return self._run_tree(target_logits, draft_tokens, parents, draft_probs, sampling, noise, None,
                              without_replacement)  # fmt: skip

    def _run_tree(
        self,
        logits: torch.Tensor,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        probs: torch.Tensor | None,
        sampling: SamplingParams,
        noise: Noise | None,
        state: torch.Tensor | None,
        without: bool,
    ) -> TreeVerdict:
        """The tree kernels, launched directly or replayed from the graph of this node count: the
        tree's shape is a graph input (its tables), never part of the key, so a dynamic tree whose
        shape changes every step at a fixed node count replays one graph."""
        from flashspec_kernels import verify_tree

        plist = verify_tree.parents_tuple(parents)
        verify_tree.check_inputs(logits, tokens, len(plist), probs)
        nodes, depth = len(plist), max(node_depths(plist), default=0)
        node_table, elder = verify_tree.tree_index(plist, logits.device)
        programs = self.config.programs or None
        inputs, present = _pack(logits, tokens, probs, noise, state)
        tables = [node_table, elder] if without else [node_table]  # only without replacement reads elder

        def step(*args: torch.Tensor) -> TreeVerdict:
            logits, tokens, probs, noise, state = _unpack(args[: len(inputs)], present)
            shape = args[len(inputs) :]
            # outputs sized by the node count, which bounds every shape's depth: one graph for all
            verdict = verify_tree.verify_tree_tables(
                logits, tokens, shape[0], shape[1] if without else None, nodes, probs, sampling, noise=noise,
                state=state, without_replacement=without, programs=programs,
            )  # fmt: skip
            assert verdict.flags is not None
            return attrs.evolve(verdict, flags=verdict.flags | draft_flags(tokens, probs, logits.shape[-1]))

        key = ("tree", nodes, without, sampling, *present, programs)  # shapes and strides join it in StepGraphs
        verdict: TreeVerdict = self._graphs(key, step, *inputs, *tables)
        return attrs.evolve(verdict, path=verdict.path[:, :depth], tokens=verdict.tokens[:, : depth + 1])


# Which optional step inputs a call has (draft probs, noise, philox state): part of a graph's key,
# since a captured graph takes a fixed list of tensors.
Present = tuple[bool, bool, bool]
StepArgs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Noise | None, torch.Tensor | None]


def _pack(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    probs: torch.Tensor | None,
    noise: Noise | None,
    state: torch.Tensor | None,
) -> tuple[list[torch.Tensor], Present]:
    """A step's arguments as the flat tensor list a graph captures and replays, and which are present."""
    inputs = [logits, tokens]
    inputs += [probs] if probs is not None else []
    inputs += [noise.uniform, noise.exponential] if noise is not None else []
    inputs += [state] if state is not None else []
    return inputs, (probs is not None, noise is not None, state is not None)


def _unpack(inputs: tuple[torch.Tensor, ...], present: Present) -> StepArgs:
    """Inverse of :func:`_pack`: the arguments back from the tensors a graph hands its step."""
    has_q, has_noise, has_state = present
    it = iter(inputs)
    logits, tokens = next(it), next(it)
    probs = next(it) if has_q else None
    noise = Noise(uniform=next(it), exponential=next(it)) if has_noise else None
    state = next(it) if has_state else None
    return logits, tokens, probs, noise, state


def _make(config: Any, device: torch.device | str | None = None) -> Verifier:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "the 'triton' verifier needs the triton package (pip install 'flashspec-engine[triton]'); "
            "use verifier 'reference' without it"
        ) from exc
    where = torch.device(device) if device is not None else None
    if where is not None and where.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton finds no driver off CUDA and says only "0 active drivers": name the way out instead
        raise RuntimeError(
            f"the 'triton' verifier runs on a CUDA GPU and the target is on {where}: use verifier 'reference' "
            "(or 'auto', which takes triton only on CUDA); TRITON_INTERPRET=1 runs it through Triton's interpreter"
        )
    return TritonVerifier(config if config is not None else TritonVerifierConfig(), device)


@hookimpl
def flashspec_verifiers() -> Iterable[ComponentSpec[Verifier]]:
    return [ComponentSpec(k.name, "verifier", _make, k.config_cls, k.description) for k in COMPONENTS]
