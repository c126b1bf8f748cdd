"""Self-speculative drafts (``self`` on the fast back-end, ``hf-self`` on hf): the target's first
layers draft on its own weights and KV cache, and the target's output stays its own."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_lm

from flashspec_core import SamplingParams
from flashspec_core.build import build_pipeline
from flashspec_core.config import ConfigError
from flashspec_core.contracts import CapturesGraphs, DraftContext, DraftProvider, Prewarmable, PricesDrafts, Target
from flashspec_core.sampling import probs_from_logits
from flashspec_core.testing import draft_contract as dc
from flashspec_core.testing import target_contract as tc
from flashspec_fast.selfdraft import FastSelfDraft
from flashspec_fast.target import FastTarget
from flashspec_hf.selfdraft import HFSelfDraft
from flashspec_hf.target import HFTarget

LAYERS = 4  # the tiny target's depth
DRAFT = {"fast": "self", "hf": "hf-self"}
PROMPTS = [[1, 2, 3, 4, 5, 1, 2], [3, 4], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11]]
GREEDY, SAMPLED = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=8)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("self_draft") / "target", vocab=16, seed=0, layers=LAYERS, init=0.3)


def _keys(backend: str, path: Path, dtype: str, **extra: Any) -> dict[str, Any]:
    keys = {"model": str(path), "dtype": dtype, "device": "cpu", "chat_template": False}
    return keys | ({"max_len": 128, "compile": False} if backend == "fast" else {}) | extra


def _pipeline(backend: str, path: Path, dtype: str, arms: list[dict[str, Any]], selector: str = "fixed") -> Any:
    return build_pipeline({"target": {"use": backend, **_keys(backend, path, dtype)}, "arm": arms,
                           "verifier": {"use": "reference"}, "selector": {"use": selector}})


def _self_arm(backend: str, layers: int, gamma: int = 3) -> dict[str, Any]:
    return {"use": DRAFT[backend], "layers": layers, "gamma": gamma, "name": f"L{layers}"}


def _components(backend: str, path: Path, layers: int, twins: int = 1) -> tuple[list[Target], DraftProvider]:
    """``twins`` float64 targets on the tiny checkpoint and a self draft on the first one."""
    targets = [tc.load_target(backend, _keys(backend, path, "float64")) for _ in range(twins)]
    context = DraftContext(target=targets[0], vocab=targets[0].vocab, device=targets[0].device)
    return targets, dc.load_draft(DRAFT[backend], context, {"layers": layers})


# --------------------------------------------------------------------------- decode output


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("layers", [1, LAYERS - 1])
def test_greedy_output_is_target_only_output(target_dir: Path, backend: str, layers: int) -> None:
    plain = _pipeline(backend, target_dir, "float32", [{"use": "none", "name": "none"}]).generate(PROMPTS, 24)
    spec = _pipeline(backend, target_dir, "float32", [_self_arm(backend, layers)]).generate(PROMPTS, 24)
    assert spec.token_ids == plain.token_ids
    rate = spec.summary["arms"][f"L{layers}"]["acceptance_rate"]
    assert 0.0 < rate < 1.0, f"layers = {layers}: acceptance {rate}; the test needs accepted and rejected drafts"


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_all_layers_draft_what_the_target_emits(target_dir: Path, backend: str) -> None:
    """With every layer the draft IS the target: every greedy draft is accepted. A draft that read
    a stale or misplaced key anywhere in the shared cache would miss. Float64, so that the draft's
    one-token forwards and the target's wider ones cannot round a near tie apart."""
    out = _pipeline(backend, target_dir, "float64", [_self_arm(backend, LAYERS, gamma=4)]).generate(PROMPTS, 30)
    assert out.summary["arms"][f"L{LAYERS}"]["acceptance_rate"] == 1.0
    assert all(n == 4 for step in out.steps for n in step.accepted)


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_depths_as_arms_report_acceptance_each(target_dir: Path, backend: str) -> None:
    """Arms of several depths share the one target; the selector picks among them, the summary
    reports each depth's acceptance, and the output is still the target's."""
    arms = [_self_arm(backend, k) for k in (1, 2, LAYERS)] + [{"use": "none", "name": "none"}]
    spec = _pipeline(backend, target_dir, "float32", arms, selector="ucb1").generate(PROMPTS, 40)
    plain = _pipeline(backend, target_dir, "float32", [{"use": "none", "name": "none"}]).generate(PROMPTS, 40)
    assert spec.token_ids == plain.token_ids
    per_arm = spec.summary["arms"]
    assert all(per_arm[f"L{k}"]["steps"] > 0 for k in (1, 2, LAYERS)), per_arm
    assert per_arm[f"L{LAYERS}"]["acceptance_rate"] == 1.0
    assert per_arm["L1"]["acceptance_rate"] < 1.0


# --------------------------------------------------------------------------- the shared cache


def _cache(target: Target) -> list[torch.Tensor]:
    """Everything of the target's cache its next score reads: each row's held slots (fast), or
    every layer's keys and values with the slot mask and positions (hf)."""
    if isinstance(target, FastTarget):
        m = target.model
        return [c[:, b, :n] for b, n in enumerate(target.cached) for c in (m.k_cache, m.v_cache)]
    assert isinstance(target, HFTarget)
    layers = target.lm.cache.layers
    return [t for layer in layers for t in (layer.keys, layer.values)] + [target.lm.valid, target.lm.next_pos]


def _same(a: list[torch.Tensor], b: list[torch.Tensor], where: str) -> None:
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"{where}: caches differ"


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_target_scores_as_if_it_never_drafted(target_dir: Path, backend: str, sampling: SamplingParams) -> None:
    """A target that drafts for itself (2 of 4 layers) and a twin that never drafts score the same
    tokens: their logits and caches agree bit for bit after every verify forward and rollback,
    over ragged rows, steps another arm plays, and a second request of another batch size."""
    (target, twin), draft = _components(backend, target_dir, layers=2, twins=2)
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    for batch in (3, 2):
        lengths = [rng.randint(2, 9) for _ in range(batch)]
        tokens = torch.randint(0, 16, (batch, 80), generator=gen)
        draft.reset()
        target.prefill(tokens, lengths)
        twin.prefill(tokens, lengths)
        for step in range(8):
            elsewhere = step % 3 == 2  # another arm's draft: the self draft sits the step out
            before = [t.clone() for t in _cache(target)]  # the target's held slots: a proposal only reads them
            drafted = torch.randint(0, 16, (batch, 2)) if elsewhere else draft.propose(
                tokens, lengths, 3, sampling, gen).tokens
            where = f"batch {batch}, step {step}"
            _same(_cache(target), before, f"{where}, after the proposal")
            assert torch.equal(target.score(tokens, lengths, drafted), twin.score(tokens, lengths, drafted)), where
            accepted = [rng.randint(0, drafted.shape[1]) for _ in lengths]
            for component in (target, twin) if elsewhere else (target, twin, draft):
                component.rollback(accepted)
            _same(_cache(target), _cache(twin), f"{where}, after the rollback")
            for b, n in enumerate(accepted):
                row = drafted[b, :n].tolist() + [rng.randrange(16)]
                tokens[b, lengths[b] : lengths[b] + len(row)] = torch.tensor(row)
                lengths[b] += len(row)


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_all_layers_report_the_targets_law_as_q(target_dir: Path, backend: str, sampling: SamplingParams) -> None:
    """The full-depth draft's q is the target's p at every drafted position (its greedy tokens the
    target's argmax): the q a sampled draft reports is the one it sampled from."""
    (target,), draft = _components(backend, target_dir, layers=LAYERS)
    tokens, lengths = torch.tensor([[1, 2, 3, 4, 5, 6, 0, 0, 0, 0], [7, 8, 0, 0, 0, 0, 0, 0, 0, 0]]), [6, 2]
    draft.reset()
    target.prefill(tokens, lengths)
    proposal = draft.propose(tokens, lengths, 4, sampling, torch.Generator().manual_seed(1))
    logits = target.score(tokens, lengths, proposal.tokens)[:, :4]
    if sampling.greedy:
        assert proposal.probs is None and torch.equal(proposal.tokens, logits.argmax(-1))
    else:
        assert proposal.probs is not None
        torch.testing.assert_close(proposal.probs, probs_from_logits(logits, sampling), rtol=0, atol=1e-12)


def test_hf_proposal_leaves_no_slot_behind(target_dir: Path) -> None:
    """The proposal crops the slots it appended to layers < k: every layer keeps the slot count
    of the target's mask (otherwise the target's next forward would not line up with it)."""
    (target,), draft = _components("hf", target_dir, layers=2)
    assert isinstance(draft, HFSelfDraft) and isinstance(target, HFTarget)
    tokens, lengths = torch.tensor([[1, 2, 3, 4, 5, 0, 0, 0]]), [5]
    draft.reset()
    target.prefill(tokens, lengths)
    slots = [layer.keys.shape[-2] for layer in target.lm.cache.layers]
    draft.propose(tokens, lengths, 3, GREEDY, None)
    assert [layer.keys.shape[-2] for layer in target.lm.cache.layers] == slots == [target.lm.valid.shape[1]] * LAYERS
    assert draft.lm.valid.shape[1] == 0  # the draft holds no reference to the target's cache


# --------------------------------------------------------------------------- building


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_a_self_draft_prices_a_token_at_its_share_of_the_target_s_layers(target_dir: Path, backend: str) -> None:
    """The cost a selector prices an unseen self arm at (PricesDrafts): its layers of the target's."""
    for layers in (1, LAYERS - 1):
        _, draft = _components(backend, target_dir, layers)
        assert isinstance(draft, PricesDrafts) and draft.draft_cost == pytest.approx(layers / LAYERS)


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_layers_out_of_range_are_clear_errors(target_dir: Path, backend: str) -> None:
    with pytest.raises(ConfigError, match="layers.*>= 1"):
        _pipeline(backend, target_dir, "float32", [_self_arm(backend, 0)])
    with pytest.raises(ValueError, match=f"{DRAFT[backend]}'?: layers = 5, but the target has 4 decoder layers"):
        _pipeline(backend, target_dir, "float32", [_self_arm(backend, 5)])


def test_each_self_draft_names_the_other_for_the_other_target(target_dir: Path) -> None:
    with pytest.raises(ValueError, match='use = "hf-self"'):
        _pipeline("hf", target_dir, "float32", [_self_arm("fast", 1)])
    with pytest.raises(ValueError, match='use = "self"'):
        _pipeline("fast", target_dir, "float32", [_self_arm("hf", 1)])


def test_fast_self_draft_prewarms_its_graphs_and_drops_them_with_the_targets_cache(
    target_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After prewarm no span a step can reach asks for a new drafting graph. The graphs are the
    draft's own (in the target's pool the verify graph's replay could overwrite the draft's
    output), captured over the target's cache, so a new cache drops them."""
    target = tc.load_target("fast", _keys("fast", target_dir, "float32", max_len=300))
    context = DraftContext(target=target, vocab=target.vocab, device=target.device)
    draft = dc.load_draft("self", context, {"layers": 2})
    assert isinstance(draft, Prewarmable) and isinstance(draft, CapturesGraphs)
    assert isinstance(target, CapturesGraphs) and draft.graphs is not target.graphs
    gamma = 3
    assert draft.prewarm(1, gamma, GREEDY) == 0  # no CUDA graphs here: nothing to capture
    assert draft.prewarm(1, gamma, GREEDY, off_gpu=True) > 0
    warmed = set(draft.graphs.keys)
    gen = torch.Generator().manual_seed(0)
    top = target.model.scratch
    for length in (2, 17, 125, 126, 127, 128, 129, 200, 253, top - gamma - 1):
        draft.reset()
        draft.propose(torch.randint(0, 16, (1, length + gamma + 1), generator=gen), [length], gamma, GREEDY, gen)
    assert draft.graphs.keys <= warmed, sorted(map(str, draft.graphs.keys - warmed))
    bounded = dc.load_draft("self", context, {"layers": 2})  # longest bounds it: spans up to 128 slots only
    assert isinstance(bounded, FastSelfDraft)
    assert 0 < bounded.prewarm(1, gamma, GREEDY, off_gpu=True, longest=100) < len(warmed)
    assert bounded.graphs.keys < warmed and max(k[-1] for k in bounded.graphs.keys) == target.model.span_for(100)
    cleared: list[int] = []
    monkeypatch.setattr(draft.graphs, "clear", lambda: cleared.append(1))
    tokens = torch.randint(0, 16, (1, 20), generator=gen)
    draft.propose(tokens, [9], gamma, GREEDY, gen)
    assert cleared == []
    assert isinstance(target, FastTarget)
    target.fit(2)  # more rows than allocated: a new cache
    draft.propose(tokens, [9], gamma, GREEDY, gen)
    draft.propose(tokens, [9], gamma, GREEDY, gen)
    assert cleared == [1]
