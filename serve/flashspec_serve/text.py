"""Token ids -> the text a client sees: incremental, with stop strings."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """The text of one request's tokens, handed out in pieces as tokens arrive.

    Each :meth:`feed` decodes the whole continuation (a tokenizer may merge a token with
    the one before it) and returns the new text that is safe to show: a trailing
    ``U+FFFD`` (an incomplete UTF-8 character) and a suffix that could start a stop string
    are held back until the next tokens settle them. A stop string ends the text just before it.

    ``lazy`` (a response sent whole, with no stop strings): :meth:`feed` only keeps the ids and
    :meth:`flush` decodes them once, since nothing reads the text before the end; a decode of a
    growing continuation at every step costs time linear in its length.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (), lazy: bool = False) -> None:
        self.decode, self.stop = decode, tuple(stop)
        self.lazy = lazy and not self.stop
        self.ids: list[int] = []
        self.sent = 0  # characters handed out
        self.stopped = False

    def feed(self, new: Sequence[int]) -> str:
        """The text that ``new`` adds; after a stop string, the text up to it (and ``stopped``)."""
        self.ids.extend(new)
        if self.lazy:
            return ""
        text = self.decode(self.ids)
        cut = min((i for s in self.stop if (i := text.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._take(text, cut)
        safe = len(text) - self._held(text)
        return self._take(text, safe)

    def flush(self) -> str:
        """Everything not yet handed out (the request ended without a stop string)."""
        return "" if self.stopped else self._take(self.decode(self.ids), None)

    def _take(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        piece = text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece

    def _held(self, text: str) -> int:
        """How many trailing characters to hold back."""
        if text.endswith("\ufffd"):
            return len(text) - len(text.rstrip("\ufffd"))
        held = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), held, -1):
                if text.endswith(s[:k]):
                    held = k
                    break
        return held
