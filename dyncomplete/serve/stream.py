"""The bridge between the worker thread and a request's event loop, for one job.

The worker calls `Stream.emit` from its thread with ("text", delta), ("done", result) or
("error", ApiError); the events reach the request's coroutine through an asyncio queue. A client
that goes away sets its job's cancel flag: a streaming response's generator is closed (its
`finally` cancels), a waiting non-streaming request polls `request.is_disconnected()`. A job still
queued at its deadline is answered 503 here, since the worker, busy with another, cannot say so.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from .request import ApiError
from .worker import Busy, Job, Worker

POLL_S = 0.1  # how often a waiting non-streaming request checks for a disconnect
NDJSON = "application/x-ndjson"


class Stream:
    def __init__(self, request: Request, worker: Worker, timeout_s: float):
        self.request, self.worker, self.timeout_s = request, worker, timeout_s
        self.job: Job | None = None
        self._loop, self._events = asyncio.get_running_loop(), asyncio.Queue()
        self._last_check = time.monotonic()

    def emit(self, event: tuple) -> None:
        """Called from the worker thread."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass

    def submit(self, job: Job, queue_size: int) -> None:
        """Queue a job whose `emit` is this stream's; 503 when the queue is full."""
        self.job = job
        try:
            self.worker.submit(job)
        except Busy:
            raise ApiError(503, f"server busy: {queue_size} requests already queued, retry later",
                           code="queue_full", kind="server_error", headers={"Retry-After": "1"}) from None
        self._last_check = time.monotonic()

    async def next_event(self, watch_disconnect: bool) -> tuple:
        # checked by the clock, not only when no event comes: a non-streaming request also
        # receives a text event per token, often more than one per POLL_S
        job = self.job
        while True:
            if watch_disconnect and time.monotonic() - self._last_check >= POLL_S:
                self._last_check = time.monotonic()
                if await self.request.is_disconnected():
                    job.cancel("disconnected")
            try:
                return await asyncio.wait_for(self._events.get(), POLL_S)
            except asyncio.TimeoutError:
                if job.cancelled() and job.reason == "timeout" and not self.worker.running(job) and not job.finished:
                    return "error", ApiError(503, f"no answer within {self.timeout_s:g} s (queued too long)",
                                             code="timeout", kind="server_error")

    async def result(self) -> dict:
        """The "done" result, for a client that waits for the whole answer."""
        while True:
            kind, value = await self.next_event(True)
            if kind == "error":
                raise value
            if kind == "done":
                return value

    async def lines(self, chunk, final, error_line, end: str = ""):
        """The response lines of a streaming job: chunk(delta) per text event, final(result) at the
        end, error_line(ApiError) for an error once the headers are sent (the first event is
        awaited before: an error there is a plain error response)."""
        first = await self.next_event(True)
        if first[0] == "error":
            raise first[1]

        async def lines():
            event = first
            try:
                while True:
                    kind, value = event
                    if kind == "error":
                        yield error_line(value)
                        break
                    if kind == "text":
                        yield chunk(value)
                    if kind == "done":
                        yield final(value)
                        break
                    event = await self.next_event(False)
                if end:
                    yield end
            finally:
                if not self.job.finished:
                    self.job.cancel("disconnected")

        return lines()


def sse_event(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def ndjson_line(obj) -> str:
    return json.dumps(obj) + "\n"


def sse_response(lines) -> StreamingResponse:
    return StreamingResponse(lines, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def ndjson_response(lines) -> StreamingResponse:
    return StreamingResponse(lines, media_type=NDJSON, headers={"Cache-Control": "no-cache"})
