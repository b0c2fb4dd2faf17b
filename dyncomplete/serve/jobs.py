"""A parsed request as the worker's `Job` (its text cut to the context budget by characters, its
client id scoped to its sender, the keys of the sender's memories where the server and the request
use them), and its answer in the shapes of one API (`answer`)."""

from __future__ import annotations

import time
from typing import Callable

from fastapi import Request

from .request import CompletionRequest, clip_context, clip_prompt
from .state import Server, sender
from .stream import Stream
from .worker import Job


def client_scope(request: Request, client_id: str | None) -> str | None:
    """A client id as the worker keys it: the id a client chose (X-Client-Id or `user`), scoped to
    its sender, so that one client cannot supersede another's requests by sending its id."""
    return f"{sender(request)}|{client_id}" if client_id else None


def editor_of(request: Request) -> str:
    """Whose memories a request reads and adds to: its sender, and within it the editor its
    X-Client-Id header names (editors behind one proxy, with one key, are told apart so)."""
    editor = request.headers.get("x-client-id")
    return f"{sender(request)}|{editor}" if editor else sender(request)


def memory_of(server: Server, request: Request, req: CompletionRequest) -> str | None:
    """The key of the editor's memory of files when the server and the request use it."""
    return editor_of(request) if server.client_files is not None and req.client_memory else None


def history_of(server: Server, request: Request, req: CompletionRequest) -> str | None:
    """The key of the editor's earlier completions when the server and the request use them."""
    return editor_of(request) if server.client_history is not None and req.ngram_cache else None


def job_for(server: Server, request: Request, req: CompletionRequest, emit: Callable[[tuple], None]) -> Job:
    """The job of a parsed request; the request keeps none of its text afterwards (the clipped
    text is all that is kept)."""
    budget = server.settings.context_budget
    prefix, suffix, clipped = clip_prompt(req.prefix, req.suffix, budget)
    job = Job(prefix=prefix, suffix=suffix, params=req.params, method=req.method, use_cache=req.prefix_cache,
              client_id=client_scope(request, req.client_id), editor=editor_of(request),
              deadline=time.perf_counter() + server.settings.request_timeout_s, emit=emit, clipped=clipped,
              context=clip_context(req.context, budget), budget=req.budget, memory=memory_of(server, request, req),
              history=history_of(server, request, req))
    req.prefix = req.suffix = req.context = None
    return job


def queue(server: Server, request: Request, req: CompletionRequest) -> Stream:
    """Queue a parsed request (503 when the queue is full); its events come through the stream."""
    stream = Stream(request, server.worker, server.settings.request_timeout_s)
    stream.submit(job_for(server, request, req, stream.emit), server.settings.queue_size)
    return stream


def warm(server: Server, request: Request, req: CompletionRequest) -> None:
    """A cache-warming request holds no completion, but the files it sent are remembered."""
    if (key := memory_of(server, request, req)) is not None:
        budget = server.settings.context_budget
        prefix, suffix, _ = clip_prompt(req.prefix, req.suffix, budget)
        server.client_files.remember(key, clip_context(req.context, budget), prefix + (suffix or ""))


async def answer(server: Server, request: Request, req: CompletionRequest, final, chunk, error, line, response,
                 end: str = ""):
    """The answer in one API's shapes: final(result, text) when the client waits for it whole
    (final(None) at once for a cache-warming request); streamed, response(lines) of line(obj) for
    chunk(delta) per text event, then final(result) or error(ApiError), then `end`."""
    if req.warm_only:
        warm(server, request, req)
        return response(iter([line(final(None))])) if req.stream else final(None)
    stream = queue(server, request, req)
    if not req.stream:
        value = await stream.result()
        return final(value, value["completion"].text)
    return response(await stream.lines(lambda text: line(chunk(text)), lambda value: line(final(value)),
                                       lambda exc: line(error(exc)), end))
