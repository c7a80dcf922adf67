"""The robot a checkpoint was made for, and its comparison with the robot it is asked to drive.

A checkpoint's ``model.json`` holds a ``robot`` record: arm DOF, joint names, TCP frame, action
space, the policy's control rate, its camera and image size. The action space (end-effector deltas
or absolute joint positions, :mod:`vla_accel_ros.core.actions`) says how the node executes the
policy's actions; either runs on any arm. Before anything commands an arm, the node and every
``vla-accel`` command that drives one compare the rest of the record with the URDF and the
parameters in use (:func:`check_robot`):

- a different DOF never starts (:class:`RobotMismatch`; the policy's proprioception and its IK
  would be meaningless);
- the same DOF on another arm (other joint names, TCP frame, control rate or image size) starts
  only when ``allow_unmatched_robot`` is set, and then with a warning to report on /diagnostics.

Importable without torch or rclpy: it reads the JSON only.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from vla_accel_ros.core.actions import ACTION_SPACES, EE_DELTA
from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.core.settings import ConfigError

ROBOT_KEY = "robot"  # the record's key in model.json
META_FILE = "model.json"
HF_SPEC_FILE = "vla_spec.json"  # what a Hugging Face VLA directory adds (models/vla_spec.py)
ACTION_SPACE = EE_DELTA  # the package's own policies: Δxyz, Δrotation vector, gripper in [0, 1]
DEFAULT_CAMERA = "front"
# Checkpoints written before the record existed were all made for the package's own arm.
LEGACY_ROBOT = {
    "dof": 7,
    "joint_names": ["joint1", "joint2", "joint3", "joint4", "joint5", "joint6", "joint7"],
    "tcp_frame": "tcp",
    "action_space": ACTION_SPACE,
    "control_rate_hz": 20.0,
    "camera": DEFAULT_CAMERA,
}


class RobotMismatch(ConfigError):
    """The robot in use is not the one the checkpoint was made for (and may not be driven by it)."""


@dataclass(frozen=True)
class RobotRecord:
    """What a policy assumes about its robot. ``image_size`` 0 and ``control_rate_hz`` 0 mean
    "not known" and compare equal to anything."""

    dof: int
    joint_names: tuple[str, ...]
    tcp_frame: str
    action_space: str = ACTION_SPACE
    control_rate_hz: float = 0.0
    camera: str = DEFAULT_CAMERA
    image_size: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "joint_names", tuple(self.joint_names))  # a list would never compare equal
        if self.dof < 1:
            raise ValueError(f"robot record: dof must be >= 1, got {self.dof}")
        if len(self.joint_names) != self.dof:
            raise ValueError(f"robot record: {len(self.joint_names)} joint names for dof {self.dof}")
        if len(set(self.joint_names)) != self.dof or not all(self.joint_names):
            raise ValueError(f"robot record: joint names must be distinct and non-empty, got {list(self.joint_names)}")
        if not self.tcp_frame:
            raise ValueError("robot record: tcp_frame must not be empty")
        if self.action_space not in ACTION_SPACES:
            raise ValueError(f"robot record: action_space must be one of {', '.join(ACTION_SPACES)}, "
                             f"got '{self.action_space}'")
        if not (math.isfinite(self.control_rate_hz) and self.control_rate_hz >= 0):
            raise ValueError(f"robot record: control_rate_hz must be >= 0, got {self.control_rate_hz}")
        if self.image_size < 0:
            raise ValueError(f"robot record: image_size must be >= 0, got {self.image_size}")

    def to_json(self) -> dict[str, Any]:
        """The record as model.json holds it (a JSON object)."""
        out = asdict(self)
        out["joint_names"] = list(self.joint_names)
        return out

    @classmethod
    def from_json(cls, data: Any) -> RobotRecord:
        """The record of a model.json ``robot`` object; ValueError for anything else."""
        try:
            if not isinstance(data, dict):
                raise TypeError(f"must be a JSON object, got {type(data).__name__}")
            unknown = sorted(set(data) - {f.name for f in fields(cls)})
            if unknown:
                raise TypeError(f"unknown keys {unknown}")
            values = dict(data)
            names = data["joint_names"]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"joint_names must be a list of strings, got {names!r}")
            values["joint_names"] = tuple(names)
            values["dof"] = _number(data["dof"], "dof", int)
            for key in ("tcp_frame", "camera", "action_space"):
                if key in values and not isinstance(values[key], str):
                    raise TypeError(f"{key} must be a string, got {values[key]!r}")
            if "tcp_frame" not in values:
                raise KeyError("tcp_frame")
            for key, kind in (("control_rate_hz", float), ("image_size", int)):
                if key in values:
                    values[key] = _number(values[key], key, kind)
        except KeyError as err:
            raise ValueError(f"robot record: missing key {err}") from err
        except TypeError as err:
            raise ValueError(f"robot record: {err}") from err
        return cls(**values)

    def describe(self) -> str:
        """One line naming everything the record holds."""
        rate = f"{self.control_rate_hz:g} Hz" if self.control_rate_hz else "any rate"
        size = f"{self.image_size}px" if self.image_size else "any size"
        return (f"{self.dof}-DoF arm {list(self.joint_names)}, TCP '{self.tcp_frame}', {self.action_space}, "
                f"{rate}, camera '{self.camera}' at {size}")


def _number(value: Any, key: str, kind: type[int | float]) -> Any:
    """``value`` as ``kind``: a JSON number (not a bool), whole for an int."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{key} must be a number, got {value!r}")
    if kind is int and not (math.isfinite(value) and float(value).is_integer()):
        raise TypeError(f"{key} must be a whole number, got {value!r}")
    return kind(value)


def robot_in_use(joint_names: tuple[str, ...] | list[str], tcp_frame: str, *, action_dt_s: float = 0.0,
                 image_size: int = 0, camera: str = DEFAULT_CAMERA) -> RobotRecord:
    """The record of the robot being driven: the URDF's arm joints and TCP frame, the policy step
    (``action_dt_s``, the rate the actions are meant for) and the image size fed to the model."""
    names = tuple(joint_names)
    rate = 1.0 / action_dt_s if action_dt_s > 0 else 0.0
    return RobotRecord(dof=len(names), joint_names=names, tcp_frame=tcp_frame, control_rate_hz=rate,
                       camera=camera, image_size=image_size)


def package_robot(image_size: int = 0) -> RobotRecord:
    """The package's own arm (``LEGACY_ROBOT``), seen at ``image_size`` (0: not known)."""
    return RobotRecord.from_json(dict(LEGACY_ROBOT, image_size=image_size))


def read_robot_record(checkpoint: Path | str) -> RobotRecord | None:
    """The record in ``checkpoint/model.json`` (the package arm's for checkpoints without one); for
    any other directory (a Hugging Face, OpenVLA or LeRobot model, a family registered from outside
    the package) the ``robot`` entry of its ``vla_spec.json``, None when it has none. Raises
    ValueError naming the file when it is
    missing, unreadable or its record malformed, and saying so when the directory does not exist
    or is the example parameter files' placeholder."""
    directory = Path(checkpoint)
    problem = checkpoint_problem(directory)
    if problem:
        raise ValueError(f"{directory}: {problem}")
    if not (directory / META_FILE).is_file():
        return _hf_robot_record(directory / HF_SPEC_FILE)
    meta_path = directory / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{meta_path}: cannot read the checkpoint's metadata: {err}") from err
    try:
        if not isinstance(meta, dict):
            raise TypeError("top level must be a JSON object")
        if ROBOT_KEY in meta:
            return RobotRecord.from_json(meta[ROBOT_KEY])
        config = meta.get("config", {})
        return package_robot(int(config.get("image_size", 0)) if isinstance(config, dict) else 0)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{meta_path}: {err}") from err


def _hf_robot_record(spec_path: Path) -> RobotRecord | None:
    if not spec_path.is_file():
        return None
    try:
        spec = json.loads(spec_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{spec_path}: cannot read it: {err}") from err
    if not isinstance(spec, dict) or ROBOT_KEY not in spec:
        return None
    try:
        return RobotRecord.from_json(spec[ROBOT_KEY])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{spec_path}: {err}") from err


def robot_differences(made_for: RobotRecord, in_use: RobotRecord) -> list[str]:
    """Each way ``in_use`` differs from ``made_for``, as "what: checkpoint X, in use Y"."""
    out = []

    def differ(what: str, a: Any, b: Any) -> None:
        out.append(f"{what}: checkpoint {a}, in use {b}")

    if made_for.dof != in_use.dof:
        differ("arm DOF", made_for.dof, in_use.dof)
    if made_for.joint_names != in_use.joint_names:
        differ("joint names", list(made_for.joint_names), list(in_use.joint_names))
    if made_for.tcp_frame != in_use.tcp_frame:
        differ("TCP frame", repr(made_for.tcp_frame), repr(in_use.tcp_frame))
    if (made_for.control_rate_hz and in_use.control_rate_hz
            and not math.isclose(made_for.control_rate_hz, in_use.control_rate_hz, rel_tol=1e-6)):
        differ("policy rate (1/action_dt_s)", f"{made_for.control_rate_hz:g} Hz", f"{in_use.control_rate_hz:g} Hz")
    if made_for.image_size and in_use.image_size and made_for.image_size != in_use.image_size:
        differ("image size", f"{made_for.image_size}px", f"{in_use.image_size}px")
    return out


def check_robot(made_for: RobotRecord | None, in_use: RobotRecord, *, allow_unmatched: bool = False,
                source: str = "the checkpoint") -> str:
    """'' when ``in_use`` is the robot ``made_for`` describes; otherwise the warning to report.
    ``made_for`` None (a Hugging Face VLA that records no robot) cannot be checked: a warning.

    Raises RobotMismatch, with both sides named, for a different DOF (always) or any other
    difference unless ``allow_unmatched``."""
    if made_for is None:
        return (f"{source} does not record the robot it was made for, so nothing checks it against this "
                f"{in_use.dof}-DoF arm (add a '{ROBOT_KEY}' entry to its {HF_SPEC_FILE})")
    differences = robot_differences(made_for, in_use)
    if not differences:
        return ""
    both = f"{source[:1].upper()}{source[1:]} was made for a {made_for.describe()}; in use: a {in_use.describe()}"
    if made_for.dof != in_use.dof:
        raise RobotMismatch(f"refusing to drive a {in_use.dof}-DoF arm with a policy made for {made_for.dof} "
                            f"DoF ({'; '.join(differences)}). {both}")
    if not allow_unmatched:
        raise RobotMismatch(f"the robot differs from the one {source} was made for ({'; '.join(differences)}). "
                            f"{both}. Set allow_unmatched_robot to true to run it anyway")
    return f"robot differs from the checkpoint's ({'; '.join(differences)}); running with allow_unmatched_robot"


def check_checkpoint_robot(checkpoint: Path | str, joint_names: tuple[str, ...] | list[str], tcp_frame: str, *,
                           action_dt_s: float = 0.0, image_size: int = 0, allow_unmatched: bool = False) -> str:
    """:func:`check_robot` of the record in the checkpoint directory ``checkpoint`` against the arm
    in use (its joints and TCP frame, the policy step and the image size fed to the model)."""
    in_use = robot_in_use(joint_names, tcp_frame, action_dt_s=action_dt_s, image_size=image_size)
    return check_robot(read_robot_record(checkpoint), in_use, allow_unmatched=allow_unmatched,
                       source=f"checkpoint '{checkpoint}'")
