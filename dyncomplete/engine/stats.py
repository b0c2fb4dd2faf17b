"""`Stats` (work and time of one completion, definitions as in docs/metrics.md) and the
`Completion` every method returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..energy import compute_per_token, decision_per_token


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
    layer_evals: float = 0  # float: a propagated layer counts the share of a layer it costs
    head_evals: float = 0.0  # full LM-head evaluations (exit decisions on the head included)
    extra_macs: float = 0.0  # policy / classifier / draft-head work, in multiply-accumulates
    decision_macs: float = 0.0  # early exit's deciding, of the work above (see methods/early_exit.py)
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    by_source: dict[str, list[int]] = field(default_factory=dict)  # draft source -> [steps, drafted, accepted]
    draft_sizes: list[int] = field(default_factory=list)  # tokens drafted (chain or tree) per verification
    token_layers: list[int] = field(default_factory=list)  # layers run for each emitted token
    token_sources: list[str] = field(default_factory=list)  # "full", "exit", "draft", "bonus"
    stopped_by: str = ""  # max_tokens, eos, newline, stop, cancelled, stop_rule

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def layer_evals_per_token(self) -> float:
        return self.layer_evals / self.new_tokens if self.new_tokens else 0.0

    def count_full_steps(self, tokens: int, num_layers: int) -> None:
        """`tokens` positions through every layer and the head (a plain decode step each)."""
        self.layer_evals += tokens * num_layers
        self.head_evals += tokens

    def record_draft(self, drafted: int, accepted: int, source: str = "draft", depths: list[int] | None = None) -> None:
        """One verification step over `drafted` tokens from `source` (a proposer's name, or where
        it found them) of which `accepted` agreed (a chain's prefix, a tree's path). `depths`: each
        drafted token's depth in a tree; per depth the step counts as drafted once and as accepted
        if the accepted path reached that depth (for a chain, per position)."""
        self.drafted += drafted
        self.accepted += accepted
        self.verify_steps += 1
        self.draft_sizes.append(drafted)
        counts = self.by_source.setdefault(source, [0, 0, 0])
        counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + drafted, counts[2] + accepted
        for pos in range(max(depths) if depths else drafted):
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

    def summary(self, model) -> dict:
        """The figures every front end reports (CLI `--json`, server responses, benchmark rows)."""
        return {
            "method": self.method,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "layer_evals_per_token": self.layer_evals_per_token,
            "compute_per_token": compute_per_token(self, model),
            "decision_per_token": decision_per_token(self, model),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "stopped_by": self.stopped_by,
        }


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    stats: Stats
    healed: str = ""  # prompt text that token healing dropped; the first token's text starts with it
