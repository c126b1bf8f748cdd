"""decode_ids: the tokenizers library's decode where it is exactly transformers', else transformers'."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from flashspec_models.tokenizer import _plain_backend, decode_ids

CORPUS = ["def hello(world):\n    return world * 2  # é ü 漢字 🙂", "The quick brown fox, isn't it?  Yes .", "x = [1, 2, 3]"] * 20


def _byte_bpe(clean_up: bool, cls: type = PreTrainedTokenizerFast) -> Any:
    """A byte-level BPE like Qwen's and SmolLM's: a token may hold part of a UTF-8 character."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return cls(tokenizer_object=tok, eos_token="<|endoftext|>", clean_up_tokenization_spaces=clean_up)


class _OwnDecode(PreTrainedTokenizerFast):
    def _decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        return "own:" + super()._decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)


@pytest.mark.parametrize("clean_up", [False, True], ids=["plain", "clean_up"])
def test_decode_ids_is_transformers_decode_on_any_ids(clean_up: bool) -> None:
    """Random ids (special tokens, halves of UTF-8 characters, spaces before punctuation) decode
    as ``tokenizer.decode(ids, skip_special_tokens=True)`` does; the library's decode is called
    directly only where transformers would add nothing to it."""
    tokenizer = _byte_bpe(clean_up)
    assert (_plain_backend(tokenizer) is None) == clean_up
    rng = random.Random(0)
    encoded = tokenizer(CORPUS[0])["input_ids"]
    cases = [encoded, encoded[3:9], [0, *encoded[:4], 1]] + [
        [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(12))] for _ in range(500)]
    for ids in cases:
        assert decode_ids(tokenizer, ids) == tokenizer.decode(ids, skip_special_tokens=True), ids


def test_a_tokenizer_class_with_its_own_decode_keeps_it() -> None:
    tokenizer = _byte_bpe(False, _OwnDecode)
    assert _plain_backend(tokenizer) is None
    assert decode_ids(tokenizer, tokenizer("x = 1")["input_ids"]).startswith("own:")
