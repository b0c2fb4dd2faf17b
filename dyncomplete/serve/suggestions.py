"""The answers an editor is about to ask for, kept by the server: its recent suggestions, and the
one prefetched for the text with its last suggestion accepted.

- Typing on: a request whose text before the cursor is an earlier answer's plus up to TYPED_BACK
  typed characters that the answer starts with (as the editor inserted it, `shown`), with the
  same text after the cursor, gets the answer's rest at once. llama.vim (`s:fim_try_hint`) and
  Continue do this in the editor; here it holds for every client.
- Prefetch (llama.vim's "speculative FIM", done in the server): once a request is answered and
  nothing waits, the worker generates the request for the text with the suggestion inserted
  (`accepted`), and stops the moment a request arrives (worker.py). Its answer waits here.

An answer is reused only by the same editor, for the same method, sampling, context and limits,
and only a greedy one. Its rest is cut again by the new request's editor guards: they only ever
cut, so the cut is where generating would have stopped (the time cap aside). It is an
approximation all the same: the model may continue typed text differently than it wrote it (the
replay in docs/results.md measures how often).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from dataclasses import dataclass

from ..engine import EditorGuards

TYPED_BACK = 128  # characters typed since an answer that may still continue it (llama.vim's limit)
KEPT = 64  # answers kept, newest first; a request looks through all of them


@dataclass(frozen=True)
class Entry:
    editor: str
    before: str  # the text before the cursor the answer was generated for
    suffix: str | None
    setting: tuple  # what else the answer depends on (see setting_of)
    text: str
    stopped_by: str
    source: str  # "answer" (a request's own) or "prefetch"


def setting_of(job) -> tuple:
    """Everything besides the text around the cursor and the editor guards that a completion
    depends on."""
    p = job.params
    return (job.method, job.budget, job.memory, job.history, job.context, p.max_new_tokens, p.stop, p.line_mode,
            p.token_healing)


def same_request(a, b) -> bool:
    """Whether `b` asks for what `a` asks for, so that `a`'s answer will answer it."""
    return (a.editor, a.prefix, a.suffix) == (b.editor, b.prefix, b.suffix) and setting_of(a) == setting_of(b)


def reusable(job) -> bool:
    """Greedy requests only: a sampled answer is one draw, not what the request would get."""
    return job.params.temperature == 0


def shown(before: str, text: str) -> str:
    """An answer as llama.vim and llama.vscode insert it at a cursor after only blanks on its line:
    without the leading blanks already typed there (Qwen2.5-Coder writes them again)."""
    line = before[before.rfind("\n") + 1:]
    if line.strip():
        return text
    lead = len(text) - len(text.lstrip(" \t"))
    return text[min(lead, len(line)):]


def accepted(job, text: str):
    """The request for the text with `text` inserted at the cursor: the same suffix, the editor
    guards of the new cursor with the same time cap and indentation floor (the cursor is still on
    its line, whose indentation the editors send), a cancel flag of its own."""
    guards = job.params.editor
    prefix = job.prefix + shown(job.prefix, text)
    if guards is not None:
        guards = EditorGuards.for_cursor(prefix, job.suffix, guards.time_limit_s, guards.n_indent)
    return dataclasses.replace(job, prefix=prefix, params=dataclasses.replace(job.params, editor=guards),
                               client_id=None, emit=lambda event: None, _flag=threading.Event(), reason="",
                               finished=False)


class Suggestions:
    """The KEPT newest answers (thread-safe: slot threads add and look up)."""

    def __init__(self, kept: int = KEPT):
        self._entries: deque[Entry] = deque(maxlen=kept)
        self._lock = threading.Lock()

    def add(self, job, text: str, stopped_by: str, source: str) -> None:
        if not reusable(job):
            return
        entry = Entry(job.editor, job.prefix, job.suffix, setting_of(job), text, stopped_by, source)
        with self._lock:
            self._entries.appendleft(entry)

    def find(self, job) -> tuple[str, str, str] | None:
        """(the answer, why it ended, its source) for `job` from a kept answer, or None."""
        if not reusable(job):
            return None
        setting = setting_of(job)
        with self._lock:
            entries = list(self._entries)
        for e in entries:
            if e.editor != job.editor or e.suffix != job.suffix or not job.prefix.startswith(e.before):
                continue
            typed = job.prefix[len(e.before):]
            text = shown(e.before, e.text) if typed else e.text  # typing on follows the answer as inserted
            if len(typed) > TYPED_BACK or not text.startswith(typed) or typed and len(text) == len(typed):
                continue
            if e.setting != setting:
                continue
            rest, stopped_by = text[len(typed):], e.stopped_by
            if job.params.editor is not None and (cut := job.params.editor.cut(rest, 0, 0.0, final=True)):
                rest, stopped_by = rest[: cut[0]], cut[1]
            return rest, stopped_by, e.source
        return None
