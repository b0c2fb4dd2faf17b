"""One forward step: the positions and token tree every layer shares (`StepContext`), and the
calls an engine answers (`Engine`), which `LayeredModel` forwards to the engine that runs now."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .kv_cache import KVCache


@dataclass
class StepContext:
    """What all layers share for one forward step.

    A token tree (verification of several drafts at once): the step's tokens occupy cache slots
    tree_start, tree_start + 1, ... at positions tree_start + depth; tree_parents[r] is row r's
    parent row (-1 for the first row), and a row attends to the cache and its ancestors only."""

    positions: torch.Tensor  # (1, q) absolute positions of the step's tokens
    tree_parents: list[int] | None = None
    tree_start: int = 0
    states: dict = field(default_factory=dict)  # engine -> what it prepared for this step

    def state_of(self, engine: Engine):
        """What `engine` prepared for this step (rotary tables, masks), prepared at first use."""
        state = self.states.get(engine)
        if state is None:
            state = self.states[engine] = engine.prepare(self)
        return state


class Engine(Protocol):
    """How a `LayeredModel` is computed: `hf.HFEngine` (the Hugging Face modules, every
    architecture, the training path) or `fast.FastEngine` (llama, qwen2)."""

    def ready(self) -> bool:
        """Whether the engine can run the model's modules as they are now."""

    def prepare(self, ctx: StepContext) -> object:
        """The engine's own inputs for one step, kept in `ctx.states`."""

    def embed(self, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor: ...

    def run_layer(self, i: int, hidden: torch.Tensor, ctx: StepContext, cache: KVCache | None) -> torch.Tensor: ...

    def run_layers(self, layers: range, hidden: torch.Tensor, ctx: StepContext,
                   cache: KVCache | None) -> torch.Tensor: ...

    def project_kv(self, layers: range, hidden: torch.Tensor, ctx: StepContext, cache: KVCache) -> None: ...

    def forward_chain(self, input_ids: torch.Tensor, cache: KVCache | None, start: int | None,
                      last_only: bool) -> torch.Tensor | None:
        """`LayeredModel.forward`'s logits by a shorter path of this engine's own, or None where it
        has none (the caller then runs the five calls)."""

    def forward_chains(self, steps: list[tuple[list[int], KVCache, int, int]]) -> list[torch.Tensor | None] | None:
        """`LayeredModel.forward_batch`'s logits by a shorter path of this engine's own, or None."""

    def run_exit(self, hidden: torch.Tensor, resume: list[int], ctx: StepContext, cache: KVCache, exits,
                 propagate: bool) -> tuple[int, torch.Tensor] | None:
        """An early-exit step with its decisions made natively (`LayeredModel.run_exit`), or None
        where this engine cannot."""

    def batchable(self, cache: KVCache | None, start: int, q_len: int) -> bool:
        """Whether `run_batch` can take this chain (`LayeredModel.forward_batch`)."""

    def run_batch(self, steps: list[tuple[torch.Tensor, StepContext, KVCache]]) -> list[torch.Tensor]:
        """Every layer for several sequences' chains at once, each output the bits it gets alone."""

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def head(self, normed: torch.Tensor) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of hidden states after the last layer: `head(final_norm(hidden))`."""

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode token reads, in the format this engine reads."""
