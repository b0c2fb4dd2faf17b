"""`METHOD+stop:T`: end any method's completion when the stop rule (`exits.stop_rule`) gives
P(wrong) > T for the next token.

Before each token is emitted, the emitter's guard runs the classifier on the row of the latest
LM-head call that produced it (the model's `head_tap` records them; rows are consumed in order,
so a verification pass over several positions works too), and a firing rule ends the completion
before that token.

The rows belong to one request. `generate` runs a request's model calls on the calling thread,
so the tap hands each LM-head input to the recorder of the thread that made the call, and one
method object (and one model) serves concurrent requests.
"""

from __future__ import annotations

import threading

import torch

from ..engine import DecodingMethod
from ..exits.stop_rule import check_macs, load_stop_rule
from .registry import make_method


class _HeadRows:
    """The rows of the latest LM-head call, handed out one per emitted token."""

    def __init__(self):
        self.rows, self.next = None, 0

    def record(self, normed: torch.Tensor) -> None:
        self.rows, self.next = normed.reshape(-1, normed.shape[-1]), 0

    def take(self) -> torch.Tensor | None:
        if self.rows is None or self.next >= len(self.rows):
            return None
        self.next += 1
        return self.rows[self.next - 1]


class _ThreadTap:
    """A model's `head_tap` while stop-rule requests run: each LM-head input goes to the rows of
    the request running on the calling thread (none: ignored). Removed when the last one ends."""

    _lock = threading.Lock()

    def __init__(self):
        self.local = threading.local()
        self.users = 0

    def __call__(self, normed: torch.Tensor) -> None:
        rows = getattr(self.local, "rows", None)
        if rows is not None:
            rows.record(normed)

    @classmethod
    def attach(cls, model, rows: _HeadRows) -> "_ThreadTap":
        with cls._lock:
            tap = model.head_tap
            if not isinstance(tap, cls):
                if tap is not None:
                    raise RuntimeError("the model's head_tap is already in use")
                tap = model.head_tap = cls()
            tap.users += 1
        tap.local.rows = rows
        return tap

    def detach(self, model) -> None:
        self.local.rows = None
        with self._lock:
            self.users -= 1
            if self.users == 0 and model.head_tap is self:
                model.head_tap = None


class StopRule(DecodingMethod):
    def __init__(self, inner: DecodingMethod, threshold: float, mlp: torch.nn.Module):
        if type(inner).generate is not DecodingMethod.generate:
            raise ValueError(f"+stop cannot wrap {inner.name}: it does not decode through dyncomplete's loop")
        self.inner, self.threshold, self.mlp = inner, float(threshold), mlp
        self._request = threading.local()  # the running request's rows, per thread

    def generate(self, model, *args, **kwargs):
        rows = self._request.rows = _HeadRows()
        tap = _ThreadTap.attach(model, rows)  # from the prompt pass on: its last row gives the first token
        try:
            return super().generate(model, *args, **kwargs)
        finally:
            tap.detach(model)
            self._request.rows = None

    @property
    def prompt_depth(self):
        return self.inner.prompt_depth

    def prompt_pass(self, model, ids, cache, last):
        return self.inner.prompt_pass(model, ids, cache, last)

    def prepare(self, model, prompt_ids, params, generator, stats):
        self.inner.prepare(model, prompt_ids, params, generator, stats)

    def decode(self, model, prompt_ids, logits, cache, emitter, generator):
        macs = check_macs(model)
        rows = self._request.rows

        def wrong(token, layers, source) -> bool:
            row = rows.take()
            if row is None:
                return False
            emitter.stats.extra_macs += macs
            return float(torch.sigmoid(self.mlp(row.float()))) > self.threshold

        emitter.guard = wrong
        self.inner.decode(model, prompt_ids, logits, cache, emitter, generator)


def build(name, model) -> StopRule:
    try:
        threshold = float(name.arg(0))
    except ValueError:
        raise ValueError(f"stop takes a threshold, e.g. +stop:0.8, got {name.arg(0)!r}") from None
    return StopRule(make_method(name.inner, model), threshold, load_stop_rule(model))
