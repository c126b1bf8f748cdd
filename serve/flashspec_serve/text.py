"""Text and tokens at the server's edges: a chat rendered with the tokenizer's template
(compiled once), and token ids turned into the text a client sees (incremental, with stop
strings)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

REPLACEMENT = "\ufffd"  # what a decode makes of an incomplete UTF-8 character


class ChatTemplate:
    """A tokenizer's chat template, compiled when the server starts, rendering a request's
    messages with the generation prompt: what ``apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True)`` gives, without its per-call work (looking the template up,
    copying the tokenizer's special-token map, normalising the messages).

    The template is compiled by transformers' own ``_compile_jinja_template`` (its sandboxed
    environment, ``raise_exception``, ``tojson`` and ``strftime_now``), so a template renders
    as transformers renders it. A transformers without that function falls back to
    ``apply_chat_template`` on every call.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.source: str = tokenizer.get_chat_template()
        self.special = dict(tokenizer.special_tokens_map)  # bos_token, eos_token, ... as templates read them
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template
        except ImportError:
            self.compiled = None
        else:
            self.compiled = _compile_jinja_template(self.source)

    @classmethod
    def of(cls, tokenizer: Any) -> ChatTemplate | None:
        """The template of ``tokenizer``; None where it has none (or there is no tokenizer)."""
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            return None
        return cls(tokenizer)

    def render(self, messages: list[dict[str, str]]) -> str:
        if self.compiled is None:
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        return str(self.compiled.render(messages=messages, tools=None, documents=None, add_generation_prompt=True,
                                        **self.special))


class Detokenizer:
    """Incremental decoding over a window of trailing tokens, as vLLM's
    ``detokenize_incrementally`` and TGI's ``decode_token`` do.

    A decode of the whole continuation at every step costs time linear in its length, per
    row and step. Instead :meth:`feed` decodes ``ids[prefix:]`` and ``ids[prefix:read]``
    and hands out the difference: ``prefix`` keeps the tokens of the last piece handed out
    in the window, since a tokenizer decodes a token differently at the start of a text (a
    SentencePiece word loses its leading space; an id list joined by spaces has no separator
    before its first id). Where the window's text ends in ``U+FFFD`` (a character whose UTF-8
    bytes are split across tokens not all here yet) or adds nothing (a skipped special token),
    nothing is handed out and the window grows until it settles. The pieces joined are the
    decode of all the ids, for every tokenizer whose decode of a text's tail depends only on
    the token before it.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = 0  # the window starts here: the first token of the last piece handed out
        self.read = 0  # tokens up to here have been handed out as text

    def feed(self, new: Sequence[int]) -> str:
        """The text the tokens so far add to what was handed out (``""`` while it is unsettled)."""
        self.ids.extend(new)
        return self._next(final=False)

    def flush(self) -> str:
        """The text not yet handed out, settled or not (the tokens have ended)."""
        return self._next(final=True)

    def _next(self, final: bool) -> str:
        if self.read == len(self.ids):
            return ""
        before = self.decode(self.ids[self.prefix : self.read]) if self.read > self.prefix else ""
        text = self.decode(self.ids[self.prefix :])
        if not final and (len(text) <= len(before) or text.endswith(REPLACEMENT)):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before) :]


class TextStream:
    """The text of one request's tokens, handed out in pieces as tokens arrive.

    Each :meth:`feed` decodes only a window of trailing tokens (:class:`Detokenizer`) and
    returns the new text that is safe to show: a suffix that could start a stop string is
    held back until the next tokens settle it. A stop string ends the text just before it.
    Stop strings are looked for in the text held back plus the new text: a stop string cannot
    start in text already handed out, since any suffix that could start one was held.

    ``lazy`` (a response sent whole, with no stop strings): :meth:`feed` only keeps the ids and
    :meth:`flush` decodes them once, since nothing reads the text before the end.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (), lazy: bool = False) -> None:
        self.decode, self.stop = decode, tuple(stop)
        self.lazy = lazy and not self.stop
        self.detokenizer = Detokenizer(decode)
        self.held = ""  # decoded text not handed out: it could start a stop string
        self.stopped = False

    @property
    def ids(self) -> list[int]:
        return self.detokenizer.ids

    def feed(self, new: Sequence[int]) -> str:
        """The text that ``new`` adds; after a stop string, the text up to it (and ``stopped``)."""
        if self.lazy:
            self.detokenizer.ids.extend(new)
            return ""
        return self._release(self.detokenizer.feed(new))

    def flush(self) -> str:
        """Everything not yet handed out (the request ended without a stop string)."""
        if self.stopped:
            return ""
        if self.lazy:
            return self.decode(self.ids)
        out = self._release(self.detokenizer.flush())
        if self.stopped:
            return out
        out, self.held = out + self.held, ""
        return out

    def _release(self, piece: str) -> str:
        if self.stopped:
            return ""
        if not self.stop:
            return piece
        text = self.held + piece
        cut = min((i for s in self.stop if (i := text.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.held = True, ""
            return text[:cut]
        keep = _stop_prefix(text, self.stop)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]


def _stop_prefix(text: str, stop: Sequence[str]) -> int:
    """The length of the longest suffix of ``text`` that begins some stop string."""
    held = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    return held
