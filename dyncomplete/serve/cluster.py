"""`dyncomplete serve --ray ADDRESS`: the same HTTP API on a Ray cluster, with Ray Serve.

- `Engine`, N replicas (or autoscaled on ongoing requests): each loads the model and runs
  `create_app`'s app, the one a single server runs, with its own prefix cache, file memory and
  n-gram history.
- `Front`, one replica that reserves no CPU: Ray Serve's HTTP ingress. It carries each request
  to an `Engine` replica (`forward.py`) and streams the answer back; it answers `/health` with the
  replicas' states itself.
- `EditorAffinityRouter`, Ray Serve's request-router API on `Engine`'s handle: each editor
  (`jobs.editor_of`: sender, key and X-Client-Id) keeps a home replica, so that its caches stay
  useful. A new editor's home is the first replica in its rendezvous order (a hash of its key
  over the running replicas) that holds fewer than its share of the active editors (consistent
  hashing with bounded loads), so editors spread evenly and only a lost replica's editors move.
  A full home replica (running and queued requests where the single server answers 503) sends
  the request to the less loaded of the editor's next two choices.
- A replica that dies before the first byte of an answer has gone out: the request is sent once
  more, to another replica.
- Each replica exports `metrics.py`'s figures through Ray's metrics agent (Prometheus, tagged
  with the replica).
"""

import asyncio
import collections
import hashlib
import logging
import math
import signal
import sys
import time

import ray
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from . import metrics
from .app import create_app, error_response, require_key
from .forward import REPLICA_HEADER, ForwardedRequest, forwarded, run_asgi
from .request import ApiError
from .state import Settings

log = logging.getLogger("ray.serve")  # Ray Serve's replica log, where operators look
APP_NAME = "dyncomplete"
ROUTERS = {"editor": "dyncomplete.serve.cluster:EditorAffinityRouter",
           "ray-default": None}  # Ray Serve's own: the less loaded of two random replicas
REPLICA_LOST = (RayActorError, ActorUnavailableError)
ACTIVE_S = 600.0  # an editor silent this long no longer counts toward its home's share


def rendezvous(key: str, replicas: list[RunningReplica]) -> list[RunningReplica]:
    """The replicas in the key's order of preference: highest hash of (key, replica) first, so a
    replica's loss or arrival moves only the keys whose first choice it is."""
    def weight(replica: RunningReplica) -> bytes:
        return hashlib.blake2b(f"{key}|{replica.replica_id.unique_id}".encode(), digest_size=8).digest()
    return sorted(replicas, key=weight, reverse=True)


def assign_home(editor: str, order: list[str], homes: dict[str, str]) -> str:
    """The editor's home among `order` (its rendezvous order of the running replicas' ids): the
    one it has if that still runs and holds no more than share = ceil(active editors / replicas)
    of the editors in `homes` (editor -> replica id) with it, else the first in its order holding
    fewer than the share. So editors leave a lost replica, and an over-full one when replicas are
    added (autoscaling), one cold prompt each, until each replica holds its share."""
    share = math.ceil(len({*homes, editor}) / len(order))
    held = collections.Counter(home for other, home in homes.items() if other != editor)
    current = homes.get(editor)
    if current in order and held[current] < share:
        return current
    return next(replica for replica in order if held[replica] < share)


class EditorAffinityRouter(RequestRouter):
    """Home replica first (`assign_home`); when it is full, the less loaded of the editor's next
    two choices (Ray Serve tries the ranks in order and takes the least loaded replica of a rank
    that has room), so an editor that spills keeps going to the same few replicas and warms
    their caches. Runs in the front's event loop: one request at a time reaches it."""

    def initialize_state(self, **kwargs):
        self.homes: dict[str, str] = {}  # active editor -> its home replica's id
        self.last_seen: dict[str, float] = {}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        request = pending_request.args[0] if pending_request and pending_request.args else None
        if not isinstance(request, ForwardedRequest):
            return [candidate_replicas]
        now = time.monotonic()
        for editor in [e for e, seen in self.last_seen.items() if now - seen > ACTIVE_S]:
            del self.last_seen[editor], self.homes[editor]
        order = rendezvous(request.editor, candidate_replicas)
        by_id = {replica.replica_id.unique_id: replica for replica in order}
        home = assign_home(request.editor, list(by_id), self.homes)
        self.homes[request.editor], self.last_seen[request.editor] = home, now
        others = [replica for replica in order if replica.replica_id.unique_id != home]
        return [[by_id[home]], others[:2]]


class ExportedMetrics:
    """`metrics.py`'s figures as Ray Serve metrics (tagged with deployment and replica);
    counters advance by what their totals grew since the last update."""

    def __init__(self):
        from ray.serve.metrics import Counter, Gauge

        self.meters = {name: (Counter if kind == "counter" else Gauge)(name, description=text)
                       for name, (kind, text, _) in metrics.METRICS.items()}
        self.last = dict.fromkeys(metrics.METRICS, 0.0)

    def update(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            if metrics.METRICS[name][0] == "counter":
                if value > self.last[name]:
                    self.meters[name].inc(value - self.last[name])
            else:
                self.meters[name].set(value)
            self.last[name] = value


class Engine:
    """One replica: the model and the single-server app around it."""

    async def __init__(self, model_options: dict, settings: Settings, threads: int):
        import torch

        from ..models import load

        torch.set_num_threads(threads)
        self.app = create_app(load(**model_options), settings)
        self.lifespan = self.app.router.lifespan_context(self.app)
        await self.lifespan.__aenter__()  # starts the worker, as uvicorn would
        self.replica = serve.get_replica_context().replica_id.unique_id.encode()
        self.exported = ExportedMetrics()
        self.exported.update(metrics.values(self.app.state.server))

    async def __call__(self, request: ForwardedRequest):
        """The app's messages; the answer's head names this replica (X-Dyncomplete-Replica)."""
        try:
            async for message in run_asgi(self.app, request):
                if message["type"] == "http.response.start":
                    message = message | {"headers": [*message["headers"], (REPLICA_HEADER.encode(), self.replica)]}
                yield message
        finally:
            self.exported.update(metrics.values(self.app.state.server))

    def check_health(self) -> None:
        if not self.app.state.server.worker.alive():
            raise RuntimeError("a worker thread has stopped")

    def __del__(self):  # Ray Serve's graceful stop of a replica (also of one whose start failed)
        if hasattr(self, "app"):
            self.app.state.server.worker.stop()


front = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@serve.ingress(front)
class Front:
    """The HTTP ingress: every route of the single server, carried to a replica."""

    def __init__(self, engine, settings: Settings):
        self.engine, self.settings = engine, settings

    @front.get("/health")
    async def health(self, request: Request):
        try:
            require_key(request, self.settings.api_key)
        except ApiError as exc:
            return error_response(exc)
        status = await asyncio.to_thread(serve.status)  # a call to Ray's controller: not in the event loop
        deployment = status.applications[APP_NAME].deployments["Engine"]
        return {"status": "ok", "cluster": True, "replicas": {str(state): n for state, n in
                                                              deployment.replica_states.items()}}

    @front.get("/metrics")
    async def metrics_are_per_replica(self):
        return error_response(ApiError(404, "on a cluster each replica's figures are exported by Ray's metrics agent "
                                            "on its node (ray_dyncomplete_*; see docs/serving.md)", code="not_found"))

    @front.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
    async def forward(self, request: Request):
        try:
            carried = await forwarded(request, self.settings.max_body_bytes)
            return await self.answer(carried)
        except ApiError as exc:
            return error_response(exc)
        except Exception as exc:  # as the single server answers one: JSON, the type only (Ray's log has the rest)
            return error_response(ApiError(500, f"internal server error ({type(exc).__name__})", code="internal_error",
                                           kind="server_error"))

    async def answer(self, request: ForwardedRequest) -> Response:
        """The replica's answer; sent again to another replica once if the first one is lost
        before the answer's first body chunk."""
        for attempt in range(2):
            messages = self.engine.options(stream=True).remote(request)
            try:
                start = await messages.__anext__()
                first = await messages.__anext__()
                break
            except REPLICA_LOST as exc:
                log.warning("%s %s: its replica was lost (%s)%s", request.method, request.path, type(exc).__name__,
                            "" if attempt else "; sent again to another replica")
                if attempt:
                    raise ApiError(503, "the model replica was lost twice; try again", code="replica_lost",
                                   kind="server_error") from None
        if not first.get("more_body"):
            response = Response(first.get("body", b""), status_code=start["status"])
        else:
            async def rest():
                yield first.get("body", b"")
                async for message in messages:
                    yield message.get("body", b"")
            response = StreamingResponse(rest(), status_code=start["status"])
        response.raw_headers = list(start["headers"])
        return response


def deploy(address: str, replicas: int, max_replicas: int, routing: str, model_options: dict,
           settings: Settings, host: str, port: int, threads: int) -> None:
    """Run the application on the cluster at `address` until interrupted, then delete it."""
    ray.init(address=address, logging_level="ERROR")
    router = ROUTERS[routing]
    options = ({"num_replicas": replicas} if max_replicas <= replicas else
               {"autoscaling_config": {"min_replicas": replicas, "max_replicas": max_replicas,
                                       "target_ongoing_requests": settings.parallel}})
    if router:
        options["request_router_config"] = {"request_router_class": router}
    # a replica is full when the single server would refuse: its slots busy and its queue full
    engine = serve.deployment(Engine, ray_actor_options={"num_cpus": threads},
                              max_ongoing_requests=settings.parallel + settings.queue_size, health_check_period_s=5,
                              **options)
    ingress = serve.deployment(Front, num_replicas=1, ray_actor_options={"num_cpus": 0})
    serve.start(http_options={"host": host, "port": port})
    serve.run(ingress.bind(engine.bind(model_options, settings, threads), settings), name=APP_NAME, route_prefix="/")
    print(f"dyncomplete: serving on http://{host}:{port} through Ray Serve at {address}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated server deletes its application too
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(APP_NAME)
