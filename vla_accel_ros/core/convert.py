"""Message conversion on numpy, for the node and for replay: camera images in any common encoding (raw
or compressed) to RGB at the model's size, joint states by name to the arm's order, and a
comparison of two arms' kinematics. Reads message fields only (rclpy's messages or rosbags' with the
same fields); imports no ROS package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from vla_accel_ros.core.kinematics import ArmKinematics

if TYPE_CHECKING:
    from sensor_msgs.msg import CompressedImage, Image


# --- message conversion (no per-pixel Python) ----------------------------------------------------
def _resize(rgb: np.ndarray, size: int) -> np.ndarray:
    if rgb.shape[:2] != (size, size):
        # INTER_AREA averages the source pixels: no aliasing when a camera image shrinks.
        rgb = cv2.resize(rgb, (size, size), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(rgb)


def image_to_rgb(msg: Image, size: int) -> np.ndarray:
    """sensor_msgs/Image -> RGB uint8 (size, size, 3); ValueError naming what is wrong."""
    encoding = msg.encoding.lower()
    if encoding not in ENCODINGS:
        raise ValueError(f"unsupported image encoding '{msg.encoding}' (supported: {', '.join(ENCODINGS)})")
    channels, conversion = ENCODINGS[encoding]
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if h <= 0 or w <= 0:
        raise ValueError(f"image has size {w}x{h}")
    if step < w * channels:
        raise ValueError(f"image step {step} is smaller than width {w} x {channels} channels of {encoding}")
    if len(msg.data) < h * step:
        raise ValueError(f"image data ({len(msg.data)} bytes, step {step}) too small for {w}x{h} {encoding}")
    if len(msg.data) != h * step:  # sensor_msgs/Image: data is exactly step x height bytes
        raise ValueError(f"image data length {len(msg.data)} does not match step {step} x height {h} = {h * step}")
    rows = np.frombuffer(msg.data, dtype=np.uint8, count=h * step).reshape(h, step)
    pixels = rows[:, : w * channels].reshape(h, w, channels)
    rgb = pixels if conversion is None else cv2.cvtColor(pixels, conversion)
    return _resize(rgb, size)


def compressed_to_rgb(msg: CompressedImage, size: int) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg/png) -> RGB uint8 (size, size, 3)."""
    if len(msg.data) == 0:
        raise ValueError(f"compressed image (format '{msg.format}') has no data")
    try:
        bgr = cv2.imdecode(np.frombuffer(msg.data, dtype=np.uint8), cv2.IMREAD_COLOR)
    except cv2.error:  # OpenCV asserts on some malformed headers instead of returning None
        bgr = None
    if bgr is None:
        raise ValueError(f"cannot decode compressed image (format '{msg.format}', {len(msg.data)} bytes)")
    return _resize(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), size)


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


# encoding -> (channels, OpenCV conversion to RGB or None)
ENCODINGS: dict[str, tuple[int, int | None]] = {
    "rgb8": (3, None),
    "bgr8": (3, cv2.COLOR_BGR2RGB),
    "rgba8": (4, cv2.COLOR_RGBA2RGB),
    "bgra8": (4, cv2.COLOR_BGRA2RGB),
    "mono8": (1, cv2.COLOR_GRAY2RGB),
}


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
