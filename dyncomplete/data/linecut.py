"""Line-completion examples cut from a folder of source files, CodeXGLUE style.

A cursor is placed inside a non-trivial line (not blank, not a comment, not inside a Python
string such as a docstring, at least two code tokens), after a whole code token and before at
least one more; the input is the file up to the cursor (its last `max_input_chars` characters,
starting at a line boundary) and the target `gt` is the rest of that line. Files are visited in a
seeded order, one cursor per file per round, so examples spread over many files and the first k
examples are the same whatever n is asked for (each file draws from its own seeded generator).
"""

from __future__ import annotations

import io
import random
import re
import tokenize
from pathlib import Path

from .splits import source_files, stdlib_root

CODE_TOKEN = re.compile(r"\w+|[^\w\s]")
COMMENT_STARTS = ("#", "//", "/*", "*", "--")
MIN_LINE_CHARS = 6


def _python_string_lines(text: str) -> set[int]:
    """0-based numbers of lines that lie inside multi-line string tokens (docstrings)."""
    inside = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0] - 1, tok.end[0]))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return inside


def candidate_lines(text: str, lang: str) -> list[int]:
    lines = text.split("\n")
    skip = _python_string_lines(text) if lang == "python" else set()
    keep = []
    for i, line in enumerate(lines):
        code = line.strip()
        if i in skip or len(code) < MIN_LINE_CHARS or code.startswith(COMMENT_STARTS):
            continue
        if len(CODE_TOKEN.findall(code)) >= 2:
            keep.append(i)
    return keep


def tail_from_line_start(before: str, max_chars: int) -> str:
    """The last `max_chars` characters of `before`, from the first line start among them."""
    if len(before) <= max_chars:
        return before
    window = before[-max_chars:]
    newline = window.find("\n")
    return window[newline + 1 :] if 0 <= newline < len(window) - 1 else window


def cut_line(text: str, line_no: int, rng: random.Random, max_input_chars: int, suffix_chars: int) -> dict:
    lines = text.split("\n")
    line = lines[line_no].rstrip()
    ends = [m.end() for m in CODE_TOKEN.finditer(line)][:-1]  # cursor after a token, one more follows
    cut = rng.choice(ends)
    start = sum(len(l) + 1 for l in lines[:line_no])
    record = {"input": tail_from_line_start(text[:start] + line[:cut], max_input_chars), "gt": line[cut:]}
    if suffix_chars > 0:
        record["suffix"] = "\n" + "\n".join(lines[line_no + 1 :])[: suffix_chars - 1]
    return record


def build_line_completion(root: Path | None, lang: str, n: int, seed: int, split: str | None = "test",
                          max_input_chars: int = 2500, suffix_chars: int = 0) -> list[dict]:
    """n examples from the files of `root` (default: the standard library) in `split` (None: all)."""
    if n < 1:
        raise ValueError(f"--n must be at least 1, got {n}")
    files = source_files(root, lang=lang, split=split)
    base = Path(root) if root is not None else stdlib_root()
    random.Random(seed).shuffle(files)
    pools: dict[Path, tuple] = {}  # file -> (text, its shuffled candidate lines, its rng), filled lazily
    examples = []
    while len(examples) < n and files:
        for path in list(files):
            if path not in pools:
                rel = path.relative_to(base).as_posix()
                text = path.read_text(encoding="utf-8", errors="replace")
                rng = random.Random(f"{seed}:{rel}")
                lines = candidate_lines(text, lang)
                rng.shuffle(lines)
                pools[path] = (rel, text, lines, rng)
            rel, text, lines, rng = pools[path]
            if not lines:
                files.remove(path)
                continue
            line_no = lines.pop()
            record = {"id": f"{rel}:{line_no + 1}", "lang": lang, "path": rel}
            record.update(cut_line(text, line_no, rng, max_input_chars, suffix_chars))
            examples.append(record)
            if len(examples) == n:
                break
    if not examples:
        raise ValueError(f"no {lang} source lines to cut under {root or 'the standard library'} (split {split or 'all'})")
    return examples
