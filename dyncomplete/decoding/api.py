"""What every decoding method shares: parameters, stats, the result, and the emitter.

A method (baseline, early exit, speculative, ...) decides which tokens come next; the `Emitter`
takes them one at a time and owns everything else: stop rules (max tokens, EOS, end of line in
line mode, stop strings), the streaming callback, cancellation and the token counters. So every
method stops at exactly the same place for the same tokens, which the identity tests rely on.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

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

    def __post_init__(self):
        if not (1 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT):
            raise ValueError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.stop = tuple(s for s in self.stop if s)


@dataclass
class Stats:
    """Work and time of one completion. Layer/head evaluations count one token through one layer
    (or one full-vocabulary head) as 1, for the decode phase: prefill is counted apart."""

    model: str = ""
    method: str = ""
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # served from a prefix cache, not prefilled
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    layer_evals: int = 0
    head_evals: float = 0.0  # full LM-head evaluations (exit decisions on the head included)
    extra_macs: float = 0.0  # policy / classifier / draft-head work, in multiply-accumulates
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    token_layers: list[int] = field(default_factory=list)  # layers run for each emitted token
    token_sources: list[str] = field(default_factory=list)  # "full", "exit", "draft", "bonus"
    stopped_by: str = ""  # max_tokens, eos, newline, stop, cancelled, stop_rule

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def layer_evals_per_token(self) -> float:
        return self.layer_evals / self.new_tokens if self.new_tokens else 0.0

    def record_draft(self, drafted: int, accepted: int) -> None:
        """One verification step over `drafted` tokens of which the first `accepted` agreed."""
        self.drafted += drafted
        self.accepted += accepted
        self.verify_steps += 1
        for pos in range(drafted):
            if pos >= len(self.drafted_per_position):
                self.drafted_per_position.append(0)
                self.accepted_per_position.append(0)
            self.drafted_per_position[pos] += 1
            self.accepted_per_position[pos] += int(pos < accepted)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_s"] = self.total_s
        d["layer_evals_per_token"] = self.layer_evals_per_token
        d["tokens_per_s"] = self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0
        return d


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    stats: Stats
    healed: str = ""  # prompt text that token healing dropped; the first token's text starts with it


class Cancelled(Exception):
    pass


class Emitter:
    """Accepts generated tokens one by one and decides when the completion ends."""

    def __init__(
        self,
        tokenizer,
        params: GenerationParams,
        eos_ids: set[int],
        stats: Stats,
        on_text: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        healed: str = "",
    ):
        self.tokenizer = tokenizer
        self.healed = healed  # text dropped from the prompt by token healing: not part of the completion
        self.params = params
        self.eos_ids = eos_ids
        self.stats = stats
        self.on_text = on_text
        self.cancelled = cancelled
        self.ids: list[int] = []
        self.text = ""
        self.streamed = 0  # characters already sent to on_text
        self.done = False
        self._last_check = time.perf_counter()

    def emit(self, token: int, layers: int, source: str = "full") -> bool:
        """Add one token; returns True when the completion is over (then ignore later tokens)."""
        if self.done:
            return True
        if token in self.eos_ids:
            return self._finish("eos")
        self.ids.append(token)
        self.stats.new_tokens += 1
        self.stats.token_layers.append(layers)
        self.stats.token_sources.append(source)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self.healed and self.text.startswith(self.healed):
            self.text = self.text[len(self.healed):]
        cut, reason = self._stop_position()
        if cut is not None:
            self.text = self.text[:cut]
            return self._finish(reason)
        if len(self.ids) >= self.params.max_new_tokens:
            return self._finish("max_tokens")
        self._stream(self._safe_prefix())
        if self.cancelled is not None and self.cancelled():
            return self._finish("cancelled")
        return False

    def finish(self, reason: str) -> None:
        """End the completion from outside (a learned stop rule, say)."""
        self._finish(reason)

    def _stop_position(self) -> tuple[int | None, str]:
        best, reason = None, ""
        if self.params.line_mode and "\n" in self.text:
            best, reason = self.text.index("\n"), "newline"
        for s in self.params.stop:
            i = self.text.find(s)
            if i >= 0 and (best is None or i < best):
                best, reason = i, "stop"
        return best, reason

    def _safe_prefix(self) -> str:
        """Text that can be streamed now: hold back a possible partial stop string and an
        incomplete UTF-8 sequence (decoded as U+FFFD) at the end."""
        text = self.text.rstrip("\ufffd")
        hold = max((len(s) - 1 for s in self.params.stop), default=0)
        return text[: max(self.streamed, len(text) - hold)]

    def _stream(self, upto: str) -> None:
        if self.on_text is not None and len(upto) > self.streamed:
            self.on_text(upto[self.streamed :])
        self.streamed = max(self.streamed, len(upto))

    def _finish(self, reason: str) -> bool:
        if not self.done:
            self.done = True
            self.stats.stopped_by = reason
            self._stream(self.text)
        return True


def eos_ids_of(model) -> set[int]:
    ids = set()
    for source in (getattr(model.hf, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    if model.tokenizer is not None and model.tokenizer.eos_token_id is not None:
        ids.add(model.tokenizer.eos_token_id)
    return ids


def choose_token(logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None) -> int:
    """Greedy at temperature 0, otherwise temperature + nucleus (top-p) sampling."""
    logits = logits.reshape(-1)
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = sampling_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))


def sampling_probs(logits: torch.Tensor, params: GenerationParams) -> torch.Tensor:
    """The distribution a token is drawn from (also what speculative sampling must preserve)."""
    probs = torch.softmax(logits.reshape(-1).float() / max(params.temperature, 1e-6), dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


def make_generator(params: GenerationParams) -> torch.Generator | None:
    if params.temperature == 0:
        return None
    gen = torch.Generator()
    gen.manual_seed(params.seed if params.seed is not None else int(time.time_ns() % (2**31)))
    return gen
