"""The server's own routes: the playground page, `/health`, `/metrics` (Prometheus), and OpenAI's `/v1/models`,
`/v1/completions` and `/v1/chat/completions` (one completion, whole or as server-sent events
ending in `[DONE]`)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, PlainTextResponse

from . import metrics
from .chat import chat_body, chat_chunk, openai_body, parse_chat
from .http import read_json
from .jobs import answer
from .report import finish_reason
from .request import ApiError, parse_completion
from .state import server_of
from .stream import sse_event, sse_response

STATIC = Path(__file__).parent / "static"

router = APIRouter()


def completion_body(rid: str, created: int, model: str, text: str, finish: str | None, usage=None, stats=None):
    return openai_body("text_completion", rid, created, model, {"text": text, "finish_reason": finish}, usage, stats)


def usage_of(result: dict) -> dict:
    s = result["completion"].stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.new_tokens,
            "total_tokens": s.prompt_tokens + s.new_tokens}


@router.get("/")
async def page():
    return FileResponse(STATIC / "index.html")


@router.get("/health")
async def health(request: Request):
    server = server_of(request)
    cache, files, history = server.prefix_cache, server.client_files, server.client_history
    return {"status": "ok", "model": server.model.name, "method": server.settings.default_method,
            "methods": server.methods, "worker": server.worker.status(),
            "prefix_cache": {"entries": len(cache), "bytes": cache.nbytes, "max_bytes": cache.max_bytes,
                             **vars(cache.counters)},
            "client_files": {"clients": len(files), "bytes": files.nbytes} if files else None,
            "ngram_cache": {"clients": len(history), "tokens": history.total_tokens} if history else None}


@router.get("/metrics")
async def prometheus_metrics(request: Request):
    return PlainTextResponse(metrics.prometheus_text(server_of(request)), media_type="text/plain; version=0.0.4")


@router.get("/v1/models")
async def models(request: Request):
    server = server_of(request)
    model = server.model
    return {"object": "list", "data": [{
        "id": model.name, "object": "model", "created": 0, "owned_by": "dyncomplete",
        "num_layers": model.num_layers, "default_method": server.settings.default_method, "methods": server.methods,
        "method_families": server.method_families}]}


@router.post("/v1/completions")
async def completions(request: Request):
    server = server_of(request)
    settings, name = server.settings, server.model.name
    obj = await read_json(request, settings.max_body_bytes, settings.limits)
    req = parse_completion(obj, name, server.methods, settings.max_tokens_limit, request.headers.get("x-client-id"))
    extra, rid, created = req.ignored(), f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())

    def final(value, text=""):
        return completion_body(rid, created, name, text, finish_reason(value["stats"]["stopped_by"]),
                               usage_of(value), {**value["stats"], **extra})

    return await answer(server, request, req, final, lambda text: completion_body(rid, created, name, text, None),
                        ApiError.body, sse_event, sse_response, "data: [DONE]\n\n")


def render_chat(tokenizer):
    if not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "this model has no chat template: use /v1/completions", "messages", "no_chat_template")
    return lambda turns: tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    server = server_of(request)
    settings, name = server.settings, server.model.name
    obj = await read_json(request, settings.max_body_bytes, settings.limits)
    req = parse_chat(obj, name, server.methods, settings.max_tokens_limit, render_chat(server.model.tokenizer),
                     request.headers.get("x-client-id"))
    extra, rid, created = req.ignored(), f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

    def final(value, text=None):  # the whole answer (text given), or a stream's last chunk
        finish, usage, stats = finish_reason(value["stats"]["stopped_by"]), usage_of(value), {**value["stats"], **extra}
        if text is None:
            return chat_chunk(rid, created, name, {}, finish, usage, stats)
        return chat_body(rid, created, name, text, finish, usage, stats)

    return await answer(server, request, req, final,
                        lambda text: chat_chunk(rid, created, name, {"role": "assistant", "content": text}),
                        ApiError.body, sse_event, sse_response, "data: [DONE]\n\n")
