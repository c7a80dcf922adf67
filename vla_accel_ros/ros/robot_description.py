"""Where the control node's arm comes from, in this order: the ``robot_description`` parameter,
``urdf_file``, the ``robot_description`` topic (latched; waited for up to
``robot_description_timeout_s``), the package's URDF. With the package's URDF in use for want of a
description, one published later is checked against it (:func:`description_mismatch`).

Falling back to the package's URDF is a WARN naming the topic that stayed silent and the file used.
When that URDF cannot serve the parameters (a params file made for another arm: its ``tcp_frame``
is not in it), the refusal says first that no robot_description was received, the real cause.
"""

from __future__ import annotations

from dataclasses import dataclass

from rclpy.node import Node
from rclpy.wait_for_message import wait_for_message
from std_msgs.msg import String

from vla_accel_ros.core.convert import kinematics_difference
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS

ROBOT_DESCRIPTION_TOPIC = "robot_description"  # relative: robot_state_publisher in the same namespace


@dataclass(frozen=True)
class Arm:
    kin: ArmKinematics
    source: str  # where its URDF came from, for the log
    fallback: bool  # the package's URDF, no description being given


def load_arm(node: Node, cfg: NodeConfig) -> Arm:
    """The arm of ``cfg``'s first URDF source that gives one; ConfigError naming the source of a bad URDF."""
    fallback = False
    if cfg.robot_description.strip():
        urdf, source = cfg.robot_description, "parameter robot_description"
    elif cfg.urdf_file:
        urdf, source = cfg.urdf_file, f"urdf_file {cfg.urdf_file}"
    else:
        xml = _wait_robot_description(node, cfg.robot_description_timeout_s)
        topic = node.resolve_topic_name(ROBOT_DESCRIPTION_TOPIC)
        urdf, source = (xml, f"topic {topic}") if xml else (str(default_urdf()), f"the package's URDF {default_urdf()}")
        fallback = not xml
        if fallback:
            node.get_logger().warn(f"{no_description(topic, cfg.robot_description_timeout_s)}: using {source}")
    try:
        return Arm(ArmKinematics(urdf, tcp_frame=cfg.tcp_frame), source, fallback)
    except ValueError as err:
        if fallback:  # the package's arm7 cannot serve these parameters: the missing description is the cause
            raise ConfigError(f"{no_description(topic, cfg.robot_description_timeout_s)}, and the fallback, "
                              f"{source}, does not fit the parameters ({err}): publish the arm's "
                              f"robot_description (robot_state_publisher) or set urdf_file") from err
        raise ConfigError(f"bad URDF from {source}: {err}") from err


def no_description(topic: str, timeout_s: float) -> str:
    """What the node says when no description arrived on ``topic``."""
    waited = f"within {timeout_s:g} s" if timeout_s > 0 else "(robot_description_timeout_s is 0: not waited for)"
    return f"no robot_description received on {topic} {waited}"


def _wait_robot_description(node: Node, timeout_s: float) -> str:
    """The latched robot description, waited for without an executor (configure may run inside
    one of the executor's callbacks); '' when none came."""
    if timeout_s <= 0:
        return ""
    received, msg = wait_for_message(String, node, ROBOT_DESCRIPTION_TOPIC, qos_profile=LATCHED_QOS,
                                     time_to_wait=timeout_s)
    return msg.data if received and msg is not None else ""


def description_mismatch(kin: ArmKinematics, urdf: str, tcp_frame: str) -> str:
    """'' when the URDF XML ``urdf`` describes the arm ``kin``, else what differs (or why it is no
    usable URDF)."""
    try:
        return kinematics_difference(kin, ArmKinematics(urdf, tcp_frame=tcp_frame))
    except ValueError as err:
        return f"is not a usable URDF: {err}"
