"""Continuous batching: the one thread that runs the model for every request slot.

With `--parallel N` the worker runs up to N requests at once, each in its own slot thread that
does the request's Python work (prompt, sampling, stop strings, streaming). Their model passes
meet here: a slot's `forward` hands its step to the model thread and waits. The model thread
gathers the steps of every slot in generation (up to `gather_s` for a slot still between steps),
runs the batchable ones in one native call (`LayeredModel.forward_batch`: rows of different
sequences, each in its own cache) and the rest one by one. A prompt goes in chunks of
SHORT_QUERY tokens (chunked prefill, as llama.cpp's slots and vLLM do), so a long prompt delays
the others' tokens by one chunk a step, not by its whole prefill; decode steps take a batch's
rows before prompt chunks. Requests whose method is not batchable run whole on the model thread,
alone, between batches (`run_alone`).

Speculative requests whose drafts are chains of token ids (`lookup`) verify in the same batches
(`score_chain`). A batch's rows then share one verify budget, as TETRIS (Wu et al., 2025)
shares it: with `verify_row_cost` (what one more row costs against a one-row step, measured by
`models.verify_cost`), `shared_draft_lengths` keeps the drafted positions with the most expected
tokens across the batch while each still adds more tokens per unit of work than the batch gives
without it, and cuts the rest off the drafts' tails; each request then accepts from what was
scored. Without it (`None`), every request's own draft length is verified whole.

One thread runs every native call: OpenMP keeps one pool of threads per calling thread, and
pools beyond the CPU count stop spinning and run decode steps at half speed (native/__init__.py).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..models.attention import SHORT_QUERY


@dataclass(eq=False)
class _Step:
    ids: list[int]
    cache: object
    start: int
    logit_rows: int  # how many of the last positions' logits the slot waits for
    slot: int
    rates: list[float] | None = None  # a draft's (ids[1:]) acceptance estimates: a verify step
    done: threading.Event = field(default_factory=threading.Event)
    result: torch.Tensor | None = None
    error: BaseException | None = None

    def rows(self) -> int:
        return len(self.ids)

    def drafted(self) -> int:
        return len(self.ids) - 1 if self.rates is not None else 0


def shared_draft_lengths(fixed_rows: int, sure_tokens: int, drafts: list[list[float]], row_cost: float,
                         max_rows: int) -> list[int]:
    """How many tokens of each draft one batched pass verifies (TETRIS's batch-aware selection).

    The batch without drafted tokens has `fixed_rows` rows and yields `sure_tokens` tokens; its
    cost is 1 + row_cost * (rows - 1) one-row steps. A drafted position adds the chance that it and
    every position before it in its draft are accepted (the product of the draft's rates up to it)
    and one row. Positions are taken best first while each raises the expected tokens per unit of
    cost, and the rows stay within `max_rows`."""
    lengths = [0] * len(drafts)
    gain, cost, rows = float(sure_tokens), 1.0 + row_cost * (fixed_rows - 1), fixed_rows
    best = [(-drafts[d][0], 0, d) for d in range(len(drafts)) if drafts[d]]  # equal chances: the shorter first
    heapq.heapify(best)
    while best and rows < max_rows:
        chance, _, d = heapq.heappop(best)
        chance = -chance
        if chance * cost <= gain * row_cost:  # (gain + chance) / (cost + row_cost) would not beat gain / cost
            break
        gain, cost, rows = gain + chance, cost + row_cost, rows + 1
        lengths[d] += 1
        if lengths[d] < len(drafts[d]):
            heapq.heappush(best, (-chance * drafts[d][lengths[d]], lengths[d], d))
    return lengths


@dataclass(eq=False)
class _Alone:
    run: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None


class ModelThread:
    """Runs every model pass of the slots: batched steps and whole requests alone."""

    def __init__(self, model, max_rows: int = 4 * SHORT_QUERY, gather_s: float = 0.005,
                 verify_row_cost: float | None = None):
        self.model, self.max_rows, self.gather_s = model, max_rows, gather_s
        self.verify_row_cost = verify_row_cost
        self._cond = threading.Condition()
        self._steps: list[_Step] = []
        self._alone: list[_Alone] = []
        self._members: set[int] = set()  # slots in generation: each will hand in a step soon
        self._stopped = False
        self.batch_sizes: Counter[int] = Counter()  # sequences per batched call -> how many calls
        self.batch_seconds: Counter[int] = Counter()  # sequences per batched call -> seconds in those calls
        self.busy_s = 0.0  # seconds in model calls, batched and alone: the model's load
        self.batch_rows = 0
        self.drafted_rows = self.cut_rows = 0  # drafted positions handed in; of them, cut by the shared budget
        self._thread = threading.Thread(target=self._loop, name="dyncomplete-model", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def join(self, slot: int) -> None:
        with self._cond:
            self._members.add(slot)

    def leave(self, slot: int) -> None:
        with self._cond:
            self._members.discard(slot)
            self._cond.notify_all()  # the model thread may be waiting for this slot's step

    def forward(self, slot: int, ids: list[int], cache, start: int, logits: bool = True) -> torch.Tensor | None:
        """The last position's logits after `ids` at `start` (`LayeredModel.forward`'s; None with
        `logits` False: `fill`'s), from the batches this slot's steps join: a batchable prompt in
        chunks of SHORT_QUERY tokens."""
        chunk = SHORT_QUERY if self.model.batchable(cache, start, len(ids)) else len(ids)
        out = None
        for a in range(0, len(ids), chunk):
            piece = ids[a : a + chunk]
            out = self._wait(_Step(piece, cache, start + a, int(logits and a + chunk >= len(ids)), slot)).result
        return out[-1] if logits else None

    def score_chain(self, slot: int, ids: list[int], cache, start: int, rates: list[float] | None) -> torch.Tensor:
        """Every position's logits of a verification pass (`LayeredModel.score_chain`), from the
        batch this slot's step joins: the first n rows of the chain, n <= len(ids), where the
        shared verify budget cut the draft's tail."""
        rates = rates if rates is not None and len(rates) == len(ids) - 1 else None
        return self._wait(_Step(list(ids), cache, start, len(ids), slot, rates)).result

    def run_alone(self, run: Callable[[], object]):
        """`run()` on the model thread, with no batch beside it; its result (or its exception)."""
        return self._wait(_Alone(run)).result

    def _wait(self, item):
        with self._cond:
            if self._stopped:
                raise RuntimeError("the model thread has stopped")
            (self._steps if isinstance(item, _Step) else self._alone).append(item)
            self._cond.notify_all()
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item

    # -- the thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._steps or self._alone or self._stopped):
                    self._cond.wait()
                if self._stopped:
                    for item in self._steps + self._alone:
                        item.error = RuntimeError("the server is stopping")
                        item.done.set()
                    return
                if self._alone and not self._steps:
                    work = [self._alone.pop(0)]
                else:
                    self._gather()
                    work = self._take()
            started = time.perf_counter()
            steps = [item for item in work if isinstance(item, _Step)]
            if steps:
                self._run(steps)
            for item in work:
                if isinstance(item, _Alone):
                    self._finish([item], lambda: [item.run()])
            with self._cond:
                self.busy_s += time.perf_counter() - started

    def _gather(self) -> None:
        """Wait (lock held) until every slot in generation has a step in, or `gather_s` passed."""
        deadline = time.perf_counter() + self.gather_s
        while not self._stopped:
            waiting = self._members - {step.slot for step in self._steps}
            left = deadline - time.perf_counter()
            if not waiting or left <= 0:
                return
            self._cond.wait(left)

    def _take(self) -> list:
        """This batch (lock held): decode and verification steps first, then prompt chunks, up to
        max_rows rows; a request waiting to run alone goes after the steps that were already in."""
        order = sorted(self._steps, key=lambda s: s.rows() > 1 and s.rates is None)  # prompt chunks last
        batch, rows = [], 0
        for step in order:
            if batch and rows + step.rows() > self.max_rows:
                break
            batch.append(step)
            rows += step.rows()
        self._steps = [s for s in self._steps if s not in batch]
        if self._alone:
            batch.append(self._alone.pop(0))
        return batch

    def _run(self, steps: list[_Step]) -> None:
        model = self.model
        together = [s for s in steps if model.batchable(s.cache, s.start, s.rows())]
        self._share_verify_budget(together)
        if together:
            rows, started = sum(s.rows() for s in together), time.perf_counter()
            self._finish(together, lambda: model.forward_batch(
                [(s.ids, s.cache, s.start, s.logit_rows) for s in together]))
            with self._cond:
                self.batch_sizes[len(together)] += 1
                self.batch_seconds[len(together)] += time.perf_counter() - started
                self.batch_rows += rows
        for step in steps:
            if step not in together:
                self._finish([step], lambda: [self._alone_step(step)])

    def _alone_step(self, step: _Step) -> torch.Tensor:
        out = self.model.forward(torch.tensor(step.ids), step.cache, start=step.start,
                                 last_only=step.logit_rows <= 1)[0]
        return out[len(out) - step.logit_rows:]

    def _share_verify_budget(self, steps: list[_Step]) -> None:
        """Cut the batch's drafts to `shared_draft_lengths` (no cut without a row cost)."""
        verifying = [s for s in steps if s.drafted()]
        self.drafted_rows += sum(s.drafted() for s in verifying)
        if self.verify_row_cost is None or not verifying:
            return
        fixed = sum(s.rows() - s.drafted() for s in steps)
        lengths = shared_draft_lengths(fixed, sum(s.logit_rows > 0 for s in steps), [s.rates for s in verifying],
                                       self.verify_row_cost, self.max_rows)
        for step, k in zip(verifying, lengths):
            self.cut_rows += step.drafted() - k
            step.ids, step.rates = step.ids[: k + 1], step.rates[:k]
            step.logit_rows = k + 1

    @staticmethod
    def _finish(items: list, run: Callable[[], list]) -> None:
        try:
            for item, result in zip(items, run()):
                item.result = result
        except BaseException as exc:  # every waiting slot gets the failure; the thread goes on
            for item in items:
                item.error = exc
        for item in items:
            item.done.set()

    def status(self) -> dict:
        with self._cond:
            calls = sum(self.batch_sizes.values())
            return {"batched_calls": calls, "batch_sizes": dict(sorted(self.batch_sizes.items())),
                    "batch_seconds": {k: round(s, 3) for k, s in sorted(self.batch_seconds.items())},
                    "busy_s": round(self.busy_s, 3),
                    "mean_batch_rows": round(self.batch_rows / calls, 2) if calls else 0.0,
                    "in_generation": len(self._members), "drafted_rows": self.drafted_rows,
                    "drafted_rows_cut": self.cut_rows,
                    "verify_budget": "per-request" if self.verify_row_cost is None else "shared"}


class BatchedModel:
    """A slot's view of the model: `forward` joins the model thread's batches; everything else is
    the model's own (tokenizer, layer count, new caches)."""

    def __init__(self, model, thread: ModelThread, slot: int):
        self._model, self._thread, self._slot = model, thread, slot

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def forward(self, input_ids: torch.Tensor, cache=None, start: int | None = None,
                last_only: bool = True) -> torch.Tensor:
        if cache is None or not last_only:
            raise ValueError("a batched model takes a cache and gives the last position's logits")
        start = cache.lengths[0] if start is None else start
        return self._thread.forward(self._slot, input_ids.reshape(-1).tolist(), cache, start)[None, None]

    def fill(self, ids: list[int], cache) -> None:
        self._thread.forward(self._slot, ids, cache, cache.lengths[0], logits=False)

    def score_chain(self, ids: list[int], cache, start: int, rates: list[float] | None = None) -> torch.Tensor:
        return self._thread.score_chain(self._slot, ids, cache, start, rates)
