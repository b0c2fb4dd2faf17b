"""The model worker: one thread runs every generation, fed by a bounded queue.

Torch on a small CPU gains nothing from two generations at once, and the model and tokenizer
are not safe to share across threads, so one thread owns them. Requests beyond the queue's bound
are refused at once (the caller answers 503) instead of piling up. A job ends early when its
client disconnects, when a newer request of the same client supersedes it, or at its deadline:
each sets the flag that `generate` polls after every token.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from ..energy import open_meter
from ..engine import GenerationParams, build_prompt
from ..methods import make_method
from .prefix_cache import PrefixCache
from .report import stats_object
from .request import ApiError

log = logging.getLogger("dyncomplete.serve")
METHODS_KEPT = 8  # built methods kept (some load exit heads or a draft model)


@dataclass
class Job:
    prefix: str
    suffix: str | None
    params: GenerationParams
    method: str
    use_cache: bool
    client_id: str | None
    deadline: float
    emit: Callable[[tuple], None]  # ("text", delta) | ("done", result dict) | ("error", ApiError)
    submitted: float = field(default_factory=time.perf_counter)
    reason: str = ""  # why it was cancelled: disconnected, superseded, timeout
    _flag: threading.Event = field(default_factory=threading.Event)
    finished: bool = False

    def cancel(self, reason: str) -> None:
        if not self._flag.is_set():
            self.reason = reason
            self._flag.set()

    def cancelled(self) -> bool:
        if not self._flag.is_set() and time.perf_counter() > self.deadline:
            self.cancel("timeout")
        return self._flag.is_set()


class Busy(Exception):
    pass


class Worker:
    def __init__(self, model, default_method: str, queue_size: int, context_budget: int,
                 prefix_cache: PrefixCache):
        self.model = model
        self.default_method = default_method
        self.context_budget = context_budget
        self.prefix_cache = prefix_cache
        self.meter = open_meter(str(model.device))
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self._methods: OrderedDict[str, object] = OrderedDict()
        self._latest: dict[str, Job] = {}  # client id -> its newest job
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.current: Job | None = None
        self._thread = threading.Thread(target=self._loop, name="dyncomplete-model", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self.current is not None:
            self.current.cancel("shutdown")
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        """Queue a job, superseding the same client's older one; Busy when the queue is full."""
        with self._lock:
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                self.counts["rejected_busy"] += 1  # under the lock already
                raise Busy from None
            if job.client_id:
                older = self._latest.get(job.client_id)
                if older is not None:
                    older.cancel("superseded")
                self._latest[job.client_id] = job

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def status(self) -> dict:
        with self._lock:
            counts = dict(self.counts)
        return {"queued": self._queue.qsize(), "queue_size": self._queue.maxsize, "busy": self.current is not None,
                **counts}

    # -- the thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            self.current = job
            try:
                if job.cancelled():
                    self._count(f"skipped_{job.reason}")
                    job.emit(("error", ApiError(503 if job.reason == "timeout" else 409,
                                                f"request {job.reason} before it reached the model",
                                                code=job.reason, kind="server_error")))
                else:
                    job.emit(("done", self._run(job)))
            except ApiError as exc:
                self._count("refused")
                job.emit(("error", exc))
            except ValueError as exc:  # a method or the prompt builder refused the input
                self._count("refused")
                job.emit(("error", ApiError(400, str(exc))))
            except Exception as exc:  # keep serving: report the failure to this request only
                log.exception("generation failed")
                self._count("failed")
                job.emit(("error", ApiError(500, f"generation failed: {type(exc).__name__}: {exc}",
                                            kind="server_error")))
            finally:
                job.finished = True
                self.current = None
                with self._lock:
                    if job.client_id and self._latest.get(job.client_id) is job:
                        del self._latest[job.client_id]

    def _method(self, name: str):
        if name not in self._methods:
            self._methods[name] = make_method(name, self.model)
            if len(self._methods) > METHODS_KEPT:
                self._methods.popitem(last=False)
        self._methods.move_to_end(name)
        return self._methods[name]

    def _run(self, job: Job) -> dict:
        started = time.perf_counter()
        method = self._method(job.method)
        budget = self.context_budget
        prompt = build_prompt(self.model.tokenizer, job.prefix, job.suffix, budget)
        cache = None
        if job.use_cache:
            cache, _ = self.prefix_cache.lookup(prompt.ids)
        cache = cache if cache is not None else self.model.new_cache()
        with self.meter.measure() as energy:
            result = method.generate(self.model, prompt.ids, job.params, cache=cache,
                                     on_text=lambda t: job.emit(("text", t)), cancelled=job.cancelled)
        if job.use_cache:  # what was prefilled: token healing may have dropped the last prompt token
            self.prefix_cache.store(prompt.ids[: result.stats.prompt_tokens], cache)
        stopped_by = job.reason if result.stats.stopped_by == "cancelled" else result.stats.stopped_by
        self._count(f"stopped_{stopped_by}")
        notices = [n for n in (prompt.notice, "the prompt was cut to the context budget "
                               f"({budget} tokens, from the start)" if prompt.truncated else "") if n]
        return {
            "completion": result,
            "stats": stats_object(self.model, result, energy, {
                "stopped_by": stopped_by,
                "queue_s": started - job.submitted,
                "fim": prompt.fim,
                "truncated_prompt": prompt.truncated,
                "notices": notices,
            }),
        }
