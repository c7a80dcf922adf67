"""The node refuses a checkpoint made for another robot at start-up, and runs a same-DOF arm only
with ``allow_unmatched_robot``, saying so on /diagnostics (over DDS)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

from vla_accel_ros.core.robot_record import RobotMismatch
from vla_accel_ros.ros.node import VlaAccelNode

SIX = [f"xarm_joint{i}" for i in range(1, 7)]
SEVEN = [f"fr3_joint{i}" for i in range(1, 8)]
PACKAGE_ARM = [f"joint{i}" for i in range(1, 8)]
_domains = iter(range(150, 160))


def params(tmp_path, tiny_checkpoint, foreign_arm, joints, tcp, **extra) -> list[Parameter]:
    urdf = tmp_path / "arm.urdf"
    urdf.write_text(foreign_arm(joints, tcp))
    values = {"inference": True, "inference_mode": "thread", "checkpoint": str(tiny_checkpoint(tmp_path / "ckpt")),
              "urdf_file": str(urdf), "tcp_frame": tcp, "autostart": True, "instruction": "pick up the red cube",
              "robot_description_timeout_s": 0.0, "stats_rate_hz": 10.0} | extra
    return [Parameter(k, value=v) for k, v in values.items()]


@pytest.mark.parametrize("joints, tcp, allow, words", [
    (SIX, "tcp", False, ["6-DoF", "7 DoF", "xarm_joint1", "joint7"]),
    (SIX, "tcp", True, ["6-DoF", "7 DoF"]),  # a different DOF never starts
    (SEVEN, "fr3_hand_tcp", False, ["fr3_joint1", "joint1", "'fr3_hand_tcp'", "'tcp'", "allow_unmatched_robot"]),
    (PACKAGE_ARM, "hand", False, ["TCP frame", "'hand'", "'tcp'"]),
], ids=["6dof", "6dof-allowed", "other-7dof", "other-tcp"])
def test_a_robot_the_checkpoint_was_not_made_for_is_refused_naming_both(
        tmp_path, tiny_checkpoint, foreign_arm, ros_context, joints, tcp, allow, words):
    with ros_context(next(_domains)) as context:
        overrides = params(tmp_path, tiny_checkpoint, foreign_arm, joints, tcp, allow_unmatched_robot=allow)
        with pytest.raises(RobotMismatch) as err:
            VlaAccelNode(context=context, parameter_overrides=overrides)
    for word in words:
        assert word in str(err.value)


def test_main_exits_2_for_a_6dof_arm(tmp_path, tiny_checkpoint, foreign_arm):
    urdf = tmp_path / "xarm6.urdf"
    urdf.write_text(foreign_arm(SIX, "tcp"))
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    proc = subprocess.run([sys.executable, "-m", "vla_accel_ros.ros.node", "--ros-args", "-p", f"urdf_file:={urdf}",
                           "-p", f"checkpoint:={ckpt}", "-p", "autostart:=true", "-p", "inference_mode:=thread"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, ROS_DOMAIN_ID="158"))
    assert proc.returncode == 2, proc.stderr
    assert "refusing to start" in proc.stderr and "6-DoF" in proc.stderr and "7 DoF" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_same_dof_arm_runs_with_allow_unmatched_robot_and_diagnostics_warn(
        tmp_path, tiny_checkpoint, foreign_arm, dds_rig):
    rig = dds_rig(next(_domains), "robot")
    node = VlaAccelNode(context=rig.context, parameter_overrides=params(
        tmp_path, tiny_checkpoint, foreign_arm, SEVEN, "fr3_hand_tcp", allow_unmatched_robot=True))
    diagnostics: list = []
    commands: list = []
    rig.peer.create_subscription(DiagnosticArray, "/diagnostics", diagnostics.append, 10)
    rig.peer.create_subscription(Float64MultiArray, "/arm_controller/commands", commands.append, 10)
    joints = rig.peer.create_publisher(JointState, "/joint_states", 10)
    camera = rig.peer.create_publisher(Image, "/camera/image_raw", 10)
    image = Image(height=64, width=64, encoding="rgb8", step=64 * 3, data=np.full(64 * 64 * 3, 90, np.uint8).tobytes())

    def feed() -> None:
        names = [*SEVEN, "finger_l_joint", "finger_r_joint"]
        while not rig.stop.is_set():
            joints.publish(JointState(name=names, position=[0.1] * 7 + [0.02, 0.02]))
            camera.publish(image)
            rig.stop.wait(0.02)

    rig.spin(node, feed=feed)
    try:
        assert rig.wait(lambda: len(commands) >= 5 and diagnostics, timeout=30.0)
        assert rig.wait(lambda: any(m.status[0].level == DiagnosticStatus.WARN
                                    and "robot differs" in m.status[0].message
                                    for m in diagnostics), timeout=10.0), [m.status[0].message for m in diagnostics]
        assert "fr3_hand_tcp" in node.stats()["robot_warning"]
    finally:
        rig.close()


def test_vla_accel_sim_exits_2_with_the_nodes_reason_for_a_6dof_checkpoint(tmp_path, tiny_checkpoint, capsys):
    """The checkpoint says 6 DoF, the sim's arm has 7: the node refuses, and the command says why."""
    import json

    from vla_accel_ros.cli import main as cli_main

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    meta = json.loads((ckpt / "model.json").read_text())
    meta["robot"] = dict(meta["robot"], dof=6, joint_names=SIX)
    (ckpt / "model.json").write_text(json.dumps(meta))
    rc = cli_main(["sim", "--episodes", "1", "--checkpoint", str(ckpt), "--out", str(tmp_path / "run"),
                   "--domain-id", "159", "--inference-mode", "thread"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "refusing to start" in err and "6 DoF" in err and "7-DoF" in err
