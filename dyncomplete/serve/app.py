"""The HTTP API (OpenAI's `/v1/completions` shape in `routes.py`; llama.cpp's `/infill` and
Ollama's `/api/generate` for the editor plugins in `editor_routes.py`) and the playground page, on
FastAPI.

Handlers only check input and talk to the `Worker`: every bad request is refused before it takes a
queue slot (`jobs.py` turns a parsed request into the worker's job), and the event loop never
touches the model (`stream.py` carries a job's events between the worker thread and the request).
Every error, an unexpected one included, is an OpenAI-style JSON body; `http.py` holds the limits
below the app (connections, request heads and bodies, Host).
"""

from __future__ import annotations

import asyncio
import hmac
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import editor_routes, routes
from .http import Guard
from .request import ApiError
from .state import Server, Settings, server_of


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def require_key(request: Request, api_key: str | None) -> None:
    """401 unless the request presents `api_key` as its bearer token (none set: every request passes)."""
    given = request.headers.get("authorization", "")
    if api_key and not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")


def check_key(request: Request):
    """Every route but the page and its static files (a browser cannot send the header when
    opening a page; they hold nothing secret)."""
    if request.url.path != "/":
        require_key(request, server_of(request).settings.api_key)


async def api_error(request, exc: ApiError):
    return error_response(exc)


async def http_error(request, exc: StarletteHTTPException):
    return error_response(ApiError(exc.status_code, str(exc.detail), kind="invalid_request_error"))


async def unexpected(request, exc: Exception):
    # the log has the traceback; the client gets no message that could hold a path
    return error_response(ApiError(500, f"internal server error ({type(exc).__name__})", code="internal_error",
                                   kind="server_error"))


def create_app(model, settings: Settings) -> FastAPI:
    """Build every allowed method now (ValueError on a bad one) and the app around them."""
    server = Server(model, settings)

    @asynccontextmanager
    async def lifespan(app):
        server.worker.start()
        yield
        await asyncio.to_thread(server.worker.stop)

    app = FastAPI(title="dyncomplete", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(check_key)])
    app.state.server = server
    app.add_middleware(Guard, limits=settings.limits, check_host=settings.check_host)
    app.mount("/static", StaticFiles(directory=routes.STATIC), name="static")
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
    app.include_router(routes.router)
    app.include_router(editor_routes.router)
    return app
