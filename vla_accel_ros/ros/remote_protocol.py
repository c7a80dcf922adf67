"""The wire format of remote inference over the ROS graph, in standard messages only (no custom interfaces).

The control node (``inference_mode: remote``) publishes each observation it wants decoded, and the
inference node (``vla_inference_node``) answers with the actions for it. Topic names are relative:
both sides resolve them in the robot's namespace.

- ``vla_inference/observation/image`` (sensor_msgs/Image, rgb8): the model image; ``header.stamp``
  is the observation's stamp on the control node's clock. Or, with ``remote_compressed_image``,
  ``vla_inference/observation/image/compressed`` (sensor_msgs/CompressedImage, JPEG): a tenth of
  the bytes on a slow link, at the cost of JPEG's loss.
- ``vla_inference/observation/state`` (sensor_msgs/JointState): the arm joints by name, then
  ``gripper`` (finger opening, m); the same stamp. The image and the state of one observation are
  paired by that stamp.
- ``vla_inference/instruction`` (std_msgs/String, latched): the task.
- ``vla_inference/action`` (trajectory_msgs/JointTrajectory): the chunk, a first-class message on the
  graph. ``header.stamp`` is the observation's stamp, so the control node aligns the chunk and judges
  its freshness on its own clock whatever the hosts' clock offset; ``joint_names`` are the action's
  dimensions (``dx dy dz droll dpitch dyaw gripper``: end-effector deltas and the gripper command);
  point k holds action k at ``time_from_start`` k action steps after the observation (one action:
  one point). The decode statistics (target passes, accepted tokens, drafted tokens, decode
  milliseconds) ride in the first point's ``effort``, which an action trajectory has no other use for.

QoS: observations best effort, depth 1 (a late image is worth nothing); actions reliable, depth 1.
"""

from __future__ import annotations

import cv2
import numpy as np
from builtin_interfaces.msg import Duration, Time
from sensor_msgs.msg import CompressedImage, Image, JointState
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_accel_ros.core.actions import ACTION_DIM, ACTION_NAMES
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.runtime.remote_worker import RemoteAction, observation_key

IMAGE_TOPIC = "vla_inference/observation/image"
COMPRESSED_IMAGE_TOPIC = "vla_inference/observation/image/compressed"
JPEG_QUALITY = 90
STATE_TOPIC = "vla_inference/observation/state"
INSTRUCTION_TOPIC = "vla_inference/instruction"
ACTION_TOPIC = "vla_inference/action"
GRIPPER_NAME = "gripper"
STAT_KEYS = ("target_passes", "accepted_len", "drafted", "decode_ms")


def to_time(stamp: float) -> Time:
    sec, nanosec = observation_key(stamp)
    return Time(sec=sec, nanosec=nanosec)


def from_time(time: Time) -> float:
    return time.sec + time.nanosec * 1e-9


def stamp_key(time: Time) -> tuple[int, int]:
    """An exact key for pairing the messages of one observation (and its answer): the
    :func:`~vla_accel_ros.runtime.remote_worker.observation_key` of the observation they carry."""
    return int(time.sec), int(time.nanosec)


def image_message(obs: Observation) -> Image:
    image = np.ascontiguousarray(obs.image, dtype=np.uint8)
    h, w = image.shape[:2]
    msg = Image(height=h, width=w, encoding="rgb8", step=3 * w, data=image.tobytes())
    msg.header.stamp = to_time(obs.stamp)
    return msg


def compressed_image_message(obs: Observation, quality: int = JPEG_QUALITY) -> CompressedImage:
    bgr = cv2.cvtColor(np.ascontiguousarray(obs.image, dtype=np.uint8), cv2.COLOR_RGB2BGR)
    ok, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError(f"cannot JPEG-encode an image of shape {obs.image.shape}")
    msg = CompressedImage(format="jpeg", data=data.tobytes())
    msg.header.stamp = to_time(obs.stamp)
    return msg


def state_message(obs: Observation, joint_names: tuple[str, ...] | list[str]) -> JointState:
    msg = JointState(name=[*joint_names, GRIPPER_NAME],
                     position=[*np.asarray(obs.joint_pos, dtype=float).tolist(), float(obs.gripper)])
    msg.header.stamp = to_time(obs.stamp)
    return msg


def observation_from(image: np.ndarray, state: JointState, instruction: str,
                     joint_names: tuple[str, ...] | list[str]) -> Observation:
    """The observation of a state message (joints by name, then the gripper) and its image;
    ValueError naming a missing joint."""
    positions = dict(zip(state.name, state.position))
    missing = [n for n in (*joint_names, GRIPPER_NAME) if n not in positions]
    if missing:
        raise ValueError(f"observation state lacks {missing} (has {list(state.name)})")
    q = np.array([positions[n] for n in joint_names], dtype=float)
    return Observation(image, instruction, q, float(positions[GRIPPER_NAME]), from_time(state.header.stamp))


def action_message(actions: np.ndarray, stamp: Time, stats: dict[str, float],
                   action_dt_s: float = 0.05) -> JointTrajectory:
    """The answer to the observation stamped ``stamp``: the chunk (H, 7) as a trajectory of the
    action's dimensions, one point per action step, and the decode statistics."""
    actions = np.asarray(actions, dtype=float).reshape(-1, ACTION_DIM)
    msg = JointTrajectory(joint_names=list(ACTION_NAMES))
    msg.header.stamp = stamp
    for k, action in enumerate(actions):
        offset = k * action_dt_s
        point = JointTrajectoryPoint(positions=action.tolist(),
                                     time_from_start=Duration(sec=int(offset), nanosec=int(round(offset % 1 * 1e9))))
        msg.points.append(point)
    msg.points[0].effort = [float(stats.get(key, 0.0)) for key in STAT_KEYS]
    return msg


def action_from(msg: JointTrajectory) -> RemoteAction:
    """The chunk of an action message; ValueError when it is not one (other dimensions, a point of
    the wrong width, no point, values not finite)."""
    if list(msg.joint_names) != list(ACTION_NAMES):
        raise ValueError(f"action trajectory's joint_names must be {list(ACTION_NAMES)}, "
                         f"got {list(msg.joint_names)[:8]}")
    if not msg.points:
        raise ValueError("action trajectory has no point")
    widths = {len(p.positions) for p in msg.points}
    if widths != {ACTION_DIM}:
        raise ValueError(f"action trajectory points must hold {ACTION_DIM} positions, got {sorted(widths)}")
    actions = np.array([list(p.positions) for p in msg.points], dtype=float)
    if not np.all(np.isfinite(actions)):
        raise ValueError("action trajectory holds non-finite values")
    effort = list(msg.points[0].effort)
    stats = {key: float(v) for key, v in zip(STAT_KEYS, effort, strict=False)}
    return RemoteAction(actions, from_time(msg.header.stamp), stats, stamp_key(msg.header.stamp))
