"""llama.vim while its user types, keystroke by keystroke (`bench-session --keystroke-ms`).

`llama#setup_autocmds` (ggml-org/llama.vim `autoload/llama.vim` at a1c8e6e) runs two handlers at
every cursor move in insert mode, so at every typed character:

- `s:on_move`: hide the suggestion, then `s:fim_try_hint`: show one from the plugin's cache (this
  text's, or one that the characters typed since continue) and, once one shows, ask in the
  background for the text with it accepted (`llama#fim` with `prev`);
- `llama#fim` for the cursor: nothing if an answer for this text is cached; else send the request,
  unless one of the plugin's own requests runs: then call again in 100 ms, for wherever the
  cursor is then (a newer call replaces the pending one).

An answer goes into the cache and, while no suggestion shows, `s:fim_try_hint` runs again where
the cursor is then. So a typing user keeps one request in flight, for wherever the cursor was
when the last one ended, and a pause waits for that one, then for its own, unless an answer that
the typing continues shows first. The pause replay (`session.LlamaVimPauses`) sends only at the
pauses; this one sends what the plugin sends while the user types.

`TypingEditor` runs these handlers in real time, one request at a time (on a thread of its own),
and says when a suggestion shows at a pause.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from .llama_vim import (FIRST_PREDICT_MS, RETRY_S, SPECULATIVE_PREDICT_MS, Context, SuggestionCache, local_context,
                        shown_lines)


@dataclass(frozen=True)
class At:
    """A cursor: line `y` (0-based) of `lines`, holding `typed`, the cursor at its end."""
    lines: tuple[str, ...]
    y: int
    typed: str


def typed_between(lines: tuple[str, ...], before: At | None, pause: At, line_text: str | None) -> list[At]:
    """The cursors the user passes through from `before` (None: a jump, as to another file) to
    `pause`: each character of `before`'s line up to `line_text` (that line once typed) when the
    pause is on a later line, then each line in between (Enter), then the pause's own cursor; on
    the same line, each character up to the pause."""
    if before is None or before.lines != lines or before.y > pause.y:
        return [pause]
    if before.y == pause.y:
        return [At(lines, pause.y, pause.typed[:k])
                for k in range(len(before.typed) + 1, len(pause.typed) + 1)] or [pause]
    line = line_text if line_text is not None else before.typed
    states = [At(lines, before.y, line[:k]) for k in range(len(before.typed) + 1, len(line) + 1)]
    states += [At(lines, y, "") for y in range(before.y + 1, pause.y)]
    return states + [pause]


@dataclass
class Sent:
    """One request of the plugin: when it went out and was answered, its text's key, and whether
    the timer's retry sent it (it waited for an earlier request)."""
    at_s: float
    key: str
    retried: bool
    answered_s: float | None = None


@dataclass
class Job:
    future: Future
    context: Context
    sent: Sent


@dataclass
class Shown:
    at: At
    content: str  # what the plugin shows after the cursor
    lines: list[str]  # s:fim_data['content'], which the speculative request continues from
    answer: tuple[float, dict] | None  # (answered at, answer) for exactly this text (None: another text's)


class TypingEditor:
    """llama.vim's cursor-move handlers, its cache and its one request at a time. `send(context,
    predict_ms)` posts a request and returns the answer (a dict with "text"); it runs on the
    editor's own thread, while the handlers go on."""

    def __init__(self, send: Callable[[Context, int], dict]):
        self.send = send
        self.cache = SuggestionCache()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="llama-vim-request")
        self.cursor: At | None = None
        self.shown: Shown | None = None
        self.job: Job | None = None
        self.timer: tuple[float, At | None, list[str] | None] | None = None  # (due, cursor or None: current, prev)
        self.last_indent = 0  # s:indent_last
        self.sent: list[Sent] = []
        self.answers: dict[str, tuple[float, dict]] = {}  # context key -> (answered at, answer)

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def context(self, at: At, prev: list[str] | None) -> Context:
        return local_context(list(at.lines), at.y, at.typed, prev, self.last_indent)

    # -- the plugin's handlers -----------------------------------------------------------------

    def move(self, at: At) -> None:
        """CursorMovedI: `s:on_move`, then `llama#fim` for the cursor."""
        self.cursor, self.shown = at, None
        self.try_hint(at)
        self.fim(None, None)

    def try_hint(self, at: At) -> None:
        """`s:fim_try_hint`: show what the cache holds for `at`, then ask for the text with it accepted."""
        context = self.context(at, None)
        content = self.cache.suggestion(context)
        if content is None:
            return
        exact = self.answers.get(context.key())
        own = exact if exact is not None and exact[1]["text"] == content else None
        self.shown = Shown(at, content, shown_lines(content, at.typed, list(at.lines), at.y), own)
        self.fim(at, self.shown.lines)

    def fim(self, at: At | None, prev: list[str] | None, retried: bool = False) -> None:
        """`llama#fim`: `at` None for wherever the cursor is when it runs; `retried`: called by its timer."""
        now = time.perf_counter()
        if self.job is not None:
            self.timer = (now + RETRY_S, at, prev)
            return
        context = self.context(at or self.cursor, prev)
        if self.cache.holds(context):
            return
        self.last_indent = context.indent
        predict_ms = SPECULATIVE_PREDICT_MS if prev else FIRST_PREDICT_MS
        sent = Sent(now, context.key(), retried)
        self.sent.append(sent)
        self.job = Job(self.pool.submit(self.send, context, predict_ms), context, sent)

    def answered(self) -> None:
        """`s:fim_on_response`, then `s:fim_on_exit`."""
        job = self.job  # the handlers below still see it running, as the plugin's do
        answer = job.future.result()
        now = job.sent.answered_s = time.perf_counter()
        self.cache.insert(job.context, answer["text"])
        self.answers[job.sent.key] = (now, answer)
        if self.shown is None:
            self.try_hint(self.cursor)
        self.job = None

    # -- time --------------------------------------------------------------------------------------

    def run_until(self, until: float, done: Callable[[], bool] = lambda: False) -> None:
        """Run the handlers that fall due before `until` (perf_counter seconds), or until `done()`."""
        while not done():
            now = time.perf_counter()
            if self.job is not None and self.job.future.done():
                self.answered()
                continue
            if self.timer is not None and self.timer[0] <= now:
                _, at, prev = self.timer
                self.timer = None
                self.fim(at, prev, retried=True)
                continue
            if now >= until:
                return
            next_s = min(until, self.timer[0]) if self.timer is not None else until
            if self.job is not None:
                wait([self.job.future], timeout=max(0.0, next_s - now))
            else:
                time.sleep(max(0.0, next_s - now))

    def wait_shown(self, at: At, limit_s: float) -> Shown:
        """Run the handlers until a suggestion shows at `at` (the cursor, not moving)."""
        deadline = time.perf_counter() + limit_s
        self.run_until(deadline, lambda: self.shown is not None and self.shown.at == at)
        if self.shown is None or self.shown.at != at:
            raise TimeoutError(f"no suggestion showed within {limit_s:g} s")
        return self.shown

    def settle(self, limit_s: float) -> None:
        """Let the running request end and drop the pending call (the user leaves the buffer)."""
        if self.job is not None:
            wait([self.job.future], timeout=limit_s)
            if self.job.future.done():
                self.answered()
        self.timer = None

    def busy_s(self, start: float, end: float) -> float:
        """How long a request of the editor ran between `start` and `end`."""
        now = time.perf_counter()
        return sum(max(0.0, min(end, now if r.answered_s is None else r.answered_s) - max(start, r.at_s))
                   for r in self.sent)

    def requests_between(self, start: float, end: float) -> int:
        return sum(start <= r.at_s < end for r in self.sent)

    def held_back_s(self, context: Context, paused_s: float) -> float:
        """How long the request for `context`, sent after a pause at `paused_s`, waited for an
        earlier one (0: sent at once, or not sent after the pause)."""
        key = context.key()
        sent = next((r for r in reversed(self.sent) if r.key == key and r.at_s >= paused_s), None)
        return sent.at_s - paused_s if sent is not None and sent.retried else 0.0
