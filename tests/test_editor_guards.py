"""The editor guards (`engine/guards.py`): each rule on text, then through the emitter, where
they stop generation early and never stream text they later cut."""

import pytest

from dyncomplete.engine import EditorGuards, Emitter, GenerationParams, Stats
from dyncomplete.engine.guards import (blank_line_cut, bracket_cut, indent_cut, is_single_line, open_brackets,
                                       repeat_cut)
from dyncomplete.serve.editors import cursor_indent

CIRCLE_PREFIX = "import math\n\ndef circle(r):\n    "
CIRCLE_SUFFIX = "\n    return circumference\n"
# What Qwen2.5-Coder-0.5B writes there without guards: the middle, the suffix again, more code.
CIRCLE_RAMBLE = "circumference = 2 * math.pi * r\n    return circumference\n\ndef main():\n    print(circle(2))\n"


def test_single_line_when_text_follows_the_cursor():
    assert is_single_line("x)\nmore\n") and is_single_line("  y")
    assert not is_single_line("\n    return x\n") and not is_single_line("   \nx") and not is_single_line(None)


def test_indent_follows_llama_cpp():
    # the first line is exempt; a later line is cut at its first non-blank character when that
    # comes before column n_indent; blank lines pass
    text = "y = 1\n        z = 2\n\n    return z\n"
    assert indent_cut(text, 8) == text.index("return")
    assert indent_cut(text, 4) is None and indent_cut(text, 0) is None
    assert indent_cut("x\n\t\ty", 2) is None and indent_cut("x\n\ty", 2) == 3
    assert indent_cut("x\n  ", 4) is None  # no non-blank character yet: wait


def test_repeat_of_the_suffix_line_is_cut_with_its_newline():
    assert repeat_cut(CIRCLE_RAMBLE, "return circumference", final=False) == CIRCLE_RAMBLE.index("\n    return")
    assert repeat_cut("a = 1\n    return circumference", "return circumference", final=False) is None
    assert repeat_cut("a = 1\n    return circumference", "return circumference", final=True) == 5
    assert repeat_cut("return circumference\n", "return circumference", final=False) == 0


def test_brackets_open_before_the_cursor_may_close():
    assert open_brackets("f(a, [b", "") == "(["
    assert open_brackets("f(a, [b", "])\n") == ""  # the cursor's line closes them already
    assert open_brackets("x = 1)\ny = (", "") == "("  # a stray closer: counting starts again
    assert bracket_cut("c])", "([") is None
    assert bracket_cut("c]))", "([") == 3
    assert bracket_cut("g(x)) + 1", "") == 4


def test_circle_completion_keeps_only_the_middle():
    guards = EditorGuards.for_cursor(CIRCLE_PREFIX, CIRCLE_SUFFIX)
    assert not guards.single_line and guards.suffix_line == "return circumference"
    ends = [guards.cut(CIRCLE_RAMBLE[:i], i - 1, 0.0) for i in range(1, len(CIRCLE_RAMBLE) + 1)]
    first = next(i for i, e in enumerate(ends) if e)
    assert ends[first] == (len("circumference = 2 * math.pi * r"), "suffix_repeat")
    assert first == CIRCLE_RAMBLE.index("\ndef") - 1  # decided as soon as the repeated line ends


def test_single_line_stops_at_newline_and_drops_the_rest_of_the_line():
    guards = EditorGuards.for_cursor("total = add(", "b)\nprint(total)\n")
    assert guards.single_line and guards.open_before == ""  # ")" after the cursor closes "("
    assert guards.cut("a, b)\nx", 0, 0.0) == (len("a, "), "suffix_repeat")
    assert guards.cut("a, c\n", 0, 0.0) == (4, "newline")
    assert guards.cut("a, b)", 0, 0.0, final=True) == (3, "suffix_repeat")
    assert guards.cut("a, ", 0, 0.0, final=True) is None


# HumanEval's multi-line infilling: the cursor in column 0 of the line the middle goes above.
LOOP_PREFIX = "def f(k):\n    ans = []\n    for i in range(k):\n"
LOOP_SUFFIX = "    return ans\n"
LOOP_RAMBLE = "        ans.append(i)\n    return ans\n\ndef g(grid):\n"


def test_cursor_in_column_0_of_a_line_with_code_takes_whole_lines_above_it():
    guards = EditorGuards.for_cursor(LOOP_PREFIX, LOOP_SUFFIX)
    assert guards.line_start and not guards.single_line and guards.blank_line
    assert guards.suffix_line == "return ans"
    assert guards.cut(LOOP_RAMBLE, 0, 0.0) == (len("        ans.append(i)\n"), "suffix_repeat")  # newline kept
    assert guards.cut("        x = f(a))\n", 0, 0.0) == (0, "bracket")  # a cut inside a line drops the line
    assert guards.cut("        y = 1\n        x = f(a))", 0, 0.0) == (len("        y = 1\n"), "bracket")
    assert guards.cut("        y = 1\n\n", 0, 0.0) == (len("        y = 1\n"), "blank_line")
    assert guards.cut("        y = 1", 0, 0.0, final=True) is None
    # the cursor after text, or in a line's indentation: the rest of its line, as before
    assert EditorGuards.for_cursor(LOOP_PREFIX + "        ", LOOP_SUFFIX).single_line
    assert not EditorGuards.for_cursor(LOOP_PREFIX, "\n" + LOOP_SUFFIX).line_start
    assert EditorGuards.for_cursor("", "x = 1\n").line_start


def test_time_cap_at_line_start_keeps_whole_lines():
    guards = EditorGuards(time_limit_s=0.5, line_start=True)
    assert guards.cut("x = 1\ny = (", 5, 0.6) == (6, "time_limit")


def test_line_start_streams_only_whole_lines():
    guards = EditorGuards.for_cursor(LOOP_PREFIX, LOOP_SUFFIX)
    emitter, streamed, fed = run_emitter(LOOP_RAMBLE, guards)
    assert emitter.text == streamed == "        ans.append(i)\n" and emitter.stats.stopped_by == "suffix_repeat"
    assert fed == len("        ans.append(i)\n    return ans\n")
    emitter, streamed, _ = run_emitter("        x = f(a))\n", guards)
    assert emitter.text == streamed == "" and emitter.stats.stopped_by == "bracket"


def test_a_blank_line_after_code_ends_a_multi_line_completion():
    assert blank_line_cut("x = 1\n    y = 2\n\nz = 3\n") == len("x = 1\n    y = 2")
    assert blank_line_cut("x = 1\n   \t\n") == 5  # whitespace only is blank
    assert blank_line_cut("\n\n    y = 2\n") is None  # no code before the blank lines yet
    assert blank_line_cut("x = 1\n    ") is None  # the last line may still get code
    assert EditorGuards.for_cursor("def f():\n", "\n    return x\n").blank_line
    assert not EditorGuards.for_cursor("r = area(", ")\n").blank_line  # single line: the newline ends it


def test_blank_line_guard_never_streams_what_it_cuts():
    text = "x = 1\n    y = 2\n   \n    z = 3\n"
    emitter, streamed, fed = run_emitter(text, EditorGuards(blank_line=True))
    assert emitter.text == streamed == "x = 1\n    y = 2" and emitter.stats.stopped_by == "blank_line"
    assert fed == len("x = 1\n    y = 2\n   \n")  # stopped at the newline that completed the blank line


def test_time_cap_stops_only_at_a_newline():
    guards = EditorGuards(time_limit_s=0.5)
    assert guards.cut("x = 1", 0, 9.0) is None
    assert guards.cut("x = 1\n", 5, 0.1) is None
    assert guards.cut("x = 1\n", 5, 0.6) == (6, "time_limit")
    assert guards.cut("x = 1\ny", 6, 0.6) is None  # the newline came with an earlier token


class CharTokenizer:
    """One token per character (id = code point), decoded by joining: enough for the emitter."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def run_emitter(text: str, guards: EditorGuards | None, max_new_tokens: int = 200):
    pieces = []
    params = GenerationParams(max_new_tokens=max_new_tokens, editor=guards)
    emitter = Emitter(CharTokenizer(), params, {0}, Stats(), on_text=pieces.append)
    fed = 0
    for ch in text + "\0":  # "\0": EOS
        fed += 1
        if emitter.emit(ord(ch), 1):
            break
    return emitter, "".join(pieces), fed


@pytest.mark.parametrize("guards, want, reason", [
    (EditorGuards.for_cursor(CIRCLE_PREFIX, CIRCLE_SUFFIX), "circumference = 2 * math.pi * r", "suffix_repeat"),
    (EditorGuards.for_cursor(CIRCLE_PREFIX, CIRCLE_SUFFIX, n_indent=4), "circumference = 2 * math.pi * r",
     "suffix_repeat"),
    (EditorGuards(n_indent=4), "circumference = 2 * math.pi * r\n    return circumference\n\n", "indent"),
    (EditorGuards(blank_line=True), "circumference = 2 * math.pi * r\n    return circumference", "blank_line"),
    (EditorGuards.for_cursor("r = area(", ")\n"), "circumference = 2 * math.pi * r", "newline"),
    (None, CIRCLE_RAMBLE, "eos"),
])
def test_emitter_stops_generation_where_the_guard_cuts(guards, want, reason):
    emitter, streamed, fed = run_emitter(CIRCLE_RAMBLE, guards)
    assert emitter.text == want and streamed == want and emitter.stats.stopped_by == reason
    if guards is not None:  # stopped at the token that decided, not at the end of the text
        assert fed < len(CIRCLE_RAMBLE)


def test_emitter_trims_a_repeat_that_ends_the_completion():
    text = "circumference = 2 * math.pi * r\n    return circumference"
    emitter, streamed, _ = run_emitter(text, EditorGuards.for_cursor(CIRCLE_PREFIX, CIRCLE_SUFFIX))
    assert emitter.text == streamed == "circumference = 2 * math.pi * r"


def test_blank_cursor_line_gets_its_indentation_back():
    """llama.vscode sends a blank cursor line as `prompt: ""` with its width as `n_indent`."""
    assert cursor_indent("def circle(r):\n", "\n    return c\n", 4) == "    "
    assert cursor_indent("def f():\n\tx = 1\n", "\n", 1) == "\t"
    assert cursor_indent("def f():\n", "x)\n", 4) == ""  # text after the cursor: the width is not the cursor's
    assert cursor_indent("def f():\n", "\n", 0) == "" and cursor_indent("def f(", "\n", 4) == ""
