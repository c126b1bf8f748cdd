"""Contract checks for any :class:`~flashspec_core.contracts.Target`.

Each ``check_*`` function raises ``AssertionError`` with a readable message when the
contract is broken and returns nothing otherwise, so a third-party back-end's test
module can apply them to its own target::

    def make():
        return AcmeTarget(path="tests/tiny-model", dtype="float64")

    def test_acme_target_contract():
        target = make()
        check_metadata(target)
        check_encode_decode(target, "hello world")
        check_decode_script(make, Script(batch=3, seed=0))

The contract, for ``B`` rows of ragged lengths and a proposal of ``gamma`` tokens
(``gamma`` may be 0):

* ``vocab`` is an int >= 1 (at least the tokenizer's size); ``device`` is a
  :class:`torch.device`; ``eos_token_ids`` is a set of ints in ``[0, vocab)``;
* ``encode(text)`` gives ids in ``[0, vocab)`` whose ``decode`` contains ``text``;
* ``score(tokens, lengths, drafts)`` returns floating-point logits ``[B, gamma+1, vocab]``
  on the target's device, without NaN; ``logits[b, i]`` are the logits after row ``b``'s
  sequence and its first ``i`` draft tokens: the same, to rounding, as a freshly
  prefilled target gives for that sequence, whatever score/rollback history came before;
* ``rollback(n)`` keeps row ``b``'s first ``n[b]`` draft tokens: when the next sequence
  continues with more of the drafted tokens, the next ``score`` repeats the logits the
  last one gave at those positions.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from flashspec_core.contracts import HasTokenizer, Target
from flashspec_core.testing.components import component_config, component_names, component_spec


def target_names() -> list[str]:
    """Every registered target, built-ins and (unless disabled) installed plugins."""
    return component_names("target")


def load_target(name: str, config: Mapping[str, Any] | None = None) -> Target:
    """Build registered target ``name`` from its config keys."""
    spec = component_spec("target", name)
    return spec.factory(component_config(spec, config))  # type: ignore[no-any-return]


def check_metadata(target: Target) -> None:
    """``vocab``, ``device`` and ``eos_token_ids`` have the documented types and ranges."""
    vocab = target.vocab
    assert isinstance(vocab, int) and vocab >= 1, f"vocab must be an int >= 1, got {vocab!r}"
    assert isinstance(target.device, torch.device), f"device must be a torch.device, got {target.device!r}"
    eos = target.eos_token_ids
    assert isinstance(eos, set), f"eos_token_ids must be a set, got {type(eos).__name__}"
    bad = [e for e in eos if not (isinstance(e, int) and 0 <= e < vocab)]
    assert not bad, f"eos_token_ids {sorted(eos)} hold ids outside [0, {vocab}): {bad}"
    if isinstance(target, HasTokenizer) and target.tokenizer is not None:
        size = len(target.tokenizer)
        assert size <= vocab, f"the tokenizer has {size} tokens but vocab (the logits' width) is {vocab}"


def check_encode_decode(target: Target, text: str) -> None:
    """``encode(text)`` gives ids in ``[0, vocab)``, and decoding them gives back ``text``
    (inside a chat template's turn markers, for a target that applies one)."""
    ids = target.encode(text)
    assert isinstance(ids, list) and ids, f"encode({text!r}) must return a non-empty list of ids, got {ids!r}"
    bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < target.vocab)]
    assert not bad, f"encode({text!r}) gave ids outside [0, {target.vocab}): {bad}"
    decoded = target.decode(ids)
    assert isinstance(decoded, str), f"decode must return a str, got {type(decoded).__name__}"
    assert text in decoded, f"decode(encode({text!r})) = {decoded!r} lost the text"


def check_logits(logits: torch.Tensor, target: Target, batch: int, gamma: int) -> None:
    """``score``'s result: ``[B, gamma+1, vocab]`` floating point on the target's device, no NaN."""
    want = (batch, gamma + 1, target.vocab)
    assert tuple(logits.shape) == want, f"score returned logits of shape {tuple(logits.shape)}, not {want}"
    assert logits.dtype.is_floating_point, f"logits must be floating point, got {logits.dtype}"
    assert logits.device.type == target.device.type, f"logits on {logits.device}, the target on {target.device}"
    assert not bool(torch.isnan(logits).any()), "score returned NaN logits"


@attrs.frozen
class Script:
    """A scripted decode: ``steps`` score/rollback rounds over ``batch`` ragged rows.

    Gammas cycle through ``gammas`` (0 included: a step without drafts); accepted
    counts and token ids come from ``seed``. Each row's next token is, at random,
    the drafted token at its first rejection (so the next ``score`` overlaps the
    last one) or any other token; rows may accept every draft.
    """

    batch: int = 3
    steps: int = 6
    gammas: tuple[int, ...] = (3, 0, 2, 4)
    prompt: tuple[int, int] = (2, 7)  # prompt lengths drawn from this range (inclusive)
    seed: int = 0

    @property
    def longest(self) -> int:
        """Longest sequence the script can reach, plus the last proposal."""
        return self.prompt[1] + self.steps * (max(self.gammas) + 1) + max(self.gammas)


def check_decode_script(
    make: Callable[[], Target],
    script: Script = Script(),
    token_range: int | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-4,
) -> None:
    """Run ``script`` on a target from ``make`` and check every step's logits against a
    second target freshly prefilled with the same sequences, and against the last step's
    logits where the sequences continue with the drafted tokens.

    ``token_range``: token ids are drawn from ``[0, token_range)`` (default: ``vocab``).
    Tolerances suit float32; a float64 model can pass tighter ones.
    """
    target, fresh = make(), make()
    rng = random.Random(script.seed)
    ids = token_range or target.vocab
    lengths = [rng.randint(*script.prompt) for _ in range(script.batch)]
    tokens = torch.zeros((script.batch, script.longest + 1), dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.tensor([rng.randrange(ids) for _ in range(n)])
    target.prefill(tokens, lengths)
    carried: list[list[int]] = [[] for _ in lengths]  # drafts the last step made past each row's next token
    expected: list[torch.Tensor | None] = [None] * script.batch  # the last step's logits at those positions
    for step in range(script.steps):
        gamma = script.gammas[step % len(script.gammas)]
        drafts = torch.tensor([(carried[b] + [rng.randrange(ids) for _ in range(gamma)])[:gamma]
                               for b in range(script.batch)], dtype=torch.long).reshape(script.batch, gamma)
        logits = target.score(tokens, lengths, drafts.to(target.device))
        check_logits(logits, target, script.batch, gamma)
        fresh.prefill(tokens, lengths)
        want = fresh.score(tokens, lengths, drafts.to(fresh.device))
        _close(logits, want, rtol, atol, f"step {step} (gamma {gamma}, lengths {lengths}): logits differ from a "
                                          "freshly prefilled target's for the same sequences")
        for b, last in enumerate(expected):
            if last is not None:
                overlap = min(gamma + 1, last.shape[0])
                _close(logits[b, :overlap], last[:overlap], rtol, atol,
                       f"step {step}, row {b}: re-scoring the drafted tokens kept by rollback changed their logits")
        accepted = [rng.randint(0, gamma) for _ in range(script.batch)]
        target.rollback(accepted)
        for b, n in enumerate(accepted):
            follow = n < gamma and rng.random() < 0.5  # the next token is the draft at the first rejection
            new = drafts[b, : n + 1].tolist() if follow else drafts[b, :n].tolist() + [rng.randrange(ids)]
            carried[b] = drafts[b, n + 1 :].tolist() if follow else []
            expected[b] = logits[b, n + 1 :].detach().clone() if follow else None
            tokens[b, lengths[b] : lengths[b] + n + 1] = torch.tensor(new)
            lengths[b] += n + 1


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float, what: str) -> None:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)), f"{what}: the infinite logits differ"
    diff = (got[finite] - want[finite]).abs().max().item() if bool(finite.any()) else 0.0
    assert torch.allclose(got[finite], want[finite], rtol=rtol, atol=atol), f"{what}: max abs difference {diff:.3g}"
