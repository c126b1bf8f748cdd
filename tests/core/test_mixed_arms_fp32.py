"""Float32 greedy output with arms switched every step equals target-only output.

Every arm kind of the tree benchmark's mix on one fast target: fast draft chains and trees,
prompt lookup chain and fan, suffix chain and fan, and the plain arm. Each arm alone is
checked elsewhere; here a test selector plays them in a fixed or a seeded random order, so a
chain step follows a tree commit, a fan follows a chain, and each draft catches up on
tokens another arm emitted. A state one arm leaves behind that another misreads (a rejected
node kept by ``commit_path``, a stale slot, a provider's index) changes the greedy tokens.

On the GPU the target's forwards and its tree commits run as CUDA graphs, and a graph is
captured on the first call of its shape: the capture's warm-ups run the function on the live
cache. The last tests play that on the CPU with a stand-in for the capture that runs the
function as CUDA does (warm-ups, then each replay), so a captured function that changes the
cache more than once on its first call shows here.

CPU, float32, tiny random Qwen2 models.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import perturbed_lm, tiny_lm

import flashspec_fast.graphs
from flashspec_core.build import build_pipeline
from flashspec_fast.graphs import GraphCache
from flashspec_fast.target import FastTarget

PROMPTS = [[1, 2, 3, 4, 5, 1, 2], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11], [3, 4]]
FAST = {"use": "fast", "dtype": "float32", "device": "cpu", "max_len": 160, "compile": False, "chat_template": False}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A target whose next token hangs on the whole context (a wide init: a peaked tiny model
    falls into a loop its last token decides, where a wrong slot far back changes nothing),
    its perturbed copy as a close draft and an unrelated far one."""
    root = tmp_path_factory.mktemp("mixed_arms")
    target = tiny_lm(root / "target", vocab=32, seed=0, init=0.3)
    return {"target": target, "close": perturbed_lm(target, root / "close", noise=0.05, seed=1),
            "far": tiny_lm(root / "far", vocab=32, seed=2, init=0.3, layers=1)}


def _arms(models: dict[str, Path]) -> list[dict[str, Any]]:
    """The tree benchmark's arms; the draft models alternate between the close draft (long
    accepted paths) and the far one (rejections), so steps end anywhere in a draft."""
    close, far = ({**FAST, "model": str(models[k])} for k in ("close", "far"))
    return [
        {**close, "gamma": 3, "name": "g3"},
        {**far, "gamma": 5, "name": "g5"},
        {**close, "gamma": 10, "tree_width": [2, 2, 1], "name": "tree2x2x1"},
        {**far, "gamma": 12, "tree_width": [3, 2, 1], "name": "tree3x2x1"},
        {**close, "gamma": 10, "tree_width": [2, 1, 1, 1, 1], "name": "tree2x1x1x1x1"},
        {"use": "prompt_lookup", "gamma": 6, "min_ngram": 2, "fill": False, "name": "lookup"},
        {"use": "prompt_lookup", "gamma": 12, "min_ngram": 2, "fill": False, "branches": 3, "name": "lookup-fan"},
        {"use": "suffix", "gamma": 8, "name": "suffix"},
        {"use": "suffix", "gamma": 8, "branches": 3, "name": "suffix-fan"},
        {"use": "none", "name": "none"},
    ]


class Playlist:
    """A test selector: plays ``order`` over and over, ignoring rewards."""

    def __init__(self, order: Sequence[int], num_arms: int) -> None:
        self.order, self.num_arms, self.n = list(order), num_arms, 0

    def select(self) -> int:
        self.n += 1
        return self.order[(self.n - 1) % len(self.order)]

    def update(self, arm: int, reward: float) -> None:
        pass


def _orders(num_arms: int) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(0)
    return {
        "round-robin": list(range(num_arms)),
        "reversed": list(range(num_arms))[::-1],
        "random": torch.randint(num_arms, (200,), generator=gen).tolist(),
    }


def _mixed(models: dict[str, Path]) -> Any:
    return build_pipeline({"target": {**FAST, "model": str(models["target"])}, "arm": _arms(models),
                           "verifier": {"use": "reference"}, "selector": {"use": "fixed"}})


def _plain(models: dict[str, Path]) -> Any:
    return build_pipeline({"target": {**FAST, "model": str(models["target"])}, "arm": [{"use": "none", "name": "p"}]})


def _run(pipe: Any, order: str, max_new: int = 40) -> Iterator[tuple[list[list[int]], list[list[int]], list[Any]]]:
    """Each batch of prompts (one at a time, then all together) with arms played in ``order``,
    on from where the last batch left it; yields each batch, its tokens and its steps."""
    pipe.selector = Playlist(_orders(len(pipe.choices))[order], len(pipe.choices))
    for batch in ([PROMPTS[0]], [PROMPTS[1]], [PROMPTS[2]], PROMPTS):
        got = pipe.generate(batch, max_new_tokens=max_new, temperature=0.0)
        yield batch, got.token_ids, got.steps


@pytest.mark.parametrize("order", ["round-robin", "reversed", "random"])
def test_switching_arms_every_step_gives_target_only_tokens(models: dict[str, Path], order: str) -> None:
    pipe, plain = _mixed(models), _plain(models)
    played: list[Any] = []
    for batch, got, steps in _run(pipe, order):
        assert got == plain.generate(batch, max_new_tokens=40, temperature=0.0).token_ids
        played += steps
    assert {s.arm_name for s in played} == {a.name for a in pipe.arms}  # every arm took steps between the others'
    # tree paths past one level were committed and then built on by other arms
    assert any(s.arm_name.startswith("tree") and max(s.accepted) >= 2 for s in played[:-1])


def test_a_commit_path_keeping_a_rejected_node_is_caught(models: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above can fail: a target whose commit_path leaves the accepted nodes where the
    tree put them (not compacted after the last token) changes the tokens of the next steps."""
    pipe, plain = _mixed(models), _plain(models)
    want = [plain.generate(batch, max_new_tokens=40, temperature=0.0).token_ids for batch in ([PROMPTS[0]], PROMPTS)]

    def no_moves(self: FastTarget, paths: torch.Tensor) -> None:
        kept = [next((i for i, n in enumerate(row) if n < 0), len(row)) for row in paths.tolist()]
        self.cached = [n + k for n, k in zip(self._lengths, kept, strict=True)]

    monkeypatch.setattr(FastTarget, "commit_path", no_moves)
    got = [ids for batch, ids, _ in _run(pipe, "round-robin") if batch in ([PROMPTS[0]], PROMPTS)]
    assert got[0] != want[0] and got[1] != want[1]


class ReplayedGraph:
    """A CUDA graph's stand-in on the CPU: ``replay()`` runs the function on the captured inputs
    and copies its outputs into those of the capture."""

    def __init__(self, fn: Any, inputs: Sequence[torch.Tensor], out: Any) -> None:
        self.fn, self.inputs, self.out = fn, list(inputs), out

    def pool(self) -> None:
        return None

    def replay(self) -> None:
        _copy_into(self.out, self.fn(*self.inputs))


def _copy_into(dst: Any, src: Any) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, tuple | list):
        for d, s in zip(dst, src, strict=True):
            _copy_into(d, s)


def cpu_capture(fn: Any, inputs: Sequence[torch.Tensor], pool: Any, warmups: int) -> tuple[ReplayedGraph, Any]:
    """:func:`flashspec_core.cudagraph.capture` on the CPU: the warm-ups run ``fn`` on the captured
    inputs as CUDA's do; the capture itself runs it once more here (CUDA only records it), for
    its output buffers, so a function captured must bear that as it bears its warm-ups."""
    for _ in range(warmups):
        fn(*inputs)
    out = fn(*inputs)
    return ReplayedGraph(fn, inputs, out), out


def _captured(pipe: Any) -> Any:
    """Turn on the graph caches of the target and of every arm's provider (their shapes are
    captured on first use, as on the GPU, through :func:`cpu_capture`)."""
    for part in (pipe.target, *(a.provider for a in pipe.arms)):
        if isinstance(getattr(part, "graphs", None), GraphCache):
            part.graphs.enabled = True
    return pipe


def test_a_graph_captured_on_its_first_call_changes_state_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flashspec_fast.graphs, "capture", cpu_capture)
    graphs, state = GraphCache(torch.device("cpu"), enabled=False), torch.zeros(3)
    graphs.enabled = True
    bump = lambda x: state.add_(x)  # noqa: E731
    graphs("k", bump, torch.ones(3), idle=lambda x: (torch.zeros_like(x),))
    assert state.tolist() == [1.0, 1.0, 1.0]
    graphs("k", bump, torch.ones(3) * 2, idle=lambda x: (torch.zeros_like(x),))  # a replay: idle is not asked
    assert state.tolist() == [3.0, 3.0, 3.0]
    graphs("other", bump, torch.ones(3))  # without idle its warm-ups bump it too (and this stand-in's capture)
    assert state.tolist() == [7.0, 7.0, 7.0]


@pytest.mark.parametrize("order", ["round-robin", "random"])
def test_switching_arms_with_graphs_captured_mid_request_gives_target_only_tokens(
        models: dict[str, Path], order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shape (a forward, a tree's path moves) is first met inside a request, so its capture
    runs there: a tree commit captured then must move the cache's slots once."""
    monkeypatch.setattr(flashspec_fast.graphs, "capture", cpu_capture)
    pipe, plain = _captured(_mixed(models)), _plain(models)
    for batch, got, _ in _run(pipe, order):
        assert got == plain.generate(batch, max_new_tokens=40, temperature=0.0).token_ids
    assert pipe.target.graphs.captures > 0 and any(k[0] == "path" for k in pipe.target.graphs.keys)
