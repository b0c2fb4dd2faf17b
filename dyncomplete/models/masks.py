"""Additive attention masks for one step, built from absolute positions and the cache length at
each layer (sliding windows included): what lets a step run several tokens through a subset of
layers (verification, KV catch-up), or a token tree."""

from __future__ import annotations

import torch

from .step import StepContext


def tree_slots(parents: list[int], start: int) -> list[list[int]]:
    """Per row of a token tree in slots start, start + 1, ...: the slots of its ancestors and
    itself, oldest first."""
    slots: list[list[int]] = []
    for r, parent in enumerate(parents):
        slots.append((slots[parent] if parent >= 0 else []) + [start + r])
    return slots


class Masks:
    """The masks of one step, (1, 1, q, kv_len) in `dtype`, memoised by (kv_len, window)."""

    def __init__(self, ctx: StepContext, dtype: torch.dtype):
        self.ctx, self.dtype, self.memo = ctx, dtype, {}

    def get(self, kv_len: int, window: int | None) -> torch.Tensor | None:
        """A query sees keys at positions <= its own (and within the sliding window); a tree row
        its ancestors. None where nothing needs masking (one query, last key)."""
        key = (kv_len, window)
        if key not in self.memo:
            self.memo[key] = self._tree(kv_len, window) if self.ctx.tree_parents is not None else self._causal(kv_len, window)
        return self.memo[key]

    def _causal(self, kv_len: int, window: int | None) -> torch.Tensor | None:
        q_pos = self.ctx.positions[0]
        last = int(q_pos[0]) if len(q_pos) == 1 else None
        if last == kv_len - 1 and (window is None or kv_len <= window):
            return None
        k_pos = torch.arange(kv_len, device=q_pos.device)
        allowed = k_pos[None, :] <= q_pos[:, None]
        if window is not None:
            allowed &= k_pos[None, :] > q_pos[:, None] - window
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=q_pos.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[None, None]

    def _tree(self, kv_len: int, window: int | None) -> torch.Tensor:
        """Row r sees the slots before the tree (within the window of its position) and the slots
        of itself and its ancestors."""
        ctx = self.ctx
        start, device = ctx.tree_start, ctx.positions.device
        allowed = torch.zeros(len(ctx.tree_parents), kv_len, dtype=torch.bool, device=device)
        k_pos = torch.arange(start, device=device)
        allowed[:, :start] = True
        if window is not None:
            allowed[:, :start] &= k_pos[None, :] > ctx.positions[0][:, None] - window
        for r, slots in enumerate(tree_slots(ctx.tree_parents, start)):
            allowed[r, slots] = True
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=device)
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)[None, None]
