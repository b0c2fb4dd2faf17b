"""Token ids of the texts an editor sends again at every pause, kept for the next one.

At each pause an editor resends its prefix window, its suffix window and its context chunks;
typing within a line changes none of them (the typed text goes after the middle marker), so
tokenizing them again is time spent before the first token for nothing.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=128)
def token_ids(tokenizer, text: str) -> tuple[int, ...]:
    """The ids of `text` without special tokens (immutable: callers share them)."""
    return tuple(tokenizer(text, add_special_tokens=False).input_ids)
