"""An HTTP request carried from the cluster's front deployment to a model replica, and played
there against the replica's own app (`create_app`'s, unchanged) as one ASGI call.

The replica streams back the app's ASGI messages as they are sent, so a streamed answer stays
streamed; when the caller stops reading (the editor hung up, or a newer request superseded this
one), the app sees `http.disconnect`, as it does from a socket, and cancels the job."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import Request

from .jobs import editor_of
from .request import ApiError

REPLICA_HEADER = "x-dyncomplete-replica"  # the replica that answered, on every answer of `serve --ray`


@dataclass(frozen=True)
class ForwardedRequest:
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    client: tuple[str, int] | None
    editor: str  # whose memories the request uses (jobs.editor_of): the router's affinity key


async def forwarded(request: Request, max_body_bytes: int) -> ForwardedRequest:
    """The request as received by the front deployment; a body over the cap is refused (413)
    before it is read whole."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_body_bytes:
            raise ApiError(413, f"request body over {max_body_bytes} bytes", code="body_too_large")
    client = (request.client.host, request.client.port) if request.client else None
    return ForwardedRequest(request.method, request.url.path, request.url.query.encode(), list(request.headers.raw),
                            bytes(body), client, editor_of(request))


async def run_asgi(app, request: ForwardedRequest) -> AsyncIterator[dict]:
    """The app's ASGI messages for the request (`http.response.start`, then body chunks), as the
    app sends them; closing the iterator disconnects the request."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
             "method": request.method, "path": request.path, "raw_path": request.path.encode(),
             "query_string": request.query, "root_path": "", "headers": request.headers,
             "client": request.client, "server": None}
    sent: asyncio.Queue[dict] = asyncio.Queue()
    hung_up = asyncio.Event()
    body_given = False

    async def receive() -> dict:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await hung_up.wait()
        return {"type": "http.disconnect"}

    call = asyncio.create_task(app(scope, receive, sent.put))
    try:
        while True:
            message = asyncio.create_task(sent.get())
            await asyncio.wait({message, call}, return_when=asyncio.FIRST_COMPLETED)
            if not message.done():  # the app returned: what it sent is already in the queue
                message.cancel()
                call.result()  # its exception, if it failed
                while not sent.empty():
                    yield sent.get_nowait()
                return
            yield message.result()
            if message.result()["type"] == "http.response.body" and not message.result().get("more_body"):
                return
    finally:  # the app sees the hang-up and ends the call on its own; its outcome is read, not awaited
        hung_up.set()
        call.add_done_callback(lambda task: task.cancelled() or task.exception())
