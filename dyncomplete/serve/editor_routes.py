"""The editor plugins' routes (bodies and answers in `editors.py`): llama.cpp's `/infill`, whose
stream is server-sent events without `[DONE]`, and Ollama's `/api/generate` (an NDJSON stream by
default), `/api/tags`, `/api/version` and `/api/show`. A cache-warming request is answered at once,
without a job."""

from __future__ import annotations

import itertools
import time

from fastapi import APIRouter, Request

from ..engine.prompts import fim_tokens
from .editors import (OLLAMA_VERSION, infill_chunk, infill_final, ollama_chunk, ollama_final, ollama_show,
                      ollama_tags, only_fields, parse_generate, parse_infill, response_fields)
from .http import read_json
from .jobs import answer
from .report import finish_reason
from .request import ApiError
from .state import server_of
from .stream import ndjson_line, ndjson_response, sse_event, sse_response

router = APIRouter()


@router.post("/infill")
async def infill(request: Request):
    """llama.cpp's fill-in-the-middle endpoint (llama.vscode, llama.vim)."""
    server = server_of(request)
    settings, name = server.settings, server.model.name
    obj = await read_json(request, settings.max_body_bytes, settings.limits)
    req = parse_infill(obj, name, server.methods, settings.max_tokens_limit)
    extra, count, fields = req.ignored(), itertools.count(1), response_fields(obj)

    def final(value, text=""):
        return only_fields(fields, infill_final(name, req, settings.context_budget, text, value, extra))

    return await answer(server, request, req, final, lambda text: infill_chunk(text, next(count)), ApiError.body,
                        sse_event, sse_response)


@router.post("/api/generate")
async def generate(request: Request):
    """Ollama's generate endpoint with `suffix` (Continue's `ollama` provider)."""
    started = time.perf_counter()
    server = server_of(request)
    settings = server.settings
    obj = await read_json(request, settings.max_body_bytes, settings.limits)
    req = parse_generate(obj, server.model.name, server.methods, settings.max_tokens_limit, settings.context_budget)
    extra, name = req.ignored(), req.model

    def final(value, text=""):
        finish = finish_reason(value["stats"]["stopped_by"]) if value else "stop"
        return ollama_final(name, text, value, finish, started, extra)

    return await answer(server, request, req, final, lambda text: ollama_chunk(name, text),
                        lambda exc: {"error": exc.message}, ndjson_line, ndjson_response)


@router.get("/api/tags")
async def tags(request: Request):
    return ollama_tags(server_of(request).model)


@router.get("/api/version")
async def version():
    return {"version": OLLAMA_VERSION}


@router.post("/api/show")
async def show(request: Request):
    server = server_of(request)
    await read_json(request, server.settings.max_body_bytes, server.settings.limits)
    return ollama_show(server.model, fim_tokens(server.model.tokenizer) is not None)
