"""llama.vim's side of a completion, as the editor replay runs it (ggml-org/llama.vim,
`autoload/llama.vim` as of a1c8e6e, 2026-01-31; its speculative requests date from March 2025).

At a pause the plugin first looks in its own cache of suggestions (`s:fim_try_hint`): the
suggestion for exactly this text, or one made up to 128 typed characters earlier that starts with
what was typed since. Only on a miss does it ask the server, with a 250 ms generation budget
(`t_max_predict_ms`) "because we will launch a speculative request after this one is displayed".
Once a suggestion shows, it asks again in the background, with the configured 1000 ms, for the
text as it would be with the suggestion accepted (`s:fim_ctx_local` with `prev`), and caches that
answer too. Each answer is cached under four keys: the text, and the text without the first
one, two and three lines of the prefix window. While one of its requests runs, the plugin sends
no other: `llama#fim` tries again every 100 ms ("avoid sending repeated requests too fast"), so
a pause that comes before the background request is answered waits for it.

Mirrored here: the context cut, the keys, the cache lookup, and the part of `s:fim_render` that
decides what the speculative request continues from.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass

N_PREFIX, N_SUFFIX = 256, 64  # g:llama_config n_prefix, n_suffix (lines)
FIRST_PREDICT_MS = 250  # t_max_predict_ms of a request made at a pause
SPECULATIVE_PREDICT_MS = 1000  # g:llama_config t_max_predict_ms, for the request after a suggestion shows
TYPED_BACK = 128  # how many characters back s:fim_try_hint looks for a suggestion that the typing continues
MAX_CACHE_KEYS = 250  # g:llama_config max_cache_keys
CURSOR_MARK = "Î"  # what the plugin puts between the text before and after the cursor in a key
RETRY_S = 0.1  # s:timer_fim: how soon llama#fim tries again while a request of its own runs


def held_back_s(paused_s: float, running_s: float) -> float:
    """How long the request of a pause `paused_s` after a suggestion shows waits for the plugin's
    own background requests, answered `running_s` after it: until the first retry after them."""
    if paused_s >= running_s:
        return 0.0
    return math.ceil((running_s - paused_s) / RETRY_S - 1e-9) * RETRY_S


def blank(line: str) -> bool:
    return not line.strip()


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


@dataclass(frozen=True)
class Context:
    """What the plugin sends: `prefix` (lines above), `middle` (the cursor line up to the
    cursor: the body's `prompt`), `suffix` (the line's rest, the lines below), `indent` (n_indent)."""
    prefix: str
    middle: str
    suffix: str
    indent: int

    def key(self, prefix: str | None = None) -> str:
        """The text's key (`prefix`: another prefix window in its place)."""
        prefix = self.prefix if prefix is None else prefix
        return hashlib.sha256(f"{prefix}{self.middle}{CURSOR_MARK}{self.suffix}".encode()).hexdigest()

    def keys(self) -> list[str]:
        """The text's key and those of the text without the prefix window's first 1..3 lines."""
        out, trimmed = [self.key()], self.prefix
        for _ in range(3):
            trimmed = trimmed.partition("\n")[2]
            if not trimmed:
                break
            out.append(self.key(trimmed))
        return out


def local_context(lines: list[str], y: int, typed: str, accepted: list[str] | None = None,
                  last_indent: int = 0) -> Context:
    """`s:fim_ctx_local` with the cursor at the end of line `y` (0-based), which holds `typed`;
    `accepted`: the shown suggestion's lines, for the text as it would be with them inserted
    (its `n_indent` is then the last one sent, `last_indent`)."""
    below = lines[y + 1:y + 1 + N_SUFFIX]
    if not accepted:
        above = lines[max(0, y - N_PREFIX):y]
        middle, indent = ("", 0) if blank(typed) else (typed, indent_of(typed))
    else:
        above = lines[max(0, y - N_PREFIX + len(accepted) - 1):y]
        if len(accepted) > 1:
            above = [*above, typed + accepted[0], *accepted[1:-1]]
        middle = typed + accepted[0] if len(accepted) == 1 else accepted[-1]
        indent = last_indent
    return Context("\n".join(above) + "\n", middle, "\n" + "\n".join(below) + "\n", indent)


def shown_lines(content: str, typed: str, lines: list[str], y: int) -> list[str]:
    """The suggestion's lines as `s:fim_render` keeps them, which the speculative request
    continues from: trailing empty lines dropped, the part of a blank line's indentation that is
    already there taken off, and [""] for a suggestion that repeats the text below the cursor."""
    shown = content.split("\n")
    while shown and shown[-1] == "":
        shown.pop()
    if not shown:
        return [""]
    line = typed
    if blank(line):
        lead = min(indent_of(shown[0]), len(line))
        line, shown[0] = shown[0][:lead], shown[0][lead:]
    if len(shown) > 1 and shown[0] == "" and shown[1:] == lines[y + 1:y + len(shown)]:
        return [""]
    below = y + 1
    while below < len(lines) - 1 and blank(lines[below]):
        below += 1
    if line + shown[0] == (lines[below] if below < len(lines) else ""):
        next_line = lines[below + 1] if below + 1 < len(lines) else ""
        if len(shown) == 1 \
                or len(shown) == 2 and shown[-1] == (next_line[:len(shown[-1])] if shown[-1] else next_line) \
                or len(shown) > 2 and shown[1:] == lines[below + 1:below + len(shown)]:
            return [""]
    return shown


class SuggestionCache:
    """The plugin's cache of answers (g:cache_data, least recently used out first)."""

    def __init__(self, max_keys: int = MAX_CACHE_KEYS):
        self.entries: OrderedDict[str, str] = OrderedDict()
        self.max_keys = max_keys

    def get(self, key: str) -> str | None:
        if key in self.entries:
            self.entries.move_to_end(key)
        return self.entries.get(key)

    def insert(self, context: Context, content: str) -> None:
        for key in context.keys():
            self.entries[key] = content
            self.entries.move_to_end(key)
            while len(self.entries) > self.max_keys:
                self.entries.popitem(last=False)

    def holds(self, context: Context) -> bool:
        """Whether `llama#fim` finds an answer under one of the context's keys (then it sends nothing)."""
        return any(self.get(key) is not None for key in context.keys())

    def suggestion(self, context: Context) -> str | None:
        """`s:fim_try_hint`: the answer for this text, or else the rest of one made up to
        TYPED_BACK characters earlier whose start is what was typed since (picked as the plugin
        picks among several)."""
        exact = self.get(context.key())
        if exact is not None:
            return exact
        before, found, best = context.prefix + context.middle, None, 0
        for back in range(1, min(TYPED_BACK, len(before)) + 1):
            cached = self.get(Context(before[:-back], "", context.suffix, 0).key())
            if not cached or cached[:back] != before[-back:] or not cached[back:]:
                continue
            rest = cached[back:]
            if found is None:
                found = rest
            elif len(rest) > best:
                found, best = rest, len(rest)
        return found
