"""`GenerationParams`: what a request asks for, validated once where it is built."""

from __future__ import annotations

from dataclasses import dataclass

from .guards import EditorGuards

MAX_NEW_TOKENS_LIMIT = 4096


@dataclass
class GenerationParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    line_mode: bool = False  # stop at the first newline (line completion)
    token_healing: bool = False  # back up the prompt's last token (see healing.py)
    editor: EditorGuards | None = None  # where an editor's completion ends (see guards.py)
    history: tuple[int, ...] = ()  # earlier requests' tokens n-gram drafting may copy (serve/worker.py)

    def __post_init__(self):
        if not (1 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT):
            raise ValueError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.stop = tuple(s for s in self.stop if s)
