"""The control node's commands, one publisher class per output format, chosen once at configure
(:func:`command_publishers`):

- ``forward_position``: Float64MultiArray on ``<controller>/commands``, in ``controller_joints`` order;
- ``joint_trajectory``: one point, one period ahead, on ``<controller>/joint_trajectory`` (a zero
  header stamp: joint_trajectory_controller starts it now);
- ``joint_state``: sensor_msgs/JointState on ``joint_command_topic``, the arm then the fingers,
  stamped with the node's clock;

and the fingers' Float64MultiArray on ``<gripper_controller>/commands`` when the arm has fingers and
a gripper controller is named. Each wraps one publisher the node made (``make``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from builtin_interfaces.msg import Duration
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_accel_ros.core.controller import TickResult
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.ros.parameters import NodeConfig

MakePublisher = Callable[[type, str], Any]  # (message type, topic) -> an rclpy publisher


class CommandPublisher(Protocol):
    publisher: Any  # the rclpy publisher it publishes on

    def publish(self, result: TickResult) -> None:
        """Publish the command of ``result`` (a tick with a ``q_command``)."""


class _ArmCommand:
    """The arm's positions in the controller's joint order."""

    def __init__(self, publisher: Any, kin: ArmKinematics, joints: tuple[str, ...]) -> None:
        self.publisher = publisher
        self.kin = kin
        self.joints = joints

    def positions(self, result: TickResult) -> list[float]:
        assert result.q_command is not None
        return self.kin.to_named(result.q_command, self.joints).tolist()


class ForwardPosition(_ArmCommand):
    def publish(self, result: TickResult) -> None:
        self.publisher.publish(Float64MultiArray(data=self.positions(result)))


class JointTrajectoryCommand(_ArmCommand):
    def __init__(self, publisher: Any, kin: ArmKinematics, joints: tuple[str, ...], period_s: float) -> None:
        super().__init__(publisher, kin, joints)
        self.time_from_start = Duration(sec=int(period_s), nanosec=int((period_s % 1.0) * 1e9))

    def publish(self, result: TickResult) -> None:
        point = JointTrajectoryPoint(positions=self.positions(result), time_from_start=self.time_from_start)
        self.publisher.publish(JointTrajectory(joint_names=list(self.joints), points=[point]))


class JointStateCommand(_ArmCommand):
    def __init__(self, publisher: Any, kin: ArmKinematics, joints: tuple[str, ...], clock: Any) -> None:
        super().__init__(publisher, kin, joints)
        self.clock = clock  # the node's (rclpy Clock)

    def publish(self, result: TickResult) -> None:
        msg = JointState(name=list(self.joints) + list(self.kin.gripper_joint_names),
                         position=self.positions(result) + result.finger_positions.tolist())
        msg.header.stamp = self.clock.now().to_msg()
        self.publisher.publish(msg)


class GripperCommand:
    """The finger positions (none published for a tick without them)."""

    def __init__(self, publisher: Any) -> None:
        self.publisher = publisher

    def publish(self, result: TickResult) -> None:
        fingers = result.finger_positions.tolist()
        if fingers:
            self.publisher.publish(Float64MultiArray(data=fingers))


def command_publishers(cfg: NodeConfig, kin: ArmKinematics, joints: tuple[str, ...], make: MakePublisher,
                       clock: Any) -> list[CommandPublisher]:
    """The arm's publisher for ``cfg.output``, then the gripper's when there is one."""
    controller = cfg.controller.strip("/")
    arm: CommandPublisher
    if cfg.output == "forward_position":
        arm = ForwardPosition(make(Float64MultiArray, f"{controller}/commands"), kin, joints)
    elif cfg.output == "joint_trajectory":
        arm = JointTrajectoryCommand(make(JointTrajectory, f"{controller}/joint_trajectory"), kin, joints,
                                     cfg.period_s)
    else:
        arm = JointStateCommand(make(JointState, cfg.joint_command_topic), kin, joints, clock)
    gripper = cfg.gripper_controller.strip("/")
    if gripper and kin.gripper_joint_names:
        return [arm, GripperCommand(make(Float64MultiArray, f"{gripper}/commands"))]
    return [arm]
