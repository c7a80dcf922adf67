"""``vla-accel serve-openpi --engine ray``: a policy served over openpi's protocol as a Ray Serve
application, the observations of different robots decoded together.

The application is one deployment, :class:`OpenPIReplica`, with ``replicas`` copies, each holding the
policy (on ``num_gpus_per_replica`` GPUs where asked). It is its own FastAPI ingress: Ray Serve's HTTP
proxy routes each websocket connection (one robot) to one replica for the connection's whole life, so
that replica keeps the robot's :class:`~vla_accel_ros.runtime.runner.PolicyRunner` (Kalman filter,
token history, decoder state), keyed by a connection id, and drops it when the connection closes. A
new connection starts a new episode, as with :class:`~vla_accel_ros.runtime.openpi_server.OpenPIServer`.

Each request goes through ``@serve.batch``: the requests of the replica's connections that arrive
within ``batch_wait_ms`` (a batch is full at one request per connected robot, at most ``max_batch``)
are decoded in ONE :class:`~vla_accel_ros.runtime.fleet.FleetRunner` round (one batched prefill and
verify for all of them), each robot's rows over its own runner, so its tokens are those a lone
runner gives. One round runs at a time; the batches Serve hands over while it runs wait together
and make the next round (up to ``max_batch``), so robots that fell out of step are decoded together
again rather than in small rounds one after the other.

The wire protocol is :mod:`~vla_accel_ros.runtime.openpi_server`'s: the metadata first, then one
msgpack-numpy reply per observation with ``actions`` and ``server_timing`` (``infer_ms``,
``prev_total_ms``, and here ``batch_size``: how many robots the request's round decoded); a bad
request is answered by one text frame saying why and the close code 1011; ``GET /healthz`` answers
200. With an API key, a websocket without ``Authorization: Api-Key KEY`` is refused before it is
accepted, HTTP 401 with a body saying why (the check is ``serve-openpi``'s
:class:`~vla_accel_ros.runtime.openpi_server.ApiKeyCheck`; the replicas get the key's digest, never
the key). A replica with ``max_queue`` requests waiting already answers a further one at once with
the text frame ``busy: ...`` and closes with 1013 (try again later), rather than answering late.
``GET /stats`` reports the replica's rounds, batch sizes, connections and refusals (``unauthorized``:
handshakes refused for their key; ``busy``; ``refused``: bad requests).

Ray is imported by this module only; ``vla-accel serve-openpi`` imports it only with ``--engine ray``.
"""

# No ``from __future__ import annotations``: FastAPI reads the websocket endpoint's annotations at
# runtime, through the signature Ray Serve's ingress rewrites, and a string there is not resolved.
import asyncio
import math
import os
import socket
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import ray
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, PlainTextResponse
from openpi_client import msgpack_numpy
from ray import serve

from vla_accel_ros.models.openpi.config import API_KEY_SCHEME, CLOSE_TRY_AGAIN_LATER, PolicySpec
from vla_accel_ros.runtime.builder import RunnerConfig
from vla_accel_ros.runtime.openpi_server import (
    HEALTH_PATH,
    ApiKeyCheck,
    busy_answer,
    observation_from_request,
    refusal_body,
    request_image_size,
    result_reply,
    served_metadata,
)
from vla_accel_ros.runtime.ray_options import RayServeOptions

if TYPE_CHECKING:
    from vla_accel_ros.runtime.runner import PolicyRunner

APP_NAME = "vla_accel_openpi"
STATS_PATH = "/stats"
CLOSE_INTERNAL_ERROR = 1011
CLOSE_MESSAGE_TOO_BIG = 1009
# Each websocket is one of a replica's ongoing requests for its whole life: this bounds the robots
# one replica takes.
MAX_CONNECTIONS_PER_REPLICA = 256
# Serve's controller checks each replica this often (its default, 10 s, would leave a robot whose
# replica died waiting that long for a new one).
HEALTH_CHECK_PERIOD_S = 1.0
HEALTH_CHECK_TIMEOUT_S = 5.0
# Batches Serve may hand over while a round runs: they only join the requests waiting for the next
# round, which one task decodes at a time.
CONCURRENT_BATCHES = 16
_proxy_port: int | None = None  # the port of the Serve proxy this process started


class ServerBusyError(RuntimeError):
    """The replica holds its bound of waiting requests already."""


app = FastAPI()


@serve.deployment(name="openpi_policy", max_ongoing_requests=MAX_CONNECTIONS_PER_REPLICA,
                  health_check_period_s=HEALTH_CHECK_PERIOD_S, health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S)
@serve.ingress(app)
class OpenPIReplica:
    """One replica: the policy, a runner per connection, the batched rounds (module docstring)."""

    def __init__(self, config: dict[str, Any], spec: PolicySpec, metadata: dict[str, Any],
                 options: RayServeOptions, api_key: ApiKeyCheck | None = None) -> None:
        from vla_accel_ros.core.kinematics import ArmKinematics
        from vla_accel_ros.core.resources import default_urdf
        from vla_accel_ros.runtime.builder import build_runner

        self.config = RunnerConfig.from_json(config)
        self.kin = ArmKinematics(default_urdf())
        self.policy = build_runner(self.config, self.kin).policy  # loaded once; every connection's runner shares it
        self.spec = spec
        self.api_key = api_key
        self.serving = options
        self.max_opening = float(self.kin.gripper_limits.upper.max()) if self.kin.gripper_joint_names else 1.0
        self.image_size = request_image_size(self.policy)
        self.metadata = served_metadata(metadata, spec)
        self.runners: dict[str, PolicyRunner] = {}  # connection id -> that robot's runner
        self.pending: list[tuple[tuple[str, Any], asyncio.Future]] = []  # requests for the next round
        self.decoding: asyncio.Task | None = None  # the rounds in progress
        self.waiting = 0
        self.counts = {"rounds": 0, "decoded": 0, "largest_batch": 0, "connections": 0, "refused": 0, "busy": 0,
                       "unauthorized": 0}
        self.batch_sizes: dict[int, int] = {}  # round size -> rounds
        self._batching = cast(Any, self.decode_batch)  # serve.batch's wrapper; its typing lacks the setters
        self._batching.set_batch_wait_timeout_s(options.batch_wait_ms / 1e3)
        self._fit_batch()

    def _fit_batch(self) -> None:
        """A batch is full when every connected robot has its request in (a robot has one at a time),
        at most ``max_batch``: Serve hands it over then rather than after the whole wait."""
        self._batching.set_max_batch_size(max(1, min(self.serving.max_batch, len(self.runners))))

    @app.get(HEALTH_PATH)
    def health(self) -> PlainTextResponse:
        return PlainTextResponse("OK\n")

    @app.get(STATS_PATH)
    def stats(self) -> JSONResponse:
        return JSONResponse({**self.counts, "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                             "open_connections": len(self.runners), "waiting": self.waiting,
                             "replica_pid": os.getpid()})

    @app.websocket("/")
    async def connect(self, websocket: WebSocket) -> None:
        from vla_accel_ros.runtime.builder import build_runner

        why = self.api_key.refusal(websocket.headers.getlist("authorization")) if self.api_key is not None else ""
        if why:
            self.counts["unauthorized"] += 1
            await websocket.send_denial_response(PlainTextResponse(
                refusal_body(why), status_code=401, headers={"WWW-Authenticate": API_KEY_SCHEME}))
            return
        await websocket.accept()
        connection = uuid.uuid4().hex
        runner = build_runner(self.config, self.kin, policy=self.policy)
        runner.start_episode()
        self.runners[connection] = runner
        self._fit_batch()
        self.counts["connections"] += 1
        packer = msgpack_numpy.Packer()
        try:
            await websocket.send_bytes(packer.pack(self.metadata))
            await self._serve_connection(websocket, connection, packer)
        except WebSocketDisconnect:
            pass
        finally:
            del self.runners[connection]
            self._fit_batch()

    async def _serve_connection(self, websocket: WebSocket, connection: str, packer: msgpack_numpy.Packer) -> None:
        previous_total_ms: float | None = None
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            start = time.monotonic()
            data = message.get("bytes")
            if data is not None and len(data) > self.spec.max_message_bytes:
                await websocket.close(CLOSE_MESSAGE_TOO_BIG, "message too big")
                return
            if self.waiting >= self.serving.queue_bound:
                self.counts["busy"] += 1
                await self._refuse(websocket, ServerBusyError(busy_answer(self.waiting, self.serving.queue_bound)),
                                   CLOSE_TRY_AGAIN_LATER)
                return
            self.waiting += 1
            try:
                if data is None:
                    raise ValueError("a request must be a binary msgpack message, got a text frame")
                reply = await self.decode_batch((connection, msgpack_numpy.unpackb(data)))
                if isinstance(reply, Exception):
                    raise reply
            except Exception as error:  # a bad request or a failing policy: say why, then close
                self.counts["refused"] += 1
                await self._refuse(websocket, error, CLOSE_INTERNAL_ERROR)
                return
            finally:
                self.waiting -= 1
            timing = {"infer_ms": (time.monotonic() - start) * 1e3, "batch_size": reply.pop("batch_size")}
            if previous_total_ms is not None:
                timing["prev_total_ms"] = previous_total_ms
            reply["server_timing"] = timing
            await websocket.send_bytes(packer.pack(reply))
            previous_total_ms = (time.monotonic() - start) * 1e3

    @staticmethod
    async def _refuse(websocket: WebSocket, error: Exception, code: int) -> None:
        text = str(error) if isinstance(error, ServerBusyError) else f"{type(error).__name__}: {error}"
        try:
            await websocket.send_text(text)
            await websocket.close(code, "request refused; the reason is in the previous frame")
        except (WebSocketDisconnect, RuntimeError):  # the client left first
            pass

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005, max_concurrent_batches=CONCURRENT_BATCHES)
    async def decode_batch(self, requests: list[tuple[str, Any]]) -> list[dict[str, Any] | Exception]:
        """The replies to a batch of (connection, request) (a bad request gets its ValueError). The
        batch joins the requests waiting for the next round: a batch Serve cuts while a round runs
        is decoded with the others that arrived meanwhile, in one round."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in requests]
        self.pending.extend(zip(requests, futures, strict=True))
        if self.decoding is None or self.decoding.done():
            self.decoding = asyncio.create_task(self._decode_pending())
        return list(await asyncio.gather(*futures))

    async def _decode_pending(self) -> None:
        """Rounds over the waiting requests, at most ``max_batch`` each, until none waits."""
        while self.pending:
            taken = self.pending[: self.serving.max_batch]
            del self.pending[: len(taken)]
            try:
                replies = await asyncio.to_thread(self._decode, [request for request, _ in taken])
            except Exception as error:  # _decode answers a failing round itself; this is anything else
                replies = [error] * len(taken)
            for (_, future), reply in zip(taken, replies, strict=True):
                future.set_result(reply)

    def _decode(self, requests: list[tuple[str, Any]]) -> list[dict[str, Any] | Exception]:
        from vla_accel_ros.runtime.fleet import FleetRunner

        replies: list[dict[str, Any] | Exception] = []
        ready: list[tuple[int, str, Any]] = []
        for index, (connection, request) in enumerate(requests):
            try:
                obs = observation_from_request(request, self.spec, self.kin.n, self.max_opening, self.image_size)
                ready.append((index, connection, obs))
                replies.append({})
            except ValueError as error:
                replies.append(error)
        while ready:  # a connection has one request in flight; a second one would wait for the next round
            seen: set[str] = set()
            round_: list[tuple[int, str, Any]] = []
            later: list[tuple[int, str, Any]] = []
            for item in ready:
                (later if item[1] in seen else round_).append(item)
                seen.add(item[1])
            try:
                fleet = FleetRunner([self.runners[connection] for _, connection, _ in round_])
                results = fleet.step([(k, obs) for k, (_, _, obs) in enumerate(round_)])
            except Exception as error:  # a failing policy: every request of the round is told why
                for index, _, _ in round_:
                    replies[index] = error
            else:
                for (index, _, _), result in zip(round_, results, strict=True):
                    replies[index] = {**result_reply(result, self.spec), "batch_size": len(round_)}
                self.counts["rounds"] += 1
                self.counts["decoded"] += len(round_)
                self.counts["largest_batch"] = max(self.counts["largest_batch"], len(round_))
                self.batch_sizes[len(round_)] = self.batch_sizes.get(len(round_), 0) + 1
            ready = later
        return replies


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (Ray's proxy needs a number, not 0)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def start(config: RunnerConfig, spec: PolicySpec, metadata: dict[str, Any], options: RayServeOptions, *,
          host: str, port: int, api_key: ApiKeyCheck | None = None) -> int:
    """Deploy the application on Ray (the cluster at ``options.address``, else a local one started
    here, unless this process has one already) with its proxy on ``host``:``port`` (0: a free one);
    returns the proxy's port. ``api_key``: refuse connections without it (None: take any). A second
    call in the same process replaces the application and keeps the proxy where it is. The
    checkpoint is resolved here (ValueError naming the file at fault), so a replica's host needs
    the same path."""
    from vla_accel_ros.models.load import resolve_checkpoint

    global _proxy_port
    if config.resolved is None:
        config = replace(config, resolved=resolve_checkpoint(config.checkpoint_ref, unnorm_key=config.unnorm_key))
    if options.num_gpus_per_replica > 0 and not config.device:
        config = replace(config, device="cuda")  # Ray shows each replica its own GPUs
    if not ray.is_initialized():
        if options.address:
            ray.init(address=options.address, log_to_driver=False)
        else:
            cpus = max(os.cpu_count() or 1, math.ceil(options.replicas * options.cpus_per_replica))
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    if _proxy_port is None:
        _proxy_port = port or free_port(host)
        serve.start(http_options={"host": host, "port": _proxy_port})
    deployment = cast(Any, OpenPIReplica).options(
        num_replicas=options.replicas,
        ray_actor_options={"num_cpus": options.cpus_per_replica, "num_gpus": options.num_gpus_per_replica})
    serve.run(deployment.bind(config.to_json(), spec, metadata, options, api_key), name=APP_NAME, route_prefix="/",
              blocking=False)
    return _proxy_port


def stop() -> None:
    """Stop Serve: the application, its replicas and the proxy (the Ray stays for its caller)."""
    global _proxy_port
    serve.shutdown()
    _proxy_port = None


def replica_actors() -> list[Any]:
    """The handles of the application's replica actors (``ray.kill`` one to see Serve replace it)."""
    return [ray.get_actor(a["name"], namespace=a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"SERVE_REPLICA::{APP_NAME}#")]
