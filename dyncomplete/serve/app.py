"""The HTTP API (OpenAI's `/v1/completions` shape; llama.cpp's `/infill` and Ollama's
`/api/generate` for the editor plugins, in `editors.py`) and the playground page, on FastAPI.

Handlers only check input and talk to the `Worker`: every bad request is refused here, before it
takes a queue slot, and the event loop never touches the model. Events from the worker thread
reach a request through an asyncio queue; a client that goes away sets its job's cancel flag
(streaming: the response generator is closed; otherwise `request.is_disconnected()` is polled).
Every error, an unexpected one included, is an OpenAI-style JSON body; `http.py` holds the
limits below the app (connections, request heads, Host).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import DEFAULT_CONTEXT_BUDGET
from ..engine.prompts import fim_tokens
from ..methods import families
from .http import Guard, Limits
from .client_files import ClientFiles
from .client_history import ClientHistory
from .prefix_cache import PrefixCache
from .report import finish_reason
from .editors import (OLLAMA_VERSION, infill_chunk, infill_final, ollama_chunk, ollama_final, ollama_show,
                      ollama_tags, parse_generate, parse_infill)
from .request import ApiError, CompletionRequest, clip_context, clip_prompt, decode_body, parse_completion
from .worker import Busy, Job, Worker

STATIC = Path(__file__).parent / "static"
POLL_S = 0.1  # how often a waiting non-streaming request checks for a disconnect
# Allowed besides the default method unless --methods says otherwise: built-ins that load nothing.
DEFAULT_METHODS = ("baseline", "lookup")
NDJSON = "application/x-ndjson"


@dataclass
class Settings:
    default_method: str = "baseline"
    methods: tuple[str, ...] = DEFAULT_METHODS  # what a request may pick, besides default_method
    check_host: bool = True  # answer only Host names of loopback (set when bound to loopback)
    limits: Limits = Limits()
    api_key: str | None = None
    queue_size: int = 16
    request_timeout_s: float = 60.0
    max_tokens_limit: int = 1024
    context_budget: int = DEFAULT_CONTEXT_BUDGET
    cache_bytes: int = 512 * 2**20
    client_memory: bool = True  # remember the files each editor sent and retrieve from them
    ngram_cache: bool = True  # n-gram drafting may copy a client's earlier completions
    max_body_bytes: int = 2 * 2**20


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body as JSON (415 otherwise: a web page cannot send that type across sites without a
    preflight, which gets no CORS headers here), at most `limit` bytes, within `timeout_s`."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, f"Content-Type must be application/json, got {media_type[:60] or 'none'!r}",
                       code="unsupported_media_type")
    close = {"Connection": "close"}  # the rest of the body is not read: the connection cannot be reused
    too_large = ApiError(413, f"request body over {limit} bytes", code="body_too_large", headers=close)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout",
                       headers=close) from None
    return bytes(body)


def sender(request: Request) -> str:
    """What the server can verify about who sent a request: its address (not X-Forwarded-For) and
    a digest of the key it presented. The memory of sent files is kept per sender (one editor)."""
    key = hashlib.sha256(request.headers.get("authorization", "").encode()).hexdigest()[:16]
    peer = request.client.host if request.client else ""
    return f"{peer}|{key}"


def client_scope(request: Request, client_id: str | None) -> str | None:
    """A client id as the worker keys it: the id a client chose (X-Client-Id or `user`), scoped to
    its sender, so that one client cannot supersede another's requests by sending its id."""
    return f"{sender(request)}|{client_id}" if client_id else None


def completion_body(rid: str, created: int, model: str, text: str, finish: str | None, usage=None, stats=None):
    body = {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    if stats is not None:
        body["dyncomplete"] = stats
    return body


def usage_of(result: dict) -> dict:
    s = result["completion"].stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.new_tokens,
            "total_tokens": s.prompt_tokens + s.new_tokens}


def create_app(model, settings: Settings) -> FastAPI:
    """Build every allowed method now (ValueError on a bad one) and the app around them."""
    prefix_cache = PrefixCache(settings.cache_bytes)
    client_files = ClientFiles() if settings.client_memory else None
    client_history = ClientHistory() if settings.ngram_cache else None
    methods = list(dict.fromkeys((settings.default_method, *settings.methods)))
    worker = Worker(model, methods, settings.queue_size, settings.context_budget, prefix_cache, client_files,
                    client_history)
    known_families = families()

    def check_key(request: Request):
        """Every route but the page and its static files (a browser cannot send the header when
        opening a page; they hold nothing secret)."""
        if settings.api_key and request.url.path != "/":
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {settings.api_key}".encode()):
                raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")

    @asynccontextmanager
    async def lifespan(app):
        worker.start()
        yield
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="dyncomplete", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(check_key)])
    app.state.worker, app.state.prefix_cache = worker, prefix_cache
    app.add_middleware(Guard, limits=settings.limits, check_host=settings.check_host)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(ApiError)
    async def api_error(request, exc: ApiError):
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        return error_response(ApiError(exc.status_code, str(exc.detail), kind="invalid_request_error"))

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        # the log has the traceback; the client gets no message that could hold a path
        return error_response(ApiError(500, f"internal server error ({type(exc).__name__})", code="internal_error",
                                       kind="server_error"))

    @app.get("/")
    async def page():
        return FileResponse(STATIC / "index.html")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model.name, "method": settings.default_method, "methods": methods,
                "worker": worker.status(),
                "prefix_cache": {"entries": len(prefix_cache), "bytes": prefix_cache.nbytes,
                                 "max_bytes": prefix_cache.max_bytes, **vars(prefix_cache.counters)},
                "client_files": {"clients": len(client_files), "bytes": client_files.nbytes} if client_files else None,
                "ngram_cache": {"clients": len(client_history), "tokens": client_history.total_tokens}
                if client_history else None}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model.name, "object": "model", "created": 0, "owned_by": "dyncomplete",
            "num_layers": model.num_layers, "default_method": settings.default_method, "methods": methods,
            "method_families": known_families}]}

    def memory_of(request: Request, req: CompletionRequest) -> str | None:
        """The key of the sender's memory of files when the server and the request use it."""
        return sender(request) if client_files is not None and req.client_memory else None

    def warm(request: Request, req: CompletionRequest) -> None:
        """A cache-warming request holds no completion, but the files it sent are remembered."""
        if (key := memory_of(request, req)) is not None:
            context = clip_context(req.context, settings.context_budget)
            prefix, suffix, _ = clip_prompt(req.prefix, req.suffix, settings.context_budget)
            client_files.remember(key, context, prefix + (suffix or ""))

    async def start(request: Request, req: CompletionRequest):
        """Queue a parsed request; (job, next_event) where next_event(watch_disconnect) gives the
        worker's events ("text", delta), ("done", result) or ("error", ApiError)."""
        prefix, suffix, clipped = clip_prompt(req.prefix, req.suffix, settings.context_budget)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def emit(event):
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the event loop is gone (shutdown)
                pass

        job = Job(prefix, suffix, req.params, req.method, req.prefix_cache, client_scope(request, req.client_id),
                  time.perf_counter() + settings.request_timeout_s, emit, clipped,
                  clip_context(req.context, settings.context_budget), req.budget, memory_of(request, req),
                  sender(request) if client_history is not None and req.ngram_cache else None)
        req.prefix = req.suffix = req.context = None  # the clipped text is all that is kept
        try:
            worker.submit(job)
        except Busy:
            raise ApiError(503, f"server busy: {settings.queue_size} requests already queued, retry later",
                           code="queue_full", kind="server_error", headers={"Retry-After": "1"}) from None
        last_check = time.monotonic()

        async def next_event(watch_disconnect: bool):
            # checked by the clock, not only when no event comes: a non-streaming request also
            # receives a text event per token, often more than one per POLL_S
            nonlocal last_check
            while True:
                if watch_disconnect and time.monotonic() - last_check >= POLL_S:
                    last_check = time.monotonic()
                    if await request.is_disconnected():
                        job.cancel("disconnected")
                try:
                    return await asyncio.wait_for(events.get(), POLL_S)
                except asyncio.TimeoutError:
                    if job.cancelled() and job.reason == "timeout" and worker.current is not job and not job.finished:
                        return "error", ApiError(503, f"no answer within {settings.request_timeout_s:g} s "
                                                 "(queued too long)", code="timeout", kind="server_error")

        return job, next_event

    async def result_of(next_event) -> dict:
        """The "done" result of a job whose client waits for the whole answer."""
        while True:
            kind, value = await next_event(True)
            if kind == "error":
                raise value
            if kind == "done":
                return value

    async def streamed(job: Job, next_event, chunk, final, error_line, end: str = ""):
        """The response lines of a streaming job: chunk(delta) per text event, final(result) at the
        end, error_line(ApiError) for an error once the headers are sent (the first event is
        awaited before: an error there is a plain error response)."""
        first = await next_event(True)
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
                    event = await next_event(False)
                if end:
                    yield end
            finally:
                if not job.finished:
                    job.cancel("disconnected")

        return lines()

    async def parsed(request: Request, parse):
        obj = decode_body(await read_body(request, settings.max_body_bytes, settings.limits.body_timeout_s))
        return parse(obj)

    def ignored(req: CompletionRequest) -> dict:
        return {"ignored_fields": req.ignored_fields} if req.ignored_fields else {}

    def sse(lines):
        return StreamingResponse(lines, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def event(obj) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await parsed(request, lambda obj: parse_completion(
            obj, model.name, methods, settings.max_tokens_limit, request.headers.get("x-client-id")))
        stream, extra = req.stream, ignored(req)
        job, next_event = await start(request, req)
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def final(value, text=""):
            return completion_body(rid, created, model.name, text, finish_reason(value["stats"]["stopped_by"]),
                                   usage_of(value), {**value["stats"], **extra})

        if not stream:
            value = await result_of(next_event)
            return final(value, value["completion"].text)
        return sse(await streamed(
            job, next_event, lambda text: event(completion_body(rid, created, model.name, text, None)),
            lambda value: event(final(value)), lambda error: event(error.body()), "data: [DONE]\n\n"))

    @app.post("/infill")
    async def infill(request: Request):
        """llama.cpp's fill-in-the-middle endpoint (llama.vscode, llama.vim)."""
        req = await parsed(request, lambda obj: parse_infill(obj, model.name, methods, settings.max_tokens_limit))
        extra = ignored(req)
        if req.warm_only:
            warm(request, req)
            body = infill_final(model.name, req, settings.context_budget, "", None, extra)
            return sse(iter([event(body)])) if req.stream else body
        job, next_event = await start(request, req)
        if not req.stream:
            value = await result_of(next_event)
            return infill_final(model.name, req, settings.context_budget, value["completion"].text, value, extra)
        count = 0

        def chunk(text):
            nonlocal count
            count += 1
            return event(infill_chunk(text, count))

        return sse(await streamed(
            job, next_event, chunk,
            lambda value: event(infill_final(model.name, req, settings.context_budget, "", value, extra)),
            lambda error: event(error.body())))

    @app.post("/api/generate")
    async def generate(request: Request):
        """Ollama's generate endpoint with `suffix` (Continue's `ollama` provider); NDJSON stream."""
        started = time.perf_counter()
        req = await parsed(request, lambda obj: parse_generate(obj, model.name, methods, settings.max_tokens_limit,
                                                               settings.context_budget))
        extra, name = ignored(req), req.model

        def final(value, text=""):
            finish = finish_reason(value["stats"]["stopped_by"]) if value else "stop"
            return ollama_final(name, text, value, finish, started, extra)

        if req.warm_only:
            warm(request, req)
            body = final(None)
            return StreamingResponse(iter([json.dumps(body) + "\n"]), media_type=NDJSON) if req.stream else body
        job, next_event = await start(request, req)
        if not req.stream:
            value = await result_of(next_event)
            return final(value, value["completion"].text)
        lines = await streamed(job, next_event, lambda text: json.dumps(ollama_chunk(name, text)) + "\n",
                               lambda value: json.dumps(final(value)) + "\n",
                               lambda error: json.dumps({"error": error.message}) + "\n")
        return StreamingResponse(lines, media_type=NDJSON, headers={"Cache-Control": "no-cache"})

    @app.get("/api/tags")
    async def tags():
        return ollama_tags(model)

    @app.get("/api/version")
    async def version():
        return {"version": OLLAMA_VERSION}

    @app.post("/api/show")
    async def show(request: Request):
        await parsed(request, lambda obj: obj)
        return ollama_show(model, fim_tokens(model.tokenizer) is not None)

    return app
