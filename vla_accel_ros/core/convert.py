"""Message conversion on numpy, for the node and for replay: camera images in any common encoding (raw
or compressed) to RGB at the model's size (bounded, from ``core/images.py``), joint states by name
to the arm's order, and a comparison of two arms' kinematics. Reads message fields only (rclpy's
messages or rosbags' with the same fields); imports no ROS package.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vla_accel_ros.core.images import ENCODINGS, compressed_to_rgb, image_to_rgb
from vla_accel_ros.core.kinematics import ArmKinematics

__all__ = ["ENCODINGS", "compressed_to_rgb", "controller_joint_order", "image_to_rgb", "joint_state_to_arm",
           "kinematics_difference"]


def joint_state_to_arm(kin: ArmKinematics, names: Any, positions: Any) -> tuple[np.ndarray, float | None]:
    """JointState names/positions (any order, extra joints, no velocity or effort needed) -> arm
    positions in URDF order and the mean finger opening (None without finite finger values);
    ValueError naming what is wrong (lengths, duplicated or missing arm joints, NaN/inf)."""
    names, positions = list(names), [float(p) for p in positions]
    if len(names) != len(positions):
        raise ValueError(f"{len(names)} joint names but {len(positions)} positions")
    doubled = sorted({n for n in names if n in kin.joint_names and names.count(n) > 1})
    if doubled:
        raise ValueError(f"arm joint(s) named more than once: {', '.join(doubled)}")
    q = kin.from_named(names, positions)  # MissingJointsError names the missing arm joints
    bad = [f"{n}={v}" for n, v in zip(kin.joint_names, q) if not np.isfinite(v)]
    if bad:
        raise ValueError(f"non-finite joint positions: {', '.join(bad)}")
    fingers = [p for n, p in zip(names, positions) if n in kin.gripper_joint_names and np.isfinite(p)]
    return q, (float(np.mean(fingers)) if fingers else None)


def kinematics_difference(a: ArmKinematics, b: ArmKinematics) -> str:
    """'' if ``b`` describes the same arm as ``a`` (joints, limits, geometry), else what differs."""
    if tuple(a.joint_names) != tuple(b.joint_names):
        return f"names arm joints {list(b.joint_names)}, not {list(a.joint_names)}"
    if tuple(a.gripper_joint_names) != tuple(b.gripper_joint_names):
        return f"names gripper joints {list(b.gripper_joint_names)}, not {list(a.gripper_joint_names)}"
    for name in ("lower", "upper", "velocity"):
        if not np.allclose(getattr(a.limits, name), getattr(b.limits, name), equal_nan=True):
            return f"has other {name} joint limits ({getattr(b.limits, name)} vs {getattr(a.limits, name)})"
    q = np.clip(np.zeros(a.n), a.limits.lower, a.limits.upper) + 0.1 * np.arange(a.n) / a.n
    pa, pb = a.fk(q), b.fk(q)
    if not (np.allclose(pa.position, pb.position, atol=1e-9) and np.allclose(pa.rotation, pb.rotation, atol=1e-9)):
        return "has other link geometry (its forward kinematics differ)"
    return ""


def controller_joint_order(kin: ArmKinematics, names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The arm controller's joint order: ``names`` (each arm joint once) or, empty, the URDF's arm
    order. ValueError naming the unknown and the missing joints otherwise."""
    names = tuple(names) or tuple(kin.joint_names)
    unknown = [n for n in names if n not in kin.joint_names]
    missing = [n for n in kin.joint_names if n not in names]
    if unknown or missing:
        raise ValueError(f"parameter 'controller_joints' must list each arm joint once; unknown: {unknown}, "
                         f"missing: {missing}; arm joints are {list(kin.joint_names)}")
    return names
