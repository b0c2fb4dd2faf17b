"""The model worker: slot threads run the generations, fed by a bounded queue.

With one slot (the default) one thread runs every generation. With `parallel` slots, up to that
many requests run at once, and one model thread runs all their model passes
(`batching.ModelThread`): the steps of batchable methods together, in one native call, and any
other method's request whole, alone. Requests beyond the queue's bound
are refused at once (the caller answers 503) instead of piling up. A job ends early when its
client disconnects, when a newer request of the same client supersedes it, or at its deadline:
each sets the flag that `generate` polls after every token, and the deadline is checked again
once the prompt is tokenised, before the model runs. The methods a request may pick are built
once, at start: a request never builds one (some load exit heads or a draft model).

A request that an editor's recent answer or the prefetched one already answers is answered from
it without the model (suggestions.py). With one slot, once a request is answered and none waits,
the slot prefetches the request for the text with that answer accepted; a new request stops it,
unless it is that request.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

from ..energy import open_meter
from ..engine import Completion, GenerationParams, Stats, build_prompt
from ..engine.repo_context import RepoContext
from ..methods import make_method
from ..models import native
from ..models.verify_cost import verify_cost
from .client_files import ClientFiles
from .batching import BatchedModel, ModelThread
from .client_history import ClientHistory
from .prefix_cache import PrefixCache
from .report import stats_object
from .request import ApiError
from .suggestions import Suggestions, accepted, reusable, same_request

log = logging.getLogger("dyncomplete.serve")


@dataclass(kw_only=True, eq=False)  # a job is itself: the worker keeps the running ones in a set
class Job:
    """One request for the model thread, built by keyword (`jobs.job_for` from a parsed request)."""

    prefix: str
    suffix: str | None
    params: GenerationParams
    method: str
    use_cache: bool
    client_id: str | None  # scoped by the app to the client's verified identity (address, key)
    editor: str  # whose suggestions it may reuse: its sender and X-Client-Id (jobs.editor_of)
    deadline: float
    emit: Callable[[tuple], None]  # ("text", delta) | ("done", result dict) | ("error", ApiError)
    clipped: bool = False  # the app cut the text by characters before queueing (request.clip_prompt)
    context: RepoContext | None = None  # other files' code (/infill's input_extra)
    budget: int | None = None  # the request's own, smaller context budget
    memory: str | None = None  # the sender whose remembered files add context (None: none added)
    history: str | None = None  # the sender whose earlier completions n-gram drafting may copy
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


class _Skipped(Exception):
    """The job was cancelled (or ran out of time) before the model ran."""


def build_methods(names: Sequence[str], model) -> dict[str, object]:
    """Every allowed method, built now (ValueError naming the bad one: the server fails at start)."""
    built = {}
    for name in dict.fromkeys(names):
        try:
            built[name] = make_method(name, model)
        except ValueError as exc:
            raise ValueError(f"cannot serve method {name!r}: {exc}") from None
    return built


VERIFY_BUDGETS = ("shared", "per-request")
SLOT_NICENESS = 10  # added to a batching slot thread's nice value (the model thread keeps the process's)


class Worker:
    def __init__(self, model, methods: Sequence[str], queue_size: int, context_budget: int,
                 prefix_cache: PrefixCache, client_files: ClientFiles | None = None,
                 client_history: ClientHistory | None = None, suffix_budget: int = 0, cursor_line: str = "middle",
                 parallel: int = 1, suggestions: Suggestions | None = None, prefetch: bool = False,
                 verify_budget: str = "shared"):
        """`methods`: the names requests may pick, all built here; `cursor_line`: see prompts.CURSOR_LINES;
        `parallel`: requests generated at once (continuous batching past 1); `suggestions`: answers
        kept for reuse (None: none); `prefetch`: with them and one slot, prefetch in idle time;
        `verify_budget`: with slots, "shared" (batching.shared_draft_lengths) or "per-request"."""
        if parallel < 1:
            raise ValueError(f"parallel needs at least 1 slot, got {parallel}")
        if verify_budget not in VERIFY_BUDGETS:
            raise ValueError(f"verify_budget is one of {', '.join(VERIFY_BUDGETS)}, got {verify_budget!r}")
        self.model = model
        self.context_budget, self.suffix_budget, self.cursor_line = context_budget, suffix_budget, cursor_line
        self.prefix_cache = prefix_cache
        self.client_files = client_files
        self.client_history = client_history
        self.suggestions = suggestions
        self.prefetch = prefetch and suggestions is not None and parallel == 1
        self._prefetching: Job | None = None
        self._methods = build_methods(methods, model)
        self.meter = open_meter(str(model.device))
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self._latest: dict[str, Job] = {}  # client id -> its newest job
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self._running: set[Job] = set()
        self.model_thread = None
        if parallel > 1:
            row_cost = verify_cost(model) if verify_budget == "shared" else None
            self.model_thread = ModelThread(model, verify_row_cost=row_cost)
        self._slots = [threading.Thread(target=self._loop, args=(slot,), name=f"dyncomplete-slot-{slot}", daemon=True)
                       for slot in range(parallel)]
        # building the methods (exit heads, shortlists) and measuring the verify cost ran tensor
        # work on this thread: free its pool, as `load` does, for the threads that decode
        native.release_thread_pool()

    def start(self) -> None:
        if self.model_thread is not None:
            self.model_thread.start()
        for thread in self._slots:
            thread.start()

    def alive(self) -> bool:
        """Whether every slot thread (and the model thread, with --parallel) still runs."""
        return all(t.is_alive() for t in self._slots) and (self.model_thread is None or self.model_thread.alive())

    def stop(self) -> None:
        with self._lock:
            running = list(self._running)
        for job in running:
            job.cancel("shutdown")
        for _ in self._slots:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break
        for thread in self._slots:
            thread.join(timeout=10)
        if self.model_thread is not None:
            self.model_thread.stop()

    def running(self, job: Job) -> bool:
        with self._lock:
            return job in self._running

    def submit(self, job: Job) -> None:
        """Queue a job, superseding the same client's older one; Busy when the queue is full."""
        with self._lock:
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                self.counts["rejected_busy"] += 1  # under the lock already
                raise Busy from None
            if self._prefetching is not None and not same_request(self._prefetching, job):
                self._prefetching.cancel("superseded")  # else it finishes, and answers this job
            if job.client_id:
                older = self._latest.get(job.client_id)
                if older is not None:
                    older.cancel("superseded")
                self._latest[job.client_id] = job

    def _count(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self.counts[key] += amount

    def status(self) -> dict:
        with self._lock:
            counts = dict(self.counts)
            running = len(self._running)
        batching = {"batching": self.model_thread.status()} if self.model_thread is not None else {}
        return {"queued": self._queue.qsize(), "queue_size": self._queue.maxsize, "busy": running > 0,
                "running": running, "slots": len(self._slots), **batching, **counts}

    # -- the thread ------------------------------------------------------------------------------

    def _loop(self, slot: int) -> None:
        if self.model_thread is not None:
            # a lower priority than the model's threads: their two OpenMP threads meet at barriers,
            # and a slot's Python work taking one's core held up both (docs/results.md)
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + SLOT_NICENESS))
            if native.available():
                native.keep_thread_serial()  # the model thread runs the model; this thread's tensor work is small
        while (job := self._queue.get()) is not None:
            with self._lock:
                self._running.add(job)
            try:
                if job.cancelled():
                    raise _Skipped
                result = self._run(job, slot)
                job.emit(("done", result))
                if self.prefetch:
                    self._prefetch(job, result, slot)
            except _Skipped:
                self._count(f"skipped_{job.reason}")
                job.emit(("error", ApiError(503 if job.reason == "timeout" else 409,
                                            f"request {job.reason} before it reached the model",
                                            code=job.reason, kind="server_error")))
            except ApiError as exc:
                self._count("refused")
                job.emit(("error", exc))
            except ValueError as exc:  # a method or the prompt builder refused the input
                self._count("refused")
                job.emit(("error", ApiError(400, str(exc))))
            except Exception as exc:  # keep serving: report the failure to this request only
                log.exception("generation failed")
                self._count("failed")  # the message may hold paths: the log has it, the client gets the type
                job.emit(("error", ApiError(500, f"generation failed ({type(exc).__name__}; see the server log)",
                                            code="internal_error", kind="server_error")))
            finally:
                job.finished = True
                with self._lock:
                    self._running.discard(job)
                    if job.client_id and self._latest.get(job.client_id) is job:
                        del self._latest[job.client_id]

    def _prefetch(self, job: Job, result: dict, slot: int) -> None:
        """Generate, unless a request waits, the request for the text with `job`'s answer accepted,
        and keep its answer; a request that arrives meanwhile stops it (`submit`)."""
        text = result["completion"].text
        if job.params.editor is None or not text or not reusable(job) or result["stats"]["reused"] \
                or not self._queue.empty():  # after a reused answer: no context to prefetch with
            return
        ahead = accepted(job, text)
        if self.suggestions.find(ahead) is not None:  # already kept (an earlier prefetch)
            return
        with self._lock:
            if not self._queue.empty():
                return
            self._prefetching = ahead
        try:
            self._run(ahead, slot, source="prefetch", context=result["context"])
            self._count("prefetched" if not ahead.cancelled() else "prefetch_stopped")
        except _Skipped:
            self._count("prefetch_stopped")
        except Exception:  # a prefetch fails alone: no request waits for it
            log.exception("prefetch failed")
        finally:
            with self._lock:
                self._prefetching = None

    @property
    def methods(self) -> list[str]:
        return list(self._methods)

    def _method(self, name: str):
        if name not in self._methods:  # the app checks first; this holds for direct callers too
            raise ApiError(400, f"method {name[:80]!r} is not allowed on this server; allowed: "
                           f"{', '.join(self._methods)}", "method", "method_not_allowed")
        return self._methods[name]

    def _generate(self, method, ids: list[int], params: GenerationParams, cache, job: Job, slot: int):
        """`method.generate` in this slot: on the model as it is with one slot; else its passes in
        the model thread's batches, or the whole request alone on the model thread."""
        def run(model):
            return method.generate(model, ids, params, cache=cache, on_text=lambda t: job.emit(("text", t)),
                                   cancelled=job.cancelled)

        if self.model_thread is None:
            return run(self.model)
        if not method.batchable:
            return self.model_thread.run_alone(lambda: run(self.model))
        self.model_thread.join(slot)
        try:
            return run(BatchedModel(self.model, self.model_thread, slot))
        finally:
            self.model_thread.leave(slot)

    def _reused(self, job: Job, found: tuple[str, str, str], started: float) -> dict:
        """The answer of a request that a kept answer answers: no prompt evaluated, no token generated."""
        text, stopped_by, source = found
        self._count(f"reused_{source}")
        if text:
            job.emit(("text", text))
        completion = Completion(text, [], Stats(model=self.model.name, method=job.method, stopped_by=stopped_by))
        with self.meter.measure() as energy:
            pass
        return {"completion": completion,
                "stats": stats_object(self.model, completion, energy, {
                    "stopped_by": stopped_by, "queue_s": started - job.submitted, "fim": job.suffix is not None,
                    "context_chunks": 0, "memory_chunks": 0, "truncated_prompt": job.clipped, "notices": [],
                    "reused": source})}

    def _run(self, job: Job, slot: int, source: str = "answer", context: RepoContext | None = None) -> dict:
        """The job's answer; `source` "prefetch": `context` is the context of the answer it follows,
        and it neither adds to the editor's memories (files, n-grams) nor stores its prompt in the
        prefix cache, which it reads without reordering."""
        started = time.perf_counter()
        method = self._method(job.method)
        if self.suggestions is not None and (found := self.suggestions.find(job)) is not None:
            return self._reused(job, found, started)
        budget = min(job.budget or self.context_budget, self.context_budget)
        prefetch = source == "prefetch"
        if not prefetch:
            context = job.context
            if job.memory is not None and self.client_files is not None:
                context = self.client_files.context(job.memory, job.prefix, job.suffix, job.context)
        prompt = build_prompt(self.model.tokenizer, job.prefix, job.suffix, budget, context, self.suffix_budget,
                              self.cursor_line)
        if job.cancelled():  # tokenising counts against the deadline too
            raise _Skipped
        cache = None  # no prefix cache for this request: the method prefills the whole prompt
        if job.use_cache:
            cache, _ = self.prefix_cache.lookup(prompt.ids, touch=not prefetch, depth=method.prompt_depth,
                                                cursor=prompt.cursor)
            cache = cache if cache is not None else self.model.new_cache()
        params, history = job.params, None
        if job.history is not None and self.client_history is not None:
            history = self.client_history
            params = dataclasses.replace(params, history=history.tokens(job.history))
        with self.meter.measure() as energy:
            result = self._generate(method, prompt.ids, params, cache, job, slot)
        if history is not None and not prefetch:
            history.add(job.history, result.token_ids)
        if self.suggestions is not None and result.stats.stopped_by != "cancelled":
            self.suggestions.add(job, result.text, result.stats.stopped_by, source)
        # what was prefilled (token healing may have dropped the last prompt token); not a prefetch's
        # prompt, which would add copies to the suffix the editor's next request most likely reuses
        if job.use_cache and not prefetch:
            self.prefix_cache.store(prompt.ids[: result.stats.prompt_tokens], cache, method.prompt_depth)
        stopped_by = job.reason if result.stats.stopped_by == "cancelled" else result.stats.stopped_by
        self._count(f"stopped_{stopped_by}")
        self._count("tokens_generated", result.stats.new_tokens)
        self._count("prompt_tokens_evaluated", result.stats.prompt_tokens - result.stats.cached_prompt_tokens)
        truncated = prompt.truncated or job.clipped
        notices = [n for n in (prompt.notice, "the prompt was cut to the context budget "
                               f"({budget} tokens, from the start)" if truncated else "") if n]
        return {
            "context": context,  # for a prefetch after it (not sent: the routes read completion and stats)
            "completion": result,
            "stats": stats_object(self.model, result, energy, {
                "stopped_by": stopped_by,
                "queue_s": started - job.submitted,
                "fim": prompt.fim,
                "context_chunks": prompt.context_chunks,
                "memory_chunks": len(context.chunks) - len(job.context.chunks if job.context else ()) if context else 0,
                "truncated_prompt": truncated,
                "notices": notices,
                "reused": None,
            }),
        }
