"""What an openpi policy server's messages hold, named once for both directions (``--policy-spec FILE``).

An openpi server's keys and action semantics depend on its policy config, so a JSON file says, for
this robot and that server:

- ``images``: observation key -> camera (``"main"``: the node's camera; any other name: a camera the
  node does not have yet, sent as a black frame of the same size, as openpi's own clients pad a
  missing view). The first key is the one a server of ours requires; the others are optional.
- ``image_size``: the side (pixels) the client resizes frames to before sending them (0 = as they are).
- ``state``: observation key -> the parts it concatenates, in order: ``"joints"`` (the arm's joint
  positions, rad), ``"gripper"`` (the finger opening mapped by ``gripper_state``), ``"tcp_position"``
  (m, 3) and ``"tcp_axis_angle"`` (rad, 3), the TCP pose in the arm's base frame. A server of ours
  reads the joints and the gripper and skips the TCP parts.
- ``prompt``: the key of the instruction.
- ``action_space``: ``ee_delta`` (our 7 numbers: Δx Δy Δz, Δroll Δpitch Δyaw as a world-frame
  rotation vector, gripper), ``joint_position`` (absolute arm targets then the gripper) or
  ``joint_velocity`` (rad/s then the gripper, integrated over ``action_dt_s`` under the velocity limits).
- ``chunk_length``: the actions of a reply the node executes (0 = every one the server sends).
- ``action_dt_s``: the time one action of the server's chunk covers.
- ``action_scale``: ``ee_delta`` only, the six factors from the server's Δ units to ours (m, rad):
  LIBERO's controller takes ±1 as ±0.05 m and ±0.5 rad.
- ``gripper``: the server's gripper value for ``open`` and ``closed`` (ours: 1 and 0);
  ``gripper_state``: the same for the state, the opening as a fraction of the widest.
- ``max_message_bytes``: the largest message either side accepts.

Beside the spec, the protocol's two refusals are named here for both sides: a server that requires
an API key refuses a connection without ``Authorization: Api-Key KEY`` at the handshake (HTTP 401),
and an overloaded one answers a request with a text frame starting ``busy:`` and closes (code 1013,
try again later). :func:`read_api_key` reads a key for either side.

:data:`LIBERO` is the default; ``config/openpi/*.json`` ship the LIBERO and DROID examples.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vla_accel_ros.core.actions import EE_DELTA, JOINT_POSITION
from vla_accel_ros.models.files import read_json_object

ACTION_SPACES = ("ee_delta", "joint_position", "joint_velocity")
STATE_PARTS = ("joints", "gripper", "tcp_position", "tcp_axis_angle")
PART_WIDTH = {"gripper": 1, "tcp_position": 3, "tcp_axis_angle": 3}  # "joints": the arm's joint count
MAIN_CAMERA = "main"
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
API_KEY_SCHEME = "Api-Key"  # Authorization: Api-Key KEY
BUSY_PREFIX = "busy:"  # the text frame of an overloaded server
CLOSE_TRY_AGAIN_LATER = 1013


@dataclass(frozen=True)
class PolicySpec:
    """One server's observation keys and action semantics (the module docstring)."""

    images: dict[str, str] = field(default_factory=lambda: {"observation/image": MAIN_CAMERA,
                                                            "observation/wrist_image": "wrist"})
    image_size: int = 224
    state: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"observation/state": ("joints", "gripper")})
    prompt: str = "prompt"
    action_space: str = "ee_delta"
    chunk_length: int = 0
    action_dt_s: float = 0.05
    action_scale: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    gripper: tuple[float, float] = (1.0, 0.0)  # (open, closed)
    gripper_state: tuple[float, float] = (1.0, 0.0)  # (open, closed)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        if not self.images or not all(isinstance(k, str) and isinstance(v, str) for k, v in self.images.items()):
            raise ValueError("images must map at least one observation key to a camera name")
        if MAIN_CAMERA not in self.images.values():
            raise ValueError(f"images must map one key to the camera '{MAIN_CAMERA}' (the node's camera)")
        object.__setattr__(self, "state", {k: tuple(v) for k, v in self.state.items()})
        for key, parts in self.state.items():
            unknown = [p for p in parts if p not in STATE_PARTS]
            if not parts or unknown:
                raise ValueError(f"state['{key}'] must list parts among {', '.join(STATE_PARTS)}, got {list(parts)}")
        if self.action_space not in ACTION_SPACES:
            raise ValueError(f"action_space must be one of {', '.join(ACTION_SPACES)}, got '{self.action_space}'")
        if self.image_size < 0 or self.chunk_length < 0:
            raise ValueError("image_size and chunk_length must be >= 0")
        if not (math.isfinite(self.action_dt_s) and self.action_dt_s > 0):
            raise ValueError(f"action_dt_s must be > 0, got {self.action_dt_s}")
        scale = tuple(float(v) for v in self.action_scale)
        if len(scale) != 6 or not all(math.isfinite(v) and v > 0 for v in scale):
            raise ValueError("action_scale must be six positive numbers (Δx Δy Δz Δroll Δpitch Δyaw)")
        object.__setattr__(self, "action_scale", scale)
        for name in ("gripper", "gripper_state"):
            pair = tuple(float(v) for v in getattr(self, name))
            if len(pair) != 2 or not all(math.isfinite(v) for v in pair) or pair[0] == pair[1]:
                raise ValueError(f"{name} must be [open, closed], two different finite numbers")
            object.__setattr__(self, name, pair)
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")

    @property
    def executed_action_space(self) -> str:
        """The node's action space for this server's replies: joint velocities arrive as the joint
        positions they reach (:mod:`vla_accel_ros.core.actions`)."""
        return EE_DELTA if self.action_space == "ee_delta" else JOINT_POSITION

    @property
    def main_image_key(self) -> str:
        return next(key for key, camera in self.images.items() if camera == MAIN_CAMERA)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PolicySpec:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown keys {unknown}; known: {sorted(known)}")
        values = dict(data)
        for name in ("gripper", "gripper_state"):
            if isinstance(values.get(name), dict):
                values[name] = (values[name].get("open"), values[name].get("closed"))
        try:
            return cls(**values)
        except TypeError as error:
            raise ValueError(str(error)) from None

    @classmethod
    def read(cls, path: str | Path) -> PolicySpec:
        """The spec in the JSON file ``path``; ValueError naming the file and what is wrong."""
        path = Path(path)
        data = read_json_object(path)
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{path}: {error}") from None


LIBERO = PolicySpec()


def gripper_to_ours(value: float, open_closed: tuple[float, float]) -> float:
    """A gripper value on the server's scale (``open_closed``) as ours: 1 = open, 0 = closed, clipped."""
    opened, closed = open_closed
    return min(1.0, max(0.0, (value - closed) / (opened - closed)))


def gripper_from_ours(fraction: float, open_closed: tuple[float, float]) -> float:
    """Our gripper value (1 = open, 0 = closed) on the server's scale."""
    opened, closed = open_closed
    return closed + min(1.0, max(0.0, fraction)) * (opened - closed)


def read_api_key(*, file: str | Path | None = None, env: str = "") -> str:
    """The API key in ``file`` (its text, surrounding whitespace dropped), else in the environment
    variable ``env`` ('' when neither names one); ValueError naming a file that cannot be read."""
    if file is not None:
        try:
            return Path(file).read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{file}: cannot read the API key ({error})") from None
    return os.environ.get(env, "").strip() if env else ""
