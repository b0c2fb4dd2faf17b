"""The `Emitter`: every method hands it tokens one at a time, and it alone decides when the
completion ends.

It owns stop rules (max tokens, EOS, end of line in line mode, stop strings, the editor
guards of `guards.py`), the streaming callback, cancellation, the token counters and an
optional `guard` (a learned stop rule) that may end the completion before a token is taken.
So every method stops at exactly the same place for the same tokens, which the identity tests
rely on.
"""

from __future__ import annotations

import time
from typing import Callable

from tokenizers.decoders import DecodeStream

from .params import GenerationParams
from .stats import Stats

Guard = Callable[[int, int, str], bool]  # (token, layers, source) -> True to end before the token


class Detokenizer:
    """Text of the tokens so far, decoded incrementally (tokenizers' `DecodeStream`: constant work
    per token) where the tokenizer has a fast backend, else by decoding all ids again."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.stream = DecodeStream(skip_special_tokens=True) if self.backend is not None else None
        self.ids: list[int] = []
        self.text = ""

    def add(self, token: int) -> str:
        self.ids.append(token)
        if self.stream is None:
            self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        else:
            self.text += self.stream.step(self.backend, token) or ""
        return self.text


class Emitter:
    """Accepts generated tokens one by one and decides when the completion ends."""

    def __init__(
        self,
        tokenizer,
        params: GenerationParams,
        eos_ids: set[int],
        stats: Stats,
        on_text: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        healed: str = "",
    ):
        self.detok = Detokenizer(tokenizer)
        self.healed = healed  # text dropped from the prompt by token healing: not part of the completion
        self.params = params
        self.eos_ids = eos_ids
        self.stats = stats
        self.on_text = on_text
        self.cancelled = cancelled
        self.guard: Guard | None = None
        self.ids: list[int] = []
        self.text = ""
        self.streamed = 0  # characters already sent to on_text
        self.done = False
        self.started = time.perf_counter()  # the editor guards' time cap counts from here
        self.previous = 0  # length of the text before the latest token

    def emit(self, token: int, layers: int, source: str = "full") -> bool:
        """Add one token; returns True when the completion is over (then ignore later tokens)."""
        if self.done:
            return True
        if self.guard is not None and self.guard(token, layers, source):
            return self._finish("stop_rule")
        if token in self.eos_ids:
            return self._finish("eos")
        self.ids.append(token)
        self.stats.new_tokens += 1
        self.stats.token_layers.append(layers)
        self.stats.token_sources.append(source)
        self.previous = len(self.text)
        self.text = self.detok.add(token)
        if self.healed and self.text.startswith(self.healed):
            self.text = self.text[len(self.healed):]
        cut, reason = self._stop_position()
        if cut is not None:
            self.text = self.text[:cut]
            return self._finish(reason)
        if len(self.ids) >= self.params.max_new_tokens:
            return self._finish("max_tokens")
        self._stream(self._safe_prefix())
        if self.cancelled is not None and self.cancelled():
            return self._finish("cancelled")
        return False

    def finish(self, reason: str) -> None:
        """End the completion from outside (a method that ran out of tokens, say)."""
        self._finish(reason)

    def _stop_position(self) -> tuple[int | None, str]:
        best, reason = None, ""
        if self.params.line_mode and "\n" in self.text:
            best, reason = self.text.index("\n"), "newline"
        for s in self.params.stop:
            i = self.text.find(s)
            if i >= 0 and (best is None or i < best):
                best, reason = i, "stop"
        return self._editor_cut(best, reason, final=False)

    def _editor_cut(self, best: int | None, reason: str, final: bool) -> tuple[int | None, str]:
        editor = self.params.editor
        text = self.text if best is None else self.text[:best]
        cut = editor.cut(text, self.previous, time.perf_counter() - self.started, final) if editor else None
        return (best, reason) if cut is None else cut

    def _safe_prefix(self) -> str:
        """Text that can be streamed now: hold back a possible partial stop string and an
        incomplete UTF-8 sequence (decoded as U+FFFD) at the end."""
        text = self.text.rstrip("\ufffd")
        hold = max((len(s) - 1 for s in self.params.stop), default=0)
        if self.params.editor is not None:
            hold = max(hold, self.params.editor.holds(text))
        return text[: max(self.streamed, len(text) - hold)]

    def _stream(self, upto: str) -> None:
        if self.on_text is not None and len(upto) > self.streamed:
            self.on_text(upto[self.streamed :])
        self.streamed = max(self.streamed, len(upto))

    def _finish(self, reason: str) -> bool:
        if not self.done:
            if self.params.editor is not None:  # the last line counts as complete now
                cut, why = self._editor_cut(None, reason, final=True)
                if cut is not None and why != "time_limit":
                    self.text, reason = self.text[:cut], why
            self.done = True
            self.stats.stopped_by = reason
            self._stream(self.text)
        return True
