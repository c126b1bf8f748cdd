"""Text at the server's edges: windowed incremental detokenization, stop strings, and the
chat template compiled once."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from _tiny import tiny_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from flashspec_serve.text import ChatTemplate, Detokenizer, TextStream


def byte_decode(ids: Sequence[int]) -> str:
    """A byte-level tokenizer's decode (token i is byte i), as GPT-2's and Qwen's decode
    their byte tokens: an incomplete UTF-8 character becomes U+FFFD."""
    return bytes(ids).decode("utf-8", errors="replace")


def byte_ids(text: str) -> list[int]:
    return list(text.encode())


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A real byte-level BPE tokenizer (no merges: one token per byte)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style word tokenizer: its decode drops the first word's leading space."""
    words = ["▁Hello", "▁world", ",", "▁it", "'s", "▁a", "▁test", ".", "▁δ", "▁é", "!"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="."))
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def pieces(detok: Detokenizer | TextStream, ids: Sequence[int], sizes: Sequence[int]) -> list[str]:
    """What ``detok`` hands out when ``ids`` arrive in steps of ``sizes`` (cycled), and its flush."""
    out, at, k = [], 0, 0
    while at < len(ids):
        step = sizes[k % len(sizes)]
        out.append(detok.feed(ids[at : at + step]))
        at, k = at + step, k + 1
    out.append(detok.flush())
    return out


TEXT = "naïve café: 日本語 and 🙂🙃, then ascii."


@pytest.mark.parametrize("sizes", [[1], [2], [3, 1], [5, 2, 1]])
def test_multi_byte_characters_split_across_tokens_come_out_whole(sizes: list[int]) -> None:
    got = pieces(Detokenizer(byte_decode), byte_ids(TEXT), sizes)
    assert "".join(got) == TEXT
    assert not any("\ufffd" in p for p in got)  # a split character is held until its last byte


def test_a_byte_level_tokenizer_decodes_in_pieces_as_it_decodes_whole() -> None:
    tok = byte_level_tokenizer()
    ids = tok(TEXT)["input_ids"]
    assert len(ids) == len(TEXT.encode())  # a token per byte: characters do split across tokens

    def decode(window: Sequence[int]) -> str:
        return str(tok.decode(list(window)))

    for sizes in ([1], [2, 3], [4]):
        got = pieces(Detokenizer(decode), ids, sizes)
        assert "".join(got) == decode(ids) == TEXT and not any("\ufffd" in p for p in got)


def test_the_window_keeps_the_token_before_so_spaces_survive() -> None:
    """A SentencePiece decode drops the leading space of its first word, and a plain id list
    has no separator before its first id: the window starts one piece back for that."""
    tok = metaspace_tokenizer()
    words = ["▁Hello", ",", "▁world", "▁it", "'s", "▁a", "▁test", ".", "▁é", "!"]
    ids = [tok.convert_tokens_to_ids(w) for w in words]

    def decode(window: Sequence[int]) -> str:
        return str(tok.decode(list(window)))

    assert decode(ids) == "Hello, world it's a test. é!"
    for sizes in ([1], [2], [3, 1]):
        assert "".join(pieces(Detokenizer(decode), ids, sizes)) == decode(ids)
    words_tok = tiny_tokenizer(16)
    ids = list(range(1, 15))
    whole = str(words_tok.decode(ids))

    def decode_words(window: Sequence[int]) -> str:
        return str(words_tok.decode(list(window)))

    assert "".join(pieces(Detokenizer(decode_words), ids, [1, 2])) == whole == " ".join(f"t{i}" for i in ids)


def test_each_decode_sees_a_window_not_the_whole_continuation() -> None:
    seen: list[int] = []

    def decode(window: Sequence[int]) -> str:
        seen.append(len(window))
        return byte_decode(window)

    ids = byte_ids(TEXT * 20)
    got = pieces(Detokenizer(decode), ids, [2])
    assert "".join(got) == TEXT * 20
    # a window holds the last piece and the bytes since: more only while text keeps ending in a
    # split character (here 日本語 and the emoji pair, fed 2 bytes at a time), never the whole
    assert len(ids) > 900 and max(seen) <= 16


def test_a_trailing_incomplete_character_is_flushed_as_a_whole_decode_shows_it() -> None:
    ids = byte_ids("ok 🙂")[:-2]
    detok = Detokenizer(byte_decode)
    assert detok.feed(ids) == "" and detok.flush() == byte_decode(ids) == "ok \ufffd"


@pytest.mark.parametrize("sizes", [[1], [2], [3, 1], [7]])
def test_a_stop_string_across_window_edges_ends_the_text_just_before_it(sizes: list[int]) -> None:
    text = "abc日本 STOP 語 after the stop"
    stream = TextStream(byte_decode, stop=("日本 STOP 語",))
    got = pieces(stream, byte_ids(text), sizes)
    assert stream.stopped and "".join(got) == "abc"


def test_a_stop_string_that_starts_before_a_split_character_holds_its_start() -> None:
    """'a' then the two bytes of 'é': the 'a' may begin the stop string 'aé', so it waits
    while 'é' is incomplete, and never reaches the client."""
    stream = TextStream(byte_decode, stop=("aé",))
    assert [stream.feed(byte_ids("xa")), stream.feed([0xC3])] == ["x", ""]
    assert stream.feed([0xA9, ord("z")]) == "" and stream.stopped and stream.flush() == ""


def test_a_near_miss_of_a_stop_string_is_released_when_it_fails() -> None:
    stream = TextStream(byte_decode, stop=("STOP",))
    assert [stream.feed(byte_ids(p)) for p in ("go ST", "O", "P!")] == ["go ", "", ""] and stream.stopped
    stream = TextStream(byte_decode, stop=("STOP",))
    assert [stream.feed(byte_ids(p)) for p in ("go ST", "O", "X")] == ["go ", "", "STOX"]
    assert stream.flush() == "" and not stream.stopped
    stream = TextStream(byte_decode, stop=("STOP",))
    assert stream.feed(byte_ids("end ST")) == "end " and stream.flush() == "ST"  # ended before it settled


def test_pieces_with_stop_strings_match_the_whole_text_cut_at_the_first_stop() -> None:
    rng = random.Random(0)
    alphabet = "ab é日🙂"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stop = tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 2)))
        cut = min((i for s in stop if (i := text.find(s)) >= 0), default=len(text))
        sizes = [rng.randint(1, 5) for _ in range(4)]
        stream = TextStream(byte_decode, stop=stop)
        got = pieces(stream, byte_ids(text), sizes)
        assert "".join(got) == text[:cut], (text, stop, sizes)
        assert stream.stopped == (cut < len(text))


CHATML = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ('system', 'user', 'assistant') %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_compiled_chat_template_renders_as_apply_chat_template() -> None:
    tok = tiny_tokenizer(16)
    tok.bos_token = "t1"
    tok.chat_template = CHATML
    template = ChatTemplate.of(tok)
    assert template is not None and template.compiled is not None
    chats: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "t2 t3"}],
        [{"role": "system", "content": " be brief "}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "t4"}, {"role": "user", "content": "more"}],
    ]
    for chat in chats:
        want = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert template.render(chat) == want and want.startswith("t1<|im_start|>")
    with pytest.raises(Exception, match="unknown role tool"):
        template.render([{"role": "tool", "content": "x"}])


def test_a_tokenizer_without_a_chat_template_has_none() -> None:
    assert ChatTemplate.of(tiny_tokenizer(16)) is None and ChatTemplate.of(None) is None

