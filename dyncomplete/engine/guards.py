"""Editor guards: where a completion an editor will paste at the cursor should end.

A code model filling the middle often writes the middle, then the suffix again, then more code
(Qwen2.5-Coder-0.5B with a `return` line after the cursor writes the middle, repeats the `return`
and goes on with the next function). Editors cut this themselves (llama.vim drops a suggestion
that repeats the next line; Continue stops a single-line completion at the newline and at a
closing bracket that closes nothing); here the emitter checks `EditorGuards.cut` after every token,
so generation also stops as early, not only the text:

- time cap (llama.cpp's `t_max_predict_ms`): past it, stop at the next token holding a newline;
- indentation (llama.cpp's `n_indent`): a line after the first whose first non-blank character
  comes before column `n_indent` ends the completion, cut at that character;
- single line: text after the cursor on the cursor's line means a single-line completion,
  unless the cursor is at the line's start (line start: the completion is whole lines inserted
  above that line, as HumanEval's infilling middles are; every cut keeps whole lines, the
  newline before the cut included, and only whole lines stream);
- suffix repeat: a line equal to the suffix's first non-blank line ends the completion before it
  (single line: a completion ending with the rest of the cursor's line loses that ending);
- brackets: a closing bracket that closes nothing (neither opened in the completion nor left open
  before the cursor and not closed after it on the cursor's line) ends it, before the bracket;
- blank line (multi-line): a blank line after a line with code ends the completion before it, as
  Continue's `noDoubleNewLine` filter ends its multi-line completions. Otherwise llama.vim's
  request (`n_predict` 128) runs to its time cap at most pauses, writing the next blocks too.
"""

from __future__ import annotations

from dataclasses import dataclass

PAIRS = {")": "(", "]": "[", "}": "{"}
OPENERS = set(PAIRS.values())


def is_single_line(suffix: str | None) -> bool:
    """Text after the cursor on its own line: only that line's rest can be completed."""
    return bool(suffix) and bool(suffix.partition("\n")[0].strip())


def at_line_start(prefix: str) -> bool:
    """The cursor is in column 0."""
    return not prefix or prefix.endswith("\n")


def first_suffix_line(suffix: str | None) -> str:
    """The suffix's first non-blank line, stripped ("" when none)."""
    return next((line.strip() for line in (suffix or "").splitlines() if line.strip()), "")


def open_brackets(prefix: str, suffix: str | None) -> str:
    """Brackets open at the cursor (innermost last) that the rest of the cursor's line does not
    close. A closer in the prefix that matches nothing makes the count unknown: it restarts."""
    stack: list[str] = []
    for ch in prefix:
        if ch in OPENERS:
            stack.append(ch)
        elif ch in PAIRS:
            if stack and stack[-1] == PAIRS[ch]:
                stack.pop()
            else:
                stack.clear()
    for ch in (suffix or "").partition("\n")[0]:
        if ch in PAIRS and stack and stack[-1] == PAIRS[ch]:
            stack.pop()
    return "".join(stack)


def indent_cut(text: str, n_indent: int) -> int | None:
    """llama.cpp's rule: a line after the first with a non-blank character before column
    `n_indent` (spaces and tabs count one each) is cut at that character."""
    if n_indent <= 0:
        return None
    start = text.find("\n") + 1
    while start > 0:
        pos = start
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] != "\n" and pos - start < n_indent:
            return pos
        start = text.find("\n", start) + 1
    return None


def repeat_cut(text: str, suffix_line: str, final: bool) -> int | None:
    """Where the first completed line equal to `suffix_line` starts, less the newline before it
    (the last line counts as completed when `final`)."""
    if not suffix_line:
        return None
    start = 0
    while True:
        end = text.find("\n", start)
        if end < 0 and not final:
            return None
        line = text[start:] if end < 0 else text[start:end]
        if line.strip() == suffix_line:
            return max(start - 1, 0)
        if end < 0:
            return None
        start = end + 1


def bracket_cut(text: str, open_before: str) -> int | None:
    """The position of the first closing bracket that closes nothing."""
    stack = list(open_before)
    for i, ch in enumerate(text):
        if ch in OPENERS:
            stack.append(ch)
        elif ch in PAIRS:
            if not stack or stack[-1] != PAIRS[ch]:
                return i
            stack.pop()
    return None


def blank_line_cut(text: str) -> int | None:
    """Where a completed blank line after a line with code starts, less the newline before it."""
    start, seen_code = 0, False
    while (end := text.find("\n", start)) >= 0:
        if text[start:end].strip():
            seen_code = True
        elif seen_code:
            return start - 1
        start = end + 1
    return None


@dataclass(frozen=True)
class EditorGuards:
    """The guards of one request; `for_cursor` sets them from the text around the cursor."""

    time_limit_s: float | None = None  # t_max_predict_ms / 1000
    n_indent: int = 0
    single_line: bool = False
    suffix_line: str = ""  # multi-line: the suffix's first non-blank line; single: the line's rest
    open_before: str | None = None  # None: no bracket guard
    blank_line: bool = False
    line_start: bool = False  # whole lines inserted above the cursor's line (see the module's notes)

    @classmethod
    def for_cursor(cls, prefix: str, suffix: str | None, time_limit_s: float | None = None,
                   n_indent: int = 0) -> "EditorGuards":
        text_after = is_single_line(suffix)
        line_start = text_after and at_line_start(prefix)
        single = text_after and not line_start
        return cls(time_limit_s, n_indent, single, first_suffix_line(suffix), open_brackets(prefix, suffix),
                   blank_line=not single, line_start=line_start)

    def cut(self, text: str, new_from: int, elapsed_s: float, final: bool = False) -> tuple[int, str] | None:
        """(where the completion ends, why) or None to go on. `new_from`: where the text added by
        the latest token starts; `final`: the completion ended anyway (EOS, a limit)."""
        cuts = []
        if self.single_line and "\n" in text:
            cuts.append((text.index("\n"), "newline"))
        if self.single_line and (final or cuts) and self.suffix_line:
            line = text[: cuts[0][0]] if cuts else text
            if line.rstrip().endswith(self.suffix_line) and line.strip():
                cuts.append((line.rstrip().rindex(self.suffix_line), "suffix_repeat"))
        if not self.single_line:
            pos = repeat_cut(text, self.suffix_line, final)
            if pos is not None:
                cuts.append((pos, "suffix_repeat"))
        pos = indent_cut(text, self.n_indent)
        if pos is not None:
            cuts.append((pos, "indent"))
        if self.open_before is not None:
            pos = bracket_cut(text, self.open_before)
            if pos is not None:
                cuts.append((pos, "bracket"))
        if self.blank_line:
            pos = blank_line_cut(text)
            if pos is not None:
                cuts.append((pos, "blank_line"))
        if not cuts and self.time_limit_s is not None and elapsed_s > self.time_limit_s and "\n" in text[new_from:]:
            cuts.append((len(text), "time_limit"))
        if not cuts:
            return None
        pos, why = min(cuts)
        if self.line_start:  # back to the end of the last whole line, its newline kept
            pos = text.rfind("\n", 0, pos + 1) + 1
        return pos, why

    def holds(self, text: str) -> int:
        """How many characters at the end not to stream yet: a last line that may still turn
        out to repeat the suffix, or to be a blank line (with the newline before it); at a line's
        start, any unfinished last line."""
        line = text[text.rfind("\n") + 1:]
        if self.line_start:
            return len(line)
        blank = len(line) + 1 if self.blank_line and "\n" in text and not line.strip() else 0
        return max(blank, self._repeat_hold(text, line))

    def _repeat_hold(self, text: str, line: str) -> int:
        if not self.suffix_line:
            return 0
        if self.single_line:
            return len(line) - len(line.rstrip()) + min(len(line.rstrip()), len(self.suffix_line))
        if not self.suffix_line.startswith(line.strip()):
            return 0
        return len(line) + ("\n" in text)  # the newline before it goes if the line does
