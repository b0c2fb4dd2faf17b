"""Stable cut of a prefix longer than the context budget.

Keeping "the last N tokens" moves the start of the prompt at every keystroke, so no two prompts
of a typing session would share a token prefix and the prefix cache would never hit. A cut
counted from the start of the text does not help either when the editor slides its own window
(llama.vim sends the 256 lines before the cursor, so the text's start moves with the cursor).

The cut is therefore chosen by content: of the line starts that keep between half the budget and
the budget, the prompt starts at the line whose hash is highest. That line stays the choice
while the user types below it and while the editor's window slides, until it falls out of the
range; a new choice comes about every quarter budget of growth, and the prompt keeps at least
half the budget.
"""

from __future__ import annotations

import bisect
import zlib
from functools import lru_cache

from .token_memo import token_ids


def line_rank(line: str) -> int:
    """A line's claim to start a prompt: the hash of its stripped text (-1 for a blank line)."""
    text = line.strip()
    return zlib.crc32(text.encode()) if text else -1


@lru_cache(maxsize=32)  # typing within a line sends the same prefix (the lines above) again
def stable_prefix(tokenizer, prefix: str, budget: int) -> tuple[str, bool]:
    """(the prefix cut to at most about `budget` tokens at a stable line start, whether it was cut)."""
    enc = tokenizer(prefix, add_special_tokens=False, return_offsets_mapping=True)
    n = len(enc.input_ids)
    if n <= budget:
        return prefix, False
    token_starts = [start for start, _ in enc.offset_mapping]

    def tokens_from(char: int) -> int:
        return n - bisect.bisect_left(token_starts, char)

    # one token of slack: text cut at a line start may tokenize into more tokens than counted,
    # so the best cut is checked, and the next best taken while it does not fit
    lines = [i + 1 for i, ch in enumerate(prefix) if ch == "\n" and budget // 2 <= tokens_from(i + 1) < budget]

    def rank_at(start: int) -> tuple[int, int]:
        end = prefix.find("\n", start)
        return line_rank(prefix[start:end if end >= 0 else len(prefix)]), -start

    for cut in sorted(lines, key=rank_at, reverse=True):
        if len(token_ids(tokenizer, prefix[cut:])) <= budget:  # the prompt builder's own ids of the kept text
            return prefix[cut:], True
    return prefix[token_starts[n - budget + 1]:], True  # no line start fits: the tail
