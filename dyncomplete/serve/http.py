"""The HTTP layer under the app: limits on connections, request heads and bodies, and the Host check.

uvicorn's h11 protocol bounds an incomplete request head (`h11_max_incomplete_event_size`) and
closes idle keep-alive connections, but it has no deadline for a request head that trickles in
(slowloris), no cap on connections that answers in JSON, and it answers a malformed request in
plain text. `protocol_class` adds those to it; `Guard` (an ASGI middleware) refuses a head with
too many or too large fields and, on a loopback server, a `Host` that is not a loopback name
(DNS rebinding: a web page whose name resolves to 127.0.0.1 must not reach the API). Every
refusal is an OpenAI-style JSON error. The server always runs this h11 protocol, also where
`uvicorn[standard]` installed httptools, so the limits are the same everywhere.
"""

from __future__ import annotations

import asyncio
import http
import ipaddress
import json
import logging
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from .request import ApiError, decode_body

log = logging.getLogger("dyncomplete.serve")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float = 5.0  # from connecting (or the end of the last response) to a whole request head
    body_timeout_s: float = 10.0  # from the head to the whole body (at most the body cap, 2 MiB)
    keep_alive_s: int = 5  # an idle keep-alive connection is closed after this
    max_header_bytes: int = 16 * 1024  # the request line and every header field together
    max_headers: int = 100
    max_connections: int = 256  # open connections; one more is answered 503 and closed


def is_loopback(host: str) -> bool:
    """Whether a listening address reaches only this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_allowed(value: str) -> bool:
    """A `Host` header naming this machine's loopback interface, with any port."""
    value = value.strip().lower()
    if value.endswith("]") or ":" not in value:  # no port ("[::1]" holds colons of its own)
        return value in LOOPBACK_NAMES
    name, _, port = value.rpartition(":")
    return port.isdigit() and name in LOOPBACK_NAMES


def raw_json_response(error: ApiError) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for the protocol to write by itself."""
    body = json.dumps(error.body()).encode()
    head = (f"HTTP/1.1 {error.status} {http.HTTPStatus(error.status).phrase}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def protocol_class(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for the request head, a connection cap and JSON
    answers to malformed requests."""

    class GuardedH11Protocol(H11Protocol):
        _head_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                log.warning("refused a connection: %d open", len(self.connections) - 1)
                self._refuse(ApiError(503, f"too many connections (over {limits.max_connections})",
                                      code="too_many_connections", kind="server_error"))
                return
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            scope = self.scope
            super().handle_events()
            if self.scope is not scope:  # a whole request head arrived
                self._disarm()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._arm()  # the next request's head gets the same deadline (disarmed at once if pipelined)
            super().on_response_complete()

        def send_400_response(self, msg: str) -> None:
            buffered = len(self.conn.trailing_data[0])
            if buffered > limits.max_header_bytes:
                error = ApiError(431, f"request head over {limits.max_header_bytes} bytes", code="headers_too_large")
            else:
                error = ApiError(400, "malformed HTTP request", code="bad_http")
            if self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete:
                self.transport.close()  # a response is under way: nothing more can be said
            else:
                self._refuse(error)

        def _refuse(self, error: ApiError) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(raw_json_response(error))
                self.transport.close()

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self.conn.trailing_data[0]:  # part of a head: say why before closing
                self._refuse(ApiError(408, f"the request head did not arrive within {limits.header_timeout_s:g} s",
                                      code="request_timeout"))
            else:  # an idle connection: close it quietly, as the keep-alive timeout does
                self.transport.close()

    return GuardedH11Protocol


class Guard:
    """ASGI middleware: header count and size, and (loopback servers) the Host check."""

    def __init__(self, app, limits: Limits, check_host: bool):
        self.app, self.limits, self.check_host = app, limits, check_host

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            error = self.refusal(scope)
            if error is not None:
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope) -> ApiError | None:
        headers = scope["headers"]
        if len(headers) > self.limits.max_headers:
            return ApiError(431, f"more than {self.limits.max_headers} header fields", code="headers_too_large")
        if sum(len(k) + len(v) + 4 for k, v in headers) > self.limits.max_header_bytes:
            return ApiError(431, f"request head over {self.limits.max_header_bytes} bytes", code="headers_too_large")
        if self.check_host:
            hosts = [v.decode("latin-1") for k, v in headers if k == b"host"]
            if len(hosts) != 1 or not host_allowed(hosts[0]):
                shown = json.dumps(hosts[0][:80]) if hosts else "none"
                return ApiError(403, f"Host {shown} is not allowed: this server listens on loopback and answers "
                                f"only to {', '.join(LOOPBACK_NAMES)} (any port)", code="host_not_allowed")
        return None


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


async def read_json(request: Request, max_bytes: int, limits: Limits) -> dict:
    """The request's body decoded to a JSON object (400 otherwise)."""
    return decode_body(await read_body(request, max_bytes, limits.body_timeout_s))


def run_server(app, host: str, port: int, log_level: str, limits: Limits) -> None:
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, http=protocol_class(limits), ws="none", lifespan="on",
        timeout_keep_alive=limits.keep_alive_s, h11_max_incomplete_event_size=limits.max_header_bytes,
        proxy_headers=False,  # the peer address scopes client ids: never take it from X-Forwarded-For
        server_header=False)
    uvicorn.Server(config).run()
