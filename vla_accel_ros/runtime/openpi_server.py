"""Our policies behind openpi's policy-server protocol (``vla-accel serve-openpi``).

The protocol, as openpi's clients speak it: on connecting, the client receives one binary message,
the server's metadata; then, for each binary message it sends (an observation dict), it receives
one binary message: the action dict, ``actions`` (H x 7) and ``server_timing`` (``infer_ms``, and
``prev_total_ms``, the previous request's whole cycle). Every message is packed with openpi-client's
msgpack-numpy. A request that cannot be served is answered by one text frame saying why, then the
server closes the connection (code 1011), as openpi's own server does. ``GET /healthz`` answers 200.
A message larger than the spec's ``max_message_bytes`` closes the connection (code 1009) unread.

Each connection is a new episode of the runner (its history, filter and decoder state start over);
one request is decoded at a time.
"""

from __future__ import annotations

import asyncio
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
from vla_accel_ros.models.openpi.config import PART_WIDTH, PolicySpec, gripper_from_ours, gripper_to_ours

if TYPE_CHECKING:
    from vla_accel_ros.decoding.protocol import DecodeResult
    from vla_accel_ros.models.api import PolicyLike
    from vla_accel_ros.runtime.runner import PolicyRunner

log = logging.getLogger(__name__)
HEALTH_PATH = "/healthz"


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
                 metadata: dict[str, Any]) -> None:
        self.runner = runner
        self.spec = spec
        self.n_joints = n_joints
        self.max_opening = max_opening
        self.image_size = request_image_size(runner.policy)
        self.metadata = served_metadata(metadata, spec)
        self._lock = threading.Lock()  # one decode at a time, whatever the connections
        self.served = 0
        self.refused = 0

    def infer(self, request: Any) -> dict[str, Any]:
        """One request's reply (``actions``; the caller adds ``server_timing``); ValueError on a bad request."""
        obs = observation_from_request(request, self.spec, self.n_joints, self.max_opening, self.image_size)
        with self._lock:
            result = self.runner(obs)
        return result_reply(result, self.spec)

    async def handle(self, connection: ServerConnection) -> None:
        packer = msgpack_numpy.Packer()
        with self._lock:
            self.runner.start_episode()
        await connection.send(packer.pack(self.metadata))
        previous_total_ms: float | None = None
        while True:
            try:
                message = await connection.recv()
            except ConnectionClosed:
                return
            start = time.monotonic()
            try:
                if isinstance(message, str):
                    raise ValueError("a request must be a binary msgpack message, got a text frame")
                request = msgpack_numpy.unpackb(message)
                infer_start = time.monotonic()
                reply = await asyncio.to_thread(self.infer, request)
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
                try:
                    await connection.send(f"{type(error).__name__}: {error}")
                    await connection.close(CloseCode.INTERNAL_ERROR, "request refused; the reason is in the "
                                                                     "previous frame")
                except ConnectionClosed:
                    pass
                return
            self.served += 1
            previous_total_ms = (time.monotonic() - start) * 1e3

    @staticmethod
    def health(connection: ServerConnection, request: Request) -> Response | None:
        if request.path == HEALTH_PATH:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        return None

    async def serve(self, host: str, port: int, ready: asyncio.Future[Server] | None = None) -> None:
        """Serve on ``host``:``port`` until cancelled (``ready`` gets the server once it listens)."""
        async with serve(self.handle, host, port, compression=None, max_size=self.spec.max_message_bytes,
                         process_request=self.health) as server:
            if ready is not None:
                ready.set_result(server)
            await server.serve_forever()
