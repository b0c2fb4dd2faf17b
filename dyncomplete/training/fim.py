"""Fill-in-the-middle training examples cut from the train split, in the prompts the engine sends.

Each example is (token ids, index of the first target token): the prompt that `build_prompt`
makes for a prefix and a suffix (the model's own prefix-suffix-middle tokens, the cursor line's
start after the middle token), then the middle and the end-of-text token, which the loss is
taken on, so that the model learns to write the middle and stop. The middle is, by turns, whole
lines (one to eight: single- and multi-line infilling), a random span of characters (a cursor
anywhere), or, without a suffix, the next line after a prefix (line completion, which the
adapter must not forget).
"""

from __future__ import annotations

import random

from ..data.splits import source_files
from ..engine.prompts import build_prompt, fim_tokens

END_OF_MIDDLE = "<|endoftext|>"  # what Qwen2.5-Coder writes after a middle
KINDS = ("lines", "span", "prefix-only")
MAX_MIDDLE_TOKENS = 128
WINDOW_LINES = (24, 96)  # lines of a file around the middle, the prompt's text


def fim_examples(tokenizer, split: str, count: int, budget: int = 512, seed: int = 0) -> list[tuple[list[int], int]]:
    """`count` examples from the files of `split`, cycling KINDS; the prompt within `budget` tokens."""
    if fim_tokens(tokenizer) is None or END_OF_MIDDLE not in tokenizer.get_vocab():
        raise ValueError("FIM training needs a tokenizer with fill-in-the-middle tokens (Qwen2.5-Coder)")
    end = tokenizer.convert_tokens_to_ids(END_OF_MIDDLE)
    rng = random.Random(seed)
    files = [lines for lines in (_lines(path) for path in source_files(split=split)) if _written_by_hand(lines)]
    examples = []
    while len(examples) < count:
        kind = KINDS[len(examples) % len(KINDS)]
        prefix, middle, suffix = CUTS[kind](rng, _window(rng, rng.choice(files)))
        prompt = build_prompt(tokenizer, prefix, suffix, budget=budget).ids
        target = tokenizer(middle, add_special_tokens=False).input_ids
        if suffix is not None:
            target.append(end)
        if middle.strip() and len(target) <= MAX_MIDDLE_TOKENS:
            examples.append((prompt + target, len(prompt)))
    return examples


def _lines(path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def _written_by_hand(lines: list[str]) -> bool:
    """Long enough to cut, and not a generated table (the stdlib's charmap codecs say so at the top)."""
    return len(lines) >= 8 and "generated" not in "".join(lines[:5]).lower()


def _window(rng: random.Random, lines: list[str]) -> list[str]:
    size = rng.randint(*WINDOW_LINES)
    start = rng.randint(0, max(0, len(lines) - size))
    return lines[start : start + size]


def _whole_lines(rng: random.Random, lines: list[str]) -> tuple[str, str, str]:
    first = rng.randint(1, len(lines) - 2)
    last = min(len(lines) - 1, first + rng.randint(1, 8))
    return "".join(lines[:first]), "".join(lines[first:last]), "".join(lines[last:])


def _span(rng: random.Random, lines: list[str]) -> tuple[str, str, str]:
    text = "".join(lines)
    start = rng.randint(len(lines[0]), len(text) - 1)
    stop = min(len(text), start + rng.randint(1, 300))
    return text[:start], text[start:stop], text[stop:]


def _next_line(rng: random.Random, lines: list[str]) -> tuple[str, str, None]:
    cursor = rng.randint(1, len(lines) - 1)
    return "".join(lines[:cursor]), lines[cursor], None


CUTS = {"lines": _whole_lines, "span": _span, "prefix-only": _next_line}
