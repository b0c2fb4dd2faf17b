"""Stable cut of a prefix longer than the context budget.

Keeping "the last N tokens" moves the start of the prompt at every keystroke, so no two prompts
of a typing session would share a token prefix and the prefix cache would never hit. Here the
start moves in steps of a quarter of the budget, at a line start: consecutive requests keep the
same first line until the prefix has grown by a step, and the prompt stays between 3/4 of the
budget and the budget.
"""

from __future__ import annotations


def stable_prefix(tokenizer, prefix: str, budget: int) -> tuple[str, bool]:
    """(the prefix cut to at most about `budget` tokens at a stable line start, whether it was cut)."""
    enc = tokenizer(prefix, add_special_tokens=False, return_offsets_mapping=True)
    n = len(enc.input_ids)
    if n <= budget:
        return prefix, False
    step = max(1, budget // 4)
    drop = -(-(n - budget) // step) * step  # tokens to drop, rounded up to a whole step
    char = enc.offset_mapping[drop][0]
    newline = prefix.find("\n", max(char - 1, 0))
    cut = newline + 1 if newline >= 0 else char
    return prefix[cut:], True
