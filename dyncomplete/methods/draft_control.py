"""How long a draft should be, and (for self-drafting) from which exit layer.

Verifying a wrong token is not free (on a CPU each extra verified position costs a little, and a
self-drafted one costs its shallow layers), so draft length follows evidence:

- `AcceptanceTracker`: running acceptance per draft position, conditioned on the earlier
  positions having been accepted (Beta-smoothed, exponentially forgetting);
- `best_length`: the length that maximises expected emitted tokens per unit of work, with the
  cost model of docs/metrics.md: E(k) = 1 + sum_j prod_{i<=j} a_i, work(k) = 1 + k * per_token_cost;
- `ConfidenceStop` (Kangaroo) / `EntropyStop` (SVIP): end a self-draft early when its own
  distribution is unsure;
- `ExitLayerController` (DEL-style): one tracker per candidate exit layer, picks the exit layer
  and length with the best expected tokens per work, optimistic about layers tried rarely.
"""

from __future__ import annotations

import math

import torch


class AcceptanceTracker:
    """P(position j accepted | positions < j accepted), smoothed by a Beta(prior) and decayed."""

    def __init__(self, max_len: int, prior: tuple[float, float] = (1.0, 1.0), decay: float = 0.98):
        self.hits = [prior[0]] * max_len
        self.tries = [prior[0] + prior[1]] * max_len
        self.prior = prior
        self.decay = decay
        self.steps = 0

    def update(self, drafted: int, accepted: int) -> None:
        self.steps += 1
        for j in range(min(drafted, len(self.hits))):
            if j > accepted:
                break  # position j was never reached: an earlier token was rejected
            self.hits[j] = self.decay * self.hits[j] + (1 - self.decay) * self.prior[0] + (j < accepted)
            self.tries[j] = self.decay * self.tries[j] + (1 - self.decay) * sum(self.prior) + 1

    def rates(self) -> list[float]:
        return [h / t for h, t in zip(self.hits, self.tries)]


def expected_tokens(rates: list[float], k: int) -> float:
    """Tokens emitted by one verification of a k-token draft: accepted prefix + the model's own."""
    total, run = 1.0, 1.0
    for a in rates[:k]:
        run *= a
        total += run
    return total


def best_length(rates: list[float], per_token_cost: float, max_len: int | None = None) -> tuple[int, float]:
    """(k, expected tokens per unit of work) maximising E(k) / (1 + k * per_token_cost)."""
    max_len = len(rates) if max_len is None else min(max_len, len(rates))
    best = (0, 1.0)
    for k in range(1, max_len + 1):
        value = expected_tokens(rates, k) / (1.0 + k * per_token_cost)
        if value > best[1]:
            best = (k, value)
    return best


def best_tree_size(chances: list[float], per_token_cost: float) -> int:
    """How many of a tree's nodes to verify, most likely first (each with its estimated chance of
    acceptance): the count maximising (1 + sum of their chances) / (1 + count * per_token_cost)."""
    best, size, gained = 1.0, 0, 1.0
    for i, chance in enumerate(chances):
        gained += chance
        value = gained / (1.0 + (i + 1) * per_token_cost)
        if value > best:
            best, size = value, i + 1
    return size


class ConfidenceStop:
    """Stop drafting when the draft's top probability falls below the threshold (Kangaroo)."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def stop(self, probs: torch.Tensor) -> bool:
        return float(probs.max()) < self.threshold


class EntropyStop:
    """Stop drafting when the draft distribution's entropy (nats) rises above the bound (SVIP)."""

    def __init__(self, bound: float):
        self.bound = bound

    def stop(self, probs: torch.Tensor) -> bool:
        p = probs[probs > 0]
        return float(-(p * p.log()).sum()) > self.bound


class ExitLayerController:
    """Chooses (exit layer, draft length) per step from acceptance observed at each layer.

    `costs[e]`: work of drafting one token from exit layer e, relative to one full step. A layer
    drafted from rarely gets an exploration bonus (UCB-style) so its estimate can improve.
    `priors[e]`: a starting acceptance rate (e.g. the head's measured agreement), worth 4 drafts."""

    def __init__(self, costs: dict[int, float], max_len: int, explore: float = 0.1,
                 priors: dict[int, float] | None = None):
        self.costs = costs
        self.max_len = max_len
        self.explore = explore
        self.priors = priors or {}
        self.reset()

    def fresh(self) -> "ExitLayerController":
        """A controller with the same costs and priors and nothing observed yet."""
        return ExitLayerController(self.costs, self.max_len, self.explore, self.priors)

    def reset(self) -> None:
        """Forget what was observed: back to the priors."""
        prior = lambda e: (4 * self.priors.get(e, 0.5), 4 * (1 - self.priors.get(e, 0.5)))  # noqa: E731
        self.trackers = {e: AcceptanceTracker(self.max_len, prior(e)) for e in self.costs}
        self.steps = 0

    def choose(self) -> tuple[int, int]:
        self.steps += 1
        best, choice = -math.inf, None
        for e, tracker in self.trackers.items():
            k, value = best_length(tracker.rates(), self.costs[e], self.max_len)
            value += self.explore * math.sqrt(math.log(self.steps + 1) / (tracker.steps + 1))
            if value > best:
                best, choice = value, (e, max(k, 1))
        return choice

    def update(self, layer: int, drafted: int, accepted: int) -> None:
        self.trackers[layer].update(drafted, accepted)
