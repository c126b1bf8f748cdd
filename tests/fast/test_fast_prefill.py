"""The fast target's prefill: rows of very different prompt lengths are fed in groups of about
one width (not all padded to the longest), and score exactly as after one forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import flashspec_fast.target as fast_target
from flashspec_core.build import build_pipeline
from flashspec_core.testing.tiny import one_arm_dict, tiny_lm
from flashspec_fast.target import prefill_groups


def test_rows_are_grouped_by_width_and_small_groups_join_the_next() -> None:
    stops = [3, 50, 0, 60, 200, 2]
    # widths 4 (rows 0 and 5), 64 (rows 1 and 3) and the scratch slot's 127 (row 4: 256 would reach it)
    assert prefill_groups(stops, 127, merge_below=0) == [(4, [0, 5]), (64, [1, 3]), (127, [4])]
    # rows 0 and 5 padded to 64 add 2 x 60 = 120 positions: under 121 they join the 64-wide forward
    assert prefill_groups(stops, 127, merge_below=121) == [(64, [0, 1, 3, 5]), (127, [4])]
    assert prefill_groups(stops, 127, merge_below=10**6) == [(127, [0, 1, 3, 4, 5])]
    assert prefill_groups([0, 0], 127) == []


@pytest.fixture(scope="module")
def target_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("prefill") / "t", vocab=32, seed=3, dtype=torch.float32)


def _scores(path: Path, merge: int, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, list[int]]:
    monkeypatch.setattr(fast_target, "PREFILL_MERGE", merge)
    config = one_arm_dict(path, {"use": "none"})
    config["target"] |= {"use": "fast", "device": "cpu", "max_len": 128, "compile": False}
    target: Any = build_pipeline(config).target
    grouped: list[int] = []
    forward_rows = target._forward_rows
    monkeypatch.setattr(target, "_forward_rows", lambda *a: (grouped.append(len(a[1])), forward_rows(*a)))
    g = torch.Generator().manual_seed(0)
    lengths = [3, 40, 5, 70, 1]
    tokens = torch.zeros((len(lengths), 96), dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.randint(1, 31, (n,), generator=g)
    target.prefill(tokens, lengths)
    return target.score(tokens, lengths, torch.randint(1, 31, (len(lengths), 3), generator=g)), grouped


def test_grouped_prefill_scores_as_one_forward(target_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, none_grouped = _scores(target_path, 10**6, monkeypatch)
    split, grouped = _scores(target_path, 0, monkeypatch)
    assert none_grouped == [] and grouped == [2, 1, 1]  # widths 4 (rows 0, 2), 64 (row 1), the widest (row 3)
    torch.testing.assert_close(split, one, atol=1e-5, rtol=0)


def test_join_chunks_cut_runs_and_pad_them_to_powers_of_two() -> None:
    assert fast_target.join_chunks([5]) == [([5], 1)]
    assert fast_target.join_chunks([4, 1, 7]) == [([4, 1, 7], 4)]
    assert fast_target.join_chunks(list(range(11)), most=8) == [(list(range(8)), 8), ([8, 9, 10], 4)]
    # every padded size a run can take, a bound that is not a power of two included (runs of 5 or 6 pad to 8)
    assert fast_target.run_sizes(8) == [1, 2, 4, 8] == fast_target.run_sizes(6)


@pytest.mark.parametrize("joined", [[2], [0, 3, 4], [4, 3, 2, 1, 0]])
def test_rows_prefilled_in_padded_runs_score_as_one_batch_prefill(target_path: Path, joined: list[int],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows prefilled alone, in runs of at most two padded to a power of two (the padding entries
    feed nothing and write only a scratch slot), leave every row's cache as the whole batch's
    prefill does: the scores after them match, and the rows not joined keep theirs."""
    monkeypatch.setattr(fast_target, "JOIN_ROWS", 2)
    monkeypatch.setattr(fast_target.join_chunks, "__defaults__", (2,))
    config = one_arm_dict(target_path, {"use": "none"})
    config["target"] |= {"use": "fast", "device": "cpu", "max_len": 128, "compile": False}
    target: Any = build_pipeline(config).target
    g = torch.Generator().manual_seed(1)
    lengths = [9, 40, 5, 17, 2]
    tokens = torch.zeros((len(lengths), 96), dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.randint(1, 31, (n,), generator=g)
    draft = torch.randint(1, 31, (len(lengths), 3), generator=g)
    target.prefill(tokens, lengths)
    whole = target.score(tokens, lengths, draft).clone()
    others = [b for b in range(len(lengths)) if b not in joined]
    for b in joined:  # the joined rows get other sequences first, so a stale slot would show
        tokens[b, : lengths[b]] = torch.randint(1, 31, (lengths[b],), generator=g)
    target.prefill(tokens, lengths)
    stale = target.score(tokens, lengths, draft).clone()
    for b in joined:
        tokens[b] = 0
    g = torch.Generator().manual_seed(1)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.randint(1, 31, (n,), generator=g)
    target.prefill_rows(tokens, lengths, joined)
    after = target.score(tokens, lengths, draft)
    torch.testing.assert_close(after[joined], whole[joined], atol=1e-5, rtol=0)
    torch.testing.assert_close(after[others], stale[others], atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rows_prefilled_through_captured_graphs_score_as_one_batch_prefill_on_cuda(target_path: Path) -> None:
    """On CUDA with graphs on, joins replay a captured rows-forward per run (rows, width, span):
    a run of three rows (padded to four) and one of one, then the same runs again (replays),
    leave the joined rows' scores as the whole batch's prefill does, in float32."""
    config = one_arm_dict(target_path, {"use": "none"})
    config["target"] |= {"use": "fast", "device": "cuda", "max_len": 128, "compile": True, "dtype": "float32"}
    target: Any = build_pipeline(config).target
    g = torch.Generator().manual_seed(2)
    lengths = [9, 40, 5, 17, 2, 30]
    tokens = torch.zeros((len(lengths), 96), dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.randint(1, 31, (n,), generator=g)
    draft = torch.randint(1, 31, (len(lengths), 3), generator=g)
    target.prefill(tokens, lengths)
    whole = target.score(tokens, lengths, draft.cuda()).clone()
    captures = []
    for joined in ([0, 3, 5], [2], [0, 3, 5]):
        target.prefill_rows(tokens, lengths, joined)
        after = target.score(tokens, lengths, draft.cuda())
        torch.testing.assert_close(after, whole, atol=1e-4, rtol=0)
        captures.append(target.graphs.captures)
    assert captures[2] == captures[1]  # the same run again replays its graph
    rows = [key for key in target.graphs.captured if key[0] == "rows"]
    assert {key[1] for key in rows} == {4, 1}  # three rows padded to four, and one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_shape_staged_twice_in_a_step_keeps_both_inputs_on_cuda() -> None:
    """Two stagings of one shape while the stream is still busy (a join's two runs of eight rows)
    reach the device each as staged: the second may not overwrite the pinned buffer the first
    copy has not read yet."""
    stage = fast_target.HostInputs(torch.device("cuda"))
    for _ in range(3):  # the first stagings allocate; later ones reuse the buffers that are free again
        torch.cuda._sleep(50_000_000)  # ~25 ms of queued work: the copies below wait behind it
        first = stage(torch.zeros(64, dtype=torch.long))
        second = stage(torch.ones(64, dtype=torch.long))
        assert (first.sum().item(), second.sum().item()) == (0, 64)
    assert len(stage._pinned[(64, torch.long)]) == 2
