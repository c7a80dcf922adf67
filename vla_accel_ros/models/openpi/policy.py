"""A policy server speaking openpi's protocol as the node's policy (checkpoint ``openpi://HOST:PORT``).

The server's reply is a chunk of actions. It reaches the controller through the policy contract's
chunk path (``flow_chunks``, the one LeRobot's flow VLAs take): :meth:`OpenPIPolicy.prefill` makes
the request and holds the reply in its prefix, and :meth:`OpenPIPolicy.sample_chunk` hands it back,
so ``flow10`` and ``flow2`` return the chunk and the controller executes it under every clamp.
Our actions are 7 numbers (``core.actions``); a joint-position reply is turned into
them through the arm's kinematics, each target first clamped to what the velocity limits reach over
``action_dt_s`` from the one before, and a joint-velocity reply is integrated over ``action_dt_s``
under the same limits.

The address takes ``?spec=FILE`` (the keys and the action space, :mod:`.config`; default LIBERO's),
``api_key_file=FILE`` or ``api_key_env=NAME`` (default ``VLA_ACCEL_OPENPI_API_KEY`` when it is set):
the key is sent as ``Authorization: Api-Key KEY`` and is never a parameter's value; and
``timeout_s=S``, the longest wait for a reply (default 1). Every blocking call (connect, send,
receive) runs in the inference worker, never in the control loop: a server that is slow or gone costs
the worker, while the controller falls back and holds. After a failure the connection is dropped (a
late reply would answer the wrong request) and the next request reconnects, at most once per
``RECONNECT_INTERVAL_S``; while it waits, each request's error repeats why the last attempt failed.
A bad reply (wrong shape, not finite, a text frame with the server's error, a message over the spec's
``max_message_bytes``) raises, which the worker reports once and counts.

The server's two refusals are told apart (:mod:`.config`): a handshake refused with HTTP 401 or 403
is the API key refused (``server_api_key_refusals``, and ``server_api_key_refused`` says why until an
attempt ends otherwise), and a ``busy:`` answer (or a close with 1013) is an overloaded server
(``server_busy``), after which the next request reconnects at once rather than after the interval.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import numpy as np
import pinocchio as pin
import torch
from openpi_client import msgpack_numpy
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.models.api import LoadOptions, PolicyCapabilities, Prefix, ResolvedCheckpoint
from vla_accel_ros.models.openpi.config import (
    API_KEY_SCHEME,
    BUSY_PREFIX,
    CLOSE_TRY_AGAIN_LATER,
    LIBERO,
    MAIN_CAMERA,
    PolicySpec,
    gripper_from_ours,
    gripper_to_ours,
    read_api_key,
)
from vla_accel_ros.models.tokenizer import ActionTokenizer

API_KEY_ENV = "VLA_ACCEL_OPENPI_API_KEY"
RECONNECT_INTERVAL_S = 0.5
CONNECT_TIMEOUT_S = 2.0
# The widest action the client passes on (m and rad per action step; gripper 0..1): a reply beyond is
# clipped here, and the controller then clamps to the arm's limits.
ACTION_BOUND = np.array([0.25, 0.25, 0.25, 1.0, 1.0, 1.0])
STATS_WINDOW = 1000
KEY_REFUSED_STATUSES = (401, 403)


class ServerError(RuntimeError):
    """The server is unreachable, or did not answer a request with a usable chunk."""


@dataclass(frozen=True)
class RemoteConfig:
    """What the runtime reads of the policy's shape: the node resizes frames to ``image_size``;
    ``num_steps``: the flow decoders' step count, which a served chunk does not use;
    ``n_action_steps``: the steps of a served chunk that are executed (None: all of them)."""

    image_size: int
    d_model: int = 7
    n_action_tokens: int = 7
    n_bins: int = 255
    num_steps: int = 1
    n_action_steps: int | None = None


class ServerReply:
    """A served policy's prefix cache: the server's chunk, our actions (H, 7); no keys and values."""

    def __init__(self, actions: np.ndarray) -> None:
        self.actions = actions

    def cropped(self, length: int) -> ServerReply:
        return self

    def rows(self, rows: list[int]) -> ServerReply:
        return self


@dataclass(frozen=True)
class ServerAddress:
    """``openpi://HOST:PORT?spec=...`` parsed: the websocket URI, the spec, the key, the reply timeout."""

    uri: str
    spec: PolicySpec
    api_key: str
    timeout_s: float

    @classmethod
    def parse(cls, address: str) -> ServerAddress:
        parts = urlsplit(address)
        if not parts.hostname or parts.port is None:
            raise ValueError(f"{address}: a policy server's address is openpi://HOST:PORT (or ws://HOST:PORT)")
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        unknown = sorted(set(query) - {"spec", "api_key_file", "api_key_env", "timeout_s"})
        if unknown:
            raise ValueError(f"{address}: unknown settings {unknown} (spec, api_key_file, api_key_env, timeout_s)")
        spec = PolicySpec.read(query["spec"]) if "spec" in query else LIBERO
        if spec.image_size < 1:
            raise ValueError(f"{address}: the spec's image_size must be > 0 for a client (the node resizes to it)")
        api_key = read_api_key(file=query.get("api_key_file"), env=query.get("api_key_env", API_KEY_ENV))
        try:
            timeout_s = float(query.get("timeout_s", 1.0))
        except ValueError:
            timeout_s = -1.0
        if not 0 < timeout_s <= 60:
            raise ValueError(f"{address}: timeout_s must be a number of seconds in (0, 60]")
        scheme = "wss" if parts.scheme == "wss" else "ws"
        return cls(urlunsplit((scheme, parts.netloc, parts.path, "", "")), spec, api_key, timeout_s)


def executed_action_space(address: str) -> str:
    """The node's action space for the replies of the server at ``address`` (its spec's)."""
    return ServerAddress.parse(address).spec.executed_action_space


def connect_policy(address: str, *, arm: ArmKinematics) -> OpenPIPolicy:
    """The policy the server at ``address`` serves, for the arm ``arm``; nothing is connected yet
    (the first request connects). ValueError naming what is wrong in the address or its spec."""
    return OpenPIPolicy(ServerAddress.parse(address), arm)


def load_resolved(checkpoint: ResolvedCheckpoint, options: LoadOptions) -> OpenPIPolicy:
    """The family's loader (:mod:`vla_accel_ros.models.load`): :func:`connect_policy` of the
    checkpoint's address for ``options.arm``, the robot's kinematics, which turn the server's joint
    actions into ours; ValueError without one."""
    if options.arm is None:
        raise ValueError(f"{checkpoint.ref}: a policy server needs the robot's kinematics (arm=)")
    return connect_policy(checkpoint.ref.address, arm=options.arm)


class OpenPIPolicy:
    """A policy served over openpi's protocol (module docstring)."""

    parallel_draft = None

    def __init__(self, address: ServerAddress, arm: ArmKinematics) -> None:
        self.address = address
        self.spec = address.spec
        self.arm = arm
        self.config = RemoteConfig(image_size=self.spec.image_size)
        self.tokenizer = ActionTokenizer(np.r_[-ACTION_BOUND, 0.0], np.r_[ACTION_BOUND, 1.0])
        self.flow = None  # the chunk comes through sample_chunk (flow_chunks)
        self.metadata: dict[str, Any] = {}
        self._ws: ClientConnection | None = None
        self._next_attempt = 0.0
        self._lock = threading.Lock()
        self._rtt_ms: deque[float] = deque(maxlen=STATS_WINDOW)
        self._infer_ms: deque[float] = deque(maxlen=STATS_WINDOW)
        self.counts = {"requests": 0, "replies": 0, "lost": 0, "bad_replies": 0, "connects": 0,
                       "connect_failures": 0, "api_key_refusals": 0, "busy": 0}
        self.api_key_refused = ""  # why the server refused the key, until an attempt ends otherwise
        self._down_reason = ""  # why the last attempt failed, until a reply comes

    # --- the policy contract ----------------------------------------------------------------
    @property
    def n_action_tokens(self) -> int:
        return 7

    def capabilities(self) -> PolicyCapabilities:
        return PolicyCapabilities(flow_head=True, flow_chunks=True)

    def prefill(self, obs: Any) -> Prefix:
        """The server's chunk for ``obs``, held in the prefix :meth:`sample_chunk` reads."""
        chunk = self.request_chunk(obs)
        return Prefix(cache=ServerReply(chunk), action_hidden=torch.zeros(1, 1, 0),
                      tokens=torch.zeros(1, 0, dtype=torch.long), pooled=torch.zeros(1, 0), prefix_len=0)

    def sample_chunk(self, prefix: Prefix, noise: torch.Tensor, steps: int, guide: Any = None,
                     student: bool = False) -> np.ndarray:
        """The chunk the prefill received (the noise, the step count, a guide and the student do
        not apply: the server sampled it)."""
        reply: ServerReply = prefix.cache
        return np.array(reply.actions, dtype=float)

    def noise_shape(self) -> tuple[int, int]:
        return 1, 7

    def check_robot(self, state_dim: int, action_dim: int) -> None:
        """Nothing to refuse: the spec maps the arm's state and the server's actions to ours."""

    def n_parameters(self) -> dict[str, int]:
        return {}

    # --- the server -------------------------------------------------------------------------
    def request_chunk(self, obs: Any) -> np.ndarray:
        """Our actions (H, 7) for ``obs`` from the server; ServerError saying why there are none."""
        ws = self._connection()
        request = self.request(obs)
        with self._lock:
            self.counts["requests"] += 1
        start = time.perf_counter()
        try:
            ws.send(msgpack_numpy.packb(request))
            message = ws.recv(timeout=self.address.timeout_s)
        except (TimeoutError, WebSocketException, OSError) as error:
            self._drop()
            if isinstance(error, ConnectionClosed) and error.rcvd is not None \
                    and error.rcvd.code == CLOSE_TRY_AGAIN_LATER:
                raise self._busy(f"closed with code {CLOSE_TRY_AGAIN_LATER}, try again later") from None
            with self._lock:
                self.counts["lost"] += 1
            why = f"no reply within {self.address.timeout_s:g} s" if isinstance(error, TimeoutError) else (
                f"connection lost ({error})")
            self._down_reason = why
            raise ServerError(f"{self.address.uri}: {why}") from None
        rtt_ms = (time.perf_counter() - start) * 1e3
        if isinstance(message, str) and message.startswith(BUSY_PREFIX):
            self._drop()  # the server closes after its answer
            raise self._busy(message.strip()[-300:])
        try:
            if isinstance(message, str):
                self._drop()  # the server closes after an error frame
                raise ServerError(f"{self.address.uri} refused the request: {message.strip()[-300:]}")
            reply = msgpack_numpy.unpackb(message)
            chunk = self.to_our_actions(reply, np.asarray(obs.joint_pos, dtype=float))
        except ServerError:
            with self._lock:
                self.counts["bad_replies"] += 1
            raise
        except Exception as error:  # a reply we cannot read: one message, and the next request reconnects
            self._drop()
            with self._lock:
                self.counts["bad_replies"] += 1
            raise ServerError(f"{self.address.uri}: unusable reply ({error})") from None
        self._down_reason = ""
        with self._lock:
            self.counts["replies"] += 1
            self._rtt_ms.append(rtt_ms)
            timing = reply.get("server_timing") if isinstance(reply, dict) else None
            if isinstance(timing, dict) and isinstance(timing.get("infer_ms"), (int, float)):
                self._infer_ms.append(float(timing["infer_ms"]))
        return chunk

    def _busy(self, answer: str) -> ServerError:
        """The server is overloaded (it answered ``answer``): counted apart from failures, and the
        next request reconnects at once, since a busy answer comes at once rather than late."""
        with self._lock:
            self.counts["busy"] += 1
        self._next_attempt = 0.0
        self._down_reason = f"the openpi server is busy ({answer})"
        return ServerError(f"{self.address.uri}: the openpi server is busy (overloaded), retrying on the next "
                           f"observation: {answer}")

    def request(self, obs: Any) -> dict[str, Any]:
        """The observation dict the spec's keys name for ``obs``."""
        image = np.ascontiguousarray(obs.image, dtype=np.uint8)
        request: dict[str, Any] = {key: image if camera == MAIN_CAMERA else np.zeros_like(image)
                                   for key, camera in self.spec.images.items()}
        max_opening = float(self.arm.gripper_limits.upper.max()) if self.arm.gripper_joint_names else 1.0
        fraction = float(obs.gripper) / max_opening if max_opening > 0 else 1.0
        q = np.asarray(obs.joint_pos, dtype=float)
        pose = self.arm.fk(q) if any(p.startswith("tcp") for parts in self.spec.state.values() for p in parts) else None
        for key, parts in self.spec.state.items():
            values = []
            for part in parts:
                if part == "joints":
                    values.append(q)
                elif part == "gripper":
                    values.append(np.array([gripper_from_ours(fraction, self.spec.gripper_state)]))
                elif pose is not None:
                    values.append(pose.position if part == "tcp_position" else pin.log3(pose.rotation))
            request[key] = np.concatenate(values).astype(np.float32)
        request[self.spec.prompt] = str(obs.instruction)
        return request

    def to_our_actions(self, reply: Any, q: np.ndarray) -> np.ndarray:
        """A reply's ``actions`` as the node executes them from the arm at ``q`` (the spec's
        :attr:`~PolicySpec.executed_action_space`): end-effector deltas (H, 7), or joint positions
        and the gripper (H, DOF + 1), joint velocities integrated over ``action_dt_s`` under the
        velocity and position limits; ServerError when unusable."""
        if not isinstance(reply, dict) or "actions" not in reply:
            raise ServerError("the reply holds no 'actions'")
        actions = np.asarray(reply["actions"])
        if actions.dtype.kind not in "fiu":
            raise ServerError(f"'actions' must be numbers, got dtype {actions.dtype}")
        actions = actions.astype(float)
        if actions.ndim == 1:
            actions = actions[None]
        n = self.arm.n
        width = 7 if self.spec.action_space == "ee_delta" else n + 1
        if actions.ndim != 2 or actions.shape[0] < 1 or actions.shape[1] < width:
            raise ServerError(f"'actions' must be H x {width} ({self.spec.action_space}), got shape {actions.shape}")
        if self.spec.chunk_length:
            actions = actions[: self.spec.chunk_length]
        actions = actions[:, :width]
        if not np.all(np.isfinite(actions)):
            raise ServerError("'actions' holds values that are not finite")
        gripper = np.array([gripper_to_ours(float(g), self.spec.gripper) for g in actions[:, width - 1]])
        if self.spec.action_space == "ee_delta":
            scaled = actions[:, :6] * np.asarray(self.spec.action_scale)
            return np.column_stack([np.clip(scaled, -ACTION_BOUND, ACTION_BOUND), gripper])
        targets = actions[:, :n].copy()
        if self.spec.action_space == "joint_velocity":  # positions reached under the limits, step by step
            dt = self.spec.action_dt_s
            for k, velocity in enumerate(actions[:, :n]):
                q = targets[k] = self.arm.clamp(q + velocity * dt, q, dt)
        return np.column_stack([targets, gripper])

    def _connection(self) -> ClientConnection:
        if self._ws is not None:
            return self._ws
        now = time.monotonic()
        if now < self._next_attempt:
            last = f": {self._down_reason}" if self._down_reason else ""
            raise ServerError(f"{self.address.uri}: not connected (next attempt in {self._next_attempt - now:.1f} s)"
                              f"{last}")
        self._next_attempt = now + RECONNECT_INTERVAL_S
        headers = {"Authorization": f"{API_KEY_SCHEME} {self.address.api_key}"} if self.address.api_key else None
        try:
            ws = connect(self.address.uri, compression=None, max_size=self.spec.max_message_bytes,
                         additional_headers=headers, open_timeout=CONNECT_TIMEOUT_S)
            first = ws.recv(timeout=CONNECT_TIMEOUT_S)
            metadata = msgpack_numpy.unpackb(first) if isinstance(first, bytes) else None
        except InvalidStatus as error:
            with self._lock:
                self.counts["connect_failures"] += 1
            self._down_reason = self._refused(error)
            raise ServerError(f"{self.address.uri}: {self._down_reason}") from None
        except (TimeoutError, WebSocketException, OSError, ValueError) as error:
            with self._lock:
                self.counts["connect_failures"] += 1
                self.api_key_refused = ""  # the latest attempt says nothing of the key
            self._down_reason = f"cannot connect ({error})"
            raise ServerError(f"{self.address.uri}: cannot connect ({error})") from None
        if not isinstance(metadata, dict):
            ws.close()
            raise ServerError(f"{self.address.uri}: the server's first message is not its metadata")
        with self._lock:
            self.counts["connects"] += 1
            self.api_key_refused = ""
        self._ws, self.metadata = ws, metadata
        return ws

    def _refused(self, error: InvalidStatus) -> str:
        """Why the server refused the handshake, in one line; a refused key is counted and kept."""
        status = error.response.status_code
        body = bytes(error.response.body or b"").decode(errors="replace").strip()[:200]
        said = f"HTTP {status}: {body}" if body else f"HTTP {status}"
        if status not in KEY_REFUSED_STATUSES:
            with self._lock:
                self.api_key_refused = ""
            return f"cannot connect (the server answered {said})"
        unset = "" if self.address.api_key else "; the address names none (api_key_file= or api_key_env=)"
        reason = f"the openpi server refused the API key ({said}){unset}"
        with self._lock:
            self.counts["api_key_refusals"] += 1
            self.api_key_refused = reason
        return reason

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()

    def remote_stats(self) -> dict[str, Any]:
        """Requests, replies, lost and bad replies, connections, busy answers and refused keys (with
        why the key stands refused, '' when it does not); round trip and server time (ms)."""
        with self._lock:
            rtt = np.asarray(self._rtt_ms, dtype=float)
            infer = np.asarray(self._infer_ms, dtype=float)
            out: dict[str, Any] = {f"server_{k}": v for k, v in self.counts.items()}
            out["server_api_key_refused"] = self.api_key_refused
        out["server_connected"] = self._ws is not None
        out["server_rtt_ms_p50"] = float(np.percentile(rtt, 50)) if rtt.size else 0.0
        out["server_rtt_ms_p99"] = float(np.percentile(rtt, 99)) if rtt.size else 0.0
        out["server_infer_ms_p50"] = float(np.percentile(infer, 50)) if infer.size else 0.0
        return out
