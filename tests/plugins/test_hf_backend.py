"""The Hugging Face back-end: ragged KV cache, rollback, NF4 loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _tiny import pipeline_dict, tiny_lm
from transformers import AutoModelForCausalLM

from flashspec_core.build import build_pipeline
from flashspec_core.tree import path_to
from flashspec_hf.lm import CachedLM
from flashspec_hf.loading import ModelOptions, load_model
from flashspec_hf.target import HFTarget


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("hf") / "target", vocab=16, hidden=64, init=0.3)


def test_holes_and_rollback_match_a_fresh_forward(target: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    lm = CachedLM(model)
    lm.reset(2)
    tokens = torch.tensor([[1, 2, 3, 4, 0], [5, 6, 0, 0, 0]])
    lm.catch_up(tokens, [4, 2])  # ragged: row 1 is left-padded
    lm.forward(torch.tensor([[9, 9], [8, 8]]), torch.ones(2, 2, dtype=torch.bool))
    lm.drop_last([2, 1])  # reject both drafts of row 0, one of row 1
    lm.seen = [4, 3]
    tokens = torch.tensor([[1, 2, 3, 4, 7], [5, 6, 8, 11, 0]])
    got = lm.catch_up(tokens, [5, 4])[:, -1]
    with torch.no_grad():
        want0 = model(tokens[:1, :5]).logits[0, -1]
        want1 = model(tokens[1:, :4]).logits[0, -1]
    torch.testing.assert_close(got[0], want0)
    torch.testing.assert_close(got[1], want1)


def test_batch_one_never_keeps_holes(target: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    lm = CachedLM(model)
    lm.reset(1)
    lm.catch_up(torch.tensor([[1, 2, 3]]), [3])
    lm.forward(torch.tensor([[4, 5, 6]]), torch.ones(1, 3, dtype=torch.bool))
    lm.drop_last([2])
    assert lm.valid.shape[1] == 4 and bool(lm.valid.all())
    assert lm.cache.get_seq_length() == 4


def test_nf4_target_and_draft_run_on_cpu(target: Path, tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    config = pipeline_dict(target, [target], "fixed", dtype="float32")
    config["target"]["quantization"] = "nf4"
    config["arm"][0]["quantization"] = "nf4"
    spec = build_pipeline(config).generate([[1, 2, 3, 4]], max_new_tokens=10)
    config["arm"] = [{"use": "none"}]
    plain = build_pipeline(config).generate([[1, 2, 3, 4]], max_new_tokens=10)
    assert spec.token_ids == plain.token_ids
    assert spec.summary["arms"]["d0"]["acceptance_rate"] > 0.5  # the draft is the target itself


def test_nf4_on_the_cpu_refuses_widths_bitsandbytes_cannot_pack(tmp_path: Path) -> None:
    """Hidden width 32 is under bitsandbytes' CPU block of 64: it used to load, then fail inside
    the first forward with "shape '[32, 0]' is invalid"; now the load names the widths."""
    narrow = tiny_lm(tmp_path / "narrow", vocab=16, hidden=32)
    with pytest.raises(RuntimeError, match=r"multiple of 64 .* has hidden_size = 32; use quantization = 'none'"):
        load_model(ModelOptions(model=str(narrow), dtype="float32", device="cpu", quantization="nf4"))


def test_score_tree_equals_chains_and_commit_path_keeps_only_the_accepted_path(target: Path) -> None:
    """Each node's logits are those of a chain forward of its path; after commit_path the cache
    scores the next step exactly as a fresh target that never saw the rejected branches."""
    model, tokenizer = load_model(ModelOptions(model=str(target), dtype="float64", device="cpu"))

    def fresh(tokens: torch.Tensor, lengths: list[int]) -> HFTarget:
        t = HFTarget(model, tokenizer, chat_template=False)
        t.prefill(tokens, lengths)
        return t

    tokens, lengths = torch.zeros((2, 16), dtype=torch.long), [5, 7]
    tokens[0, :5], tokens[1, :7] = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([3, 4, 5, 6, 7, 8, 9])
    parents, nodes = torch.tensor([-1, -1, 0, 0, 1, 2]), torch.tensor([[5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6]])
    tree = fresh(tokens, lengths)
    logits = tree.score_tree(tokens, lengths, nodes, parents)
    for n in range(6):
        chain = fresh(tokens, lengths).score(tokens, lengths, nodes[:, list(path_to(parents, n))])
        torch.testing.assert_close(logits[:, n + 1], chain[:, -1], rtol=0, atol=1e-10)
        torch.testing.assert_close(logits[:, 0], chain[:, 0], rtol=0, atol=1e-10)
    tree.commit_path(torch.tensor([[0, 2, 5], [1, -1, -1]]))  # row 0 keeps 5 7 10, row 1 keeps 2
    for b, new in enumerate([[5, 7, 10, 11], [2, 12]]):
        tokens[b, lengths[b] : lengths[b] + len(new)] = torch.tensor(new)
        lengths[b] += len(new)
    after = tree.score(tokens, lengths, torch.tensor([[1, 2], [3, 4]]))
    want = fresh(tokens, lengths).score(tokens, lengths, torch.tensor([[1, 2], [3, 4]]))
    torch.testing.assert_close(after, want, rtol=0, atol=1e-10)
    assert tree.lm.next_pos.tolist() == [lengths[0] + 2, lengths[1] + 2]  # every token and both extras
