"""Our policies behind openpi's policy-server protocol (``vla-accel serve-openpi``).

The protocol, as openpi's clients speak it: on connecting, the client receives one binary message,
the server's metadata; then, for each binary message it sends (an observation dict), it receives
one binary message: the action dict, ``actions`` (H x 7) and ``server_timing`` (``infer_ms``, and
``prev_total_ms``, the previous request's whole cycle). Every message is packed with openpi-client's
msgpack-numpy. A request that cannot be served is answered by one text frame saying why, then the
server closes the connection (code 1011), as openpi's own server does. ``GET /healthz`` answers 200.
A message larger than the spec's ``max_message_bytes`` closes the connection (code 1009) unread.

With an API key (:class:`ApiKeyCheck`, ``--api-key-file`` / ``--api-key-env``), a connection without
the header ``Authorization: Api-Key KEY`` is refused at the handshake: HTTP 401, its body saying why,
counted in ``unauthorized``; ``/healthz`` stays open. With a queue bound (``max_queue``), a request
that finds that many requests in flight already is answered at once by a text frame ``busy: ...``
and the close code 1013 (try again later), counted in ``busy``. The Ray engine
(:mod:`vla_accel_ros.runtime.ray_serve`) makes the same check and the same answer.

Each connection is a new episode of the runner (its history, filter and decoder state start over
before its first request is decoded); one request is decoded at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from openpi_client import msgpack_numpy
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.openpi.config import (
    API_KEY_SCHEME,
    BUSY_PREFIX,
    PART_WIDTH,
    PolicySpec,
    gripper_from_ours,
    gripper_to_ours,
)

if TYPE_CHECKING:
    from vla_accel_ros.decoding.protocol import DecodeResult
    from vla_accel_ros.models.api import PolicyLike
    from vla_accel_ros.runtime.runner import PolicyRunner

log = logging.getLogger(__name__)
HEALTH_PATH = "/healthz"


class ApiKeyCheck:
    """A server's API key: which connections it refuses, and why (both engines). It keeps only the
    key's SHA-256 digest, and compares digests in constant time (``hmac.compare_digest``), so the
    time of a refusal says nothing of how much of a key was right."""

    def __init__(self, key: str) -> None:
        if not key:
            raise ValueError("the API key is empty")
        self._digest = hashlib.sha256(key.encode()).digest()

    def refusal(self, authorizations: list[str]) -> str:
        """Why a handshake with these ``Authorization`` header values is refused ('' when it is not)."""
        if not authorizations:
            return f"this server requires the header 'Authorization: {API_KEY_SCHEME} KEY'"
        if len(authorizations) > 1:
            return "more than one Authorization header"
        scheme, _, offered = authorizations[0].strip().partition(" ")
        if scheme != API_KEY_SCHEME:
            return f"the Authorization header must be '{API_KEY_SCHEME} KEY'"
        if not hmac.compare_digest(hashlib.sha256(offered.strip().encode()).digest(), self._digest):
            return "wrong API key"
        return ""


def refusal_body(why: str) -> str:
    """The body of an HTTP 401 refusal."""
    return f"API key refused: {why}\n"


def busy_answer(waiting: int, bound: int) -> str:
    """The text frame of a server with ``waiting`` requests in flight against its ``bound``."""
    return f"{BUSY_PREFIX} {waiting} requests waiting (bound {bound}); try again later"


def observation_from_request(request: Any, spec: PolicySpec, n_joints: int, max_opening: float,
                             image_size: int | None) -> Observation:
    """The :class:`Observation` an openpi request holds under ``spec``'s keys; ValueError naming the key
    at fault. Images are H x W x 3 uint8 of any size (resized to ``image_size`` when given); the
    main camera's key is required, the others are ignored (the policy sees one camera)."""
    if not isinstance(request, dict):
        raise ValueError(f"a request must be a dict of observation keys, got {type(request).__name__}")
    key = spec.main_image_key
    if key not in request:
        raise ValueError(f"missing observation key '{key}' (expected keys: {', '.join(expected_keys(spec))})")
    image = np.asarray(request[key])
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or min(image.shape[:2]) < 1:
        raise ValueError(f"'{key}' must be an H x W x 3 uint8 image, got {image.dtype} {image.shape}")
    if image_size is not None and image.shape[:2] != (image_size, image_size):
        import cv2

        image = cv2.resize(image, (image_size, image_size), interpolation=cv2.INTER_AREA)
    joints: np.ndarray | None = None
    gripper = max_opening
    for state_key, parts in spec.state.items():
        if state_key not in request:
            raise ValueError(f"missing observation key '{state_key}'")
        values = np.asarray(request[state_key], dtype=float).reshape(-1)
        width = sum(n_joints if part == "joints" else PART_WIDTH[part] for part in parts)
        if values.shape != (width,) or not np.all(np.isfinite(values)):
            raise ValueError(f"'{state_key}' must be {width} finite numbers ({' + '.join(parts)}), got "
                             f"shape {values.shape}")
        at = 0
        for part in parts:
            if part == "joints":
                joints, at = values[at: at + n_joints], at + n_joints
            elif part == "gripper":
                gripper, at = gripper_to_ours(float(values[at]), spec.gripper_state) * max_opening, at + 1
            else:  # the TCP pose: the policy sees the joints
                at += PART_WIDTH[part]
    if joints is None:
        raise ValueError("the spec's state carries no joint positions")
    prompt = request.get(spec.prompt, "")
    if not isinstance(prompt, str):
        raise ValueError(f"'{spec.prompt}' must be a string, got {type(prompt).__name__}")
    return Observation(image=np.array(image, copy=True),  # unpacked arrays are read-only
                       instruction=prompt, joint_pos=joints, gripper=gripper,
                       stamp=time.time())


def expected_keys(spec: PolicySpec) -> list[str]:
    return [spec.main_image_key, *spec.state, spec.prompt]


def actions_reply(actions: np.ndarray, spec: PolicySpec) -> dict[str, Any]:
    """Our actions (H, 7) as the reply's ``actions`` (float32, the gripper on the spec's scale)."""
    out = np.array(actions, dtype=np.float32, copy=True).reshape(-1, 7)
    out[:, :6] /= np.asarray(spec.action_scale, dtype=np.float32)
    out[:, 6] = [gripper_from_ours(float(g), spec.gripper) for g in out[:, 6]]
    return {"actions": out}


def result_reply(result: DecodeResult, spec: PolicySpec) -> dict[str, Any]:
    """A decoded step as the reply's ``actions``: its chunk, else its one action as a chunk of one."""
    actions = result.action[None] if result.chunk is None else result.chunk
    return actions_reply(np.asarray(actions, dtype=float), spec)


def request_image_size(policy: PolicyLike) -> int | None:
    """The image side a request's images are resized to for ``policy`` (None: the policy resizes)."""
    return None if policy.capabilities().resizes_images else int(policy.config.image_size)


def served_metadata(metadata: dict[str, Any], spec: PolicySpec) -> dict[str, Any]:
    """The metadata a connection receives first: ``metadata`` with the action space and ``spec``'s keys."""
    return {**metadata, "action_space": "ee_delta", "action_dim": 7,
            "observation_keys": expected_keys(spec), "image_keys": list(spec.images)}


class OpenPIServer:
    """``runner`` served over openpi's protocol (module docstring) under ``spec``'s keys."""

    def __init__(self, runner: PolicyRunner, spec: PolicySpec, *, n_joints: int, max_opening: float,
                 metadata: dict[str, Any], api_key: ApiKeyCheck | None = None, max_queue: int = 0) -> None:
        """``api_key``: refuse connections without it (None: take any); ``max_queue``: the requests
        in flight (decoding or waiting to) beyond which one is answered busy (0: no bound)."""
        if max_queue < 0:
            raise ValueError(f"--max-queue must be >= 0, got {max_queue}")
        self.runner = runner
        self.api_key = api_key
        self.max_queue = max_queue
        self.spec = spec
        self.n_joints = n_joints
        self.max_opening = max_opening
        self.image_size = request_image_size(runner.policy)
        self.metadata = served_metadata(metadata, spec)
        self._lock = threading.Lock()  # one decode at a time, whatever the connections
        self.served = 0
        self.refused = 0
        self.unauthorized = 0  # handshakes refused for their API key
        self.busy = 0  # requests answered busy
        self.in_flight = 0  # requests decoding or waiting to (the event loop's count)

    def infer(self, request: Any, new_episode: bool = False) -> dict[str, Any]:
        """One request's reply (``actions``; the caller adds ``server_timing``), the runner's episode
        started over first with ``new_episode``; ValueError on a bad request."""
        obs = observation_from_request(request, self.spec, self.n_joints, self.max_opening, self.image_size)
        with self._lock:
            if new_episode:
                self.runner.start_episode()
            result = self.runner(obs)
        return result_reply(result, self.spec)

    async def handle(self, connection: ServerConnection) -> None:
        packer = msgpack_numpy.Packer()
        # The episode starts with the connection's first request, under the decode lock: a
        # connection opened while another request decodes gets its metadata at once.
        new_episode = True
        await connection.send(packer.pack(self.metadata))
        previous_total_ms: float | None = None
        while True:
            try:
                message = await connection.recv()
            except ConnectionClosed:
                return
            start = time.monotonic()
            if self.max_queue and self.in_flight >= self.max_queue:
                self.busy += 1
                await self._answer_and_close(connection, busy_answer(self.in_flight, self.max_queue),
                                             CloseCode.TRY_AGAIN_LATER, "busy")
                return
            try:
                if isinstance(message, str):
                    raise ValueError("a request must be a binary msgpack message, got a text frame")
                request = msgpack_numpy.unpackb(message)
                infer_start = time.monotonic()
                self.in_flight += 1
                try:
                    reply = await asyncio.to_thread(self.infer, request, new_episode)
                finally:  # decoded: it holds no place in the queue while its reply goes out
                    self.in_flight -= 1
                new_episode = False
                timing = {"infer_ms": (time.monotonic() - infer_start) * 1e3}
                if previous_total_ms is not None:
                    timing["prev_total_ms"] = previous_total_ms
                reply["server_timing"] = timing
                await connection.send(packer.pack(reply))
            except ConnectionClosed:
                return
            except Exception as error:  # a bad request or a failing policy: say why, then close
                self.refused += 1
                log.warning("request refused: %s", error)
                await self._answer_and_close(connection, f"{type(error).__name__}: {error}", CloseCode.INTERNAL_ERROR,
                                             "request refused")
                return
            self.served += 1
            previous_total_ms = (time.monotonic() - start) * 1e3

    @staticmethod
    async def _answer_and_close(connection: ServerConnection, text: str, code: CloseCode, what: str) -> None:
        try:
            await connection.send(text)
            await connection.close(code, f"{what}; the reason is in the previous frame")
        except ConnectionClosed:
            pass

    def check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """The handshake's answer when it is not a websocket's: ``/healthz``, or the API key refused."""
        if request.path == HEALTH_PATH:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        why = self.api_key.refusal(request.headers.get_all("Authorization")) if self.api_key is not None else ""
        if not why:
            return None
        self.unauthorized += 1
        log.warning("connection from %s refused: %s", connection.remote_address, why)
        response = connection.respond(http.HTTPStatus.UNAUTHORIZED, refusal_body(why))
        response.headers["WWW-Authenticate"] = API_KEY_SCHEME
        return response

    async def serve(self, host: str, port: int, ready: asyncio.Future[Server] | None = None) -> None:
        """Serve on ``host``:``port`` until cancelled (``ready`` gets the server once it listens)."""
        async with serve(self.handle, host, port, compression=None, max_size=self.spec.max_message_bytes,
                         process_request=self.check_request) as server:
            if ready is not None:
                ready.set_result(server)
            await server.serve_forever()
