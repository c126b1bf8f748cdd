"""flashspec_core.ragged: right alignment, positions and masks of ragged rows."""

from __future__ import annotations

import pytest
import torch

from flashspec_core.ragged import additive_mask, causal_mask, fit_vocab, next_positions, right_align


def test_right_align_puts_each_rows_last_token_last() -> None:
    tokens = torch.arange(10, 40).view(3, 10)
    ids, pos = right_align(tokens, [2, 0, 5], [5, 1, 5], 4)
    assert ids.tolist() == [[0, 12, 13, 14], [0, 0, 0, 20], [0, 0, 0, 0]]
    assert pos.tolist() == [[-1, 2, 3, 4], [-1, -1, -1, 0], [-1, -1, -1, -1]]
    assert ids.dtype == pos.dtype == torch.long


def test_right_align_refuses_a_slice_wider_than_the_block() -> None:
    with pytest.raises(ValueError, match="row 1 feeds 5 tokens .* width 4"):
        right_align(torch.zeros((2, 8), dtype=torch.long), [0, 1], [2, 6], 4)


def test_next_positions_count_valid_slots_only() -> None:
    valid = torch.tensor([[False, True, True, False, True], [True, True, True, True, True], [False] * 5])
    got = next_positions(torch.tensor([7, 0, 0]), valid)
    assert got.tolist() == [[6, 7, 8, 8, 9], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]


def test_causal_mask_sees_keys_up_to_the_position() -> None:
    allowed = causal_mask(torch.tensor([[0, 2], [1, 1]]), 3)
    assert allowed.tolist() == [[[True, False, False], [True, True, True]], [[True, True, False]] * 2]


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.bfloat16).min])
def test_additive_mask(fill: float) -> None:
    allowed = torch.tensor([[True, False], [False, True]])
    mask = additive_mask(allowed, torch.bfloat16, fill)
    assert mask.dtype == torch.bfloat16
    assert mask.tolist() == [[0.0, fill], [fill, 0.0]]


def test_fit_vocab_cuts_pads_and_keeps() -> None:
    logits = torch.randn(2, 5)
    assert fit_vocab(logits, 5) is logits
    assert torch.equal(fit_vocab(logits, 3), logits[:, :3])
    wide = fit_vocab(logits, 7)
    assert torch.equal(wide[:, :5], logits) and bool((wide[:, 5:] == float("-inf")).all())
