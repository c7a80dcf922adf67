"""``sim_node``: the MuJoCo pick-cube sim as a ROS 2 robot.

Physics runs in its own thread at ``joint_state_rate_hz``, paced to ``real_time_factor`` sim
seconds per wall second (0 = as fast as possible). The bridge is the clock source: ``/clock``
carries its time, which starts at the wall time of start-up and never goes back, so header stamps
are sensible whether or not the other nodes use sim time.

Topic names are relative (they resolve in the node's namespace), except ``/clock``:

- publishes ``joint_states`` (arm + finger joints), ``camera/image_raw`` (rgb8, at
  ``camera_rate_hz``), ``/clock``, ``robot_description`` (transient local), ``~/episode`` (JSON:
  seed, color, instruction, success, steps, duration_s, min_clearance_m), ``~/success``
  (std_msgs/Bool, once per episode) and the episode's instruction on ``instruction_topic``;
- applies commands in every output format of ``vla_accel_node``: ``<controller>/commands``
  (Float64MultiArray in ``controller_joints`` order), ``<controller>/joint_trajectory`` (last
  point), ``joint_command_topic`` (JointState by name), ``<gripper_controller>/commands``;
- ``~/reset`` (std_msgs/String JSON ``{"seed": 3, "color": "red"}``, both optional) starts an episode.
  With ``start_episode`` the first episode starts when the first arm command arrives: the policy
  node is then configured and active, so no episode time passes while it loads.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from typing import Any

import numpy as np
import rclpy
from builtin_interfaces.msg import Time
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_accel_ros.core.convert import controller_joint_order
from vla_accel_ros.ros.parameters import SimBridgeConfig
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS, declare_config, run_node
from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
from vla_accel_ros.sim.settle import settling_after_reset

NODE_NAME = "sim_node"
INSTRUCTION_REPEAT_S = 1.0  # re-publish the instruction so a late subscriber gets it


def _stamp(t: float) -> Time:
    sec = math.floor(t)
    return Time(sec=int(sec), nanosec=min(int(round((t - sec) * 1e9)), 999_999_999))


class SimBridgeNode(Node):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.cfg: SimBridgeConfig = declare_config(self, SimBridgeConfig)
        cfg = self.cfg
        rate = cfg.joint_state_rate_hz
        self.env = PickCubeEnv(SimConfig(
            image_size=cfg.image_size, control_hz=rate, max_steps=max(1, int(round(cfg.episode_duration_s * rate))),
            wrist_camera=cfg.wrist_camera, success_hold_steps=max(1, int(round(cfg.success_hold_s * rate))),
        ))
        self.kin = self.env.kin
        self._max_opening = float(self.kin.gripper_limits.upper.max()) if self.kin.gripper_joint_names else 0.0
        self.controller_joints = controller_joint_order(self.kin, cfg.controller_joints)

        self._lock = threading.Lock()
        self._q_cmd: np.ndarray | None = None
        self._gripper_cmd: float | None = None
        self._pending_reset: dict[str, Any] | None = None
        self._episode: dict[str, Any] | None = None
        self.commands_received = 0
        self.commands_rejected = 0
        # Sim time continues across episodes (env time restarts at 0 on reset).
        self._time0 = time.time()
        self._elapsed = 0.0

        self._pub_joints = self.create_publisher(JointState, "joint_states", 10)
        self._pub_image = self.create_publisher(Image, "camera/image_raw", 10)
        # the wrist camera, a second image slot, rendered at the same instant as the scene camera
        self._pub_wrist = (self.create_publisher(Image, cfg.wrist_image_topic, 10)
                           if cfg.wrist_image_topic else None)
        self._pub_clock = self.create_publisher(Clock, "/clock", 10)
        self._pub_description = self.create_publisher(String, "robot_description", LATCHED_QOS)
        self._pub_episode = self.create_publisher(String, "~/episode", 10)
        self._pub_success = self.create_publisher(Bool, "~/success", 10)
        # Latched: a recorder or node that joins after the episode began still gets the task.
        self._pub_instruction = self.create_publisher(String, cfg.instruction_topic, LATCHED_QOS)
        self._pub_description.publish(String(data=self.kin.urdf_xml))

        controller, gripper = cfg.controller.strip("/"), cfg.gripper_controller.strip("/")
        self.create_subscription(Float64MultiArray, f"{controller}/commands", self._on_forward, 10)
        self.create_subscription(JointTrajectory, f"{controller}/joint_trajectory", self._on_trajectory, 10)
        self.create_subscription(JointState, cfg.joint_command_topic, self._on_joint_command, 10)
        if gripper:
            self.create_subscription(Float64MultiArray, f"{gripper}/commands", self._on_gripper, 10)
        self.create_subscription(String, "~/reset", self._on_reset, 10)

        # Always start from the task's initial scene (an un-reset MuJoCo model has every joint at 0,
        # outside the URDF limits); with start_episode the first command turns it into an episode.
        self._pending_reset = {"seed": cfg.seed, "color": cfg.color or None, "episode": False}
        self._first_episode_waiting = cfg.start_episode
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._physics_loop, name="sim_physics", daemon=True)
        self._thread.start()
        self.get_logger().info(f"MuJoCo bridge: physics {rate:g} Hz, camera {cfg.camera_rate_hz:g} Hz, "
                               f"real-time factor {cfg.real_time_factor:g}")

    # --- time ---------------------------------------------------------------------------------
    @property
    def sim_time(self) -> float:
        return self._time0 + self._elapsed

    # --- commands (executor thread) -----------------------------------------------------------
    def _reject(self, message: str) -> None:
        self.commands_rejected += 1
        self.get_logger().warn(message, throttle_duration_sec=2.0)

    def _set_arm(self, q: np.ndarray) -> None:
        if q.shape != (self.kin.n,) or not np.all(np.isfinite(q)):
            self._reject(f"arm command rejected: expected {self.kin.n} finite positions, got {q}")
            return
        with self._lock:
            if self._first_episode_waiting:  # the policy node is up: the first episode starts now
                self._first_episode_waiting = False
                self._pending_reset = {"seed": self.cfg.seed, "color": self.cfg.color or None}
                self.get_logger().info("first arm command received: starting the first episode")
                return  # a command for the pre-episode scene must not move the episode's arm
            self._q_cmd = q
            self.commands_received += 1

    def _set_gripper_positions(self, positions: list[float]) -> None:
        if not positions or not np.all(np.isfinite(positions)) or self._max_opening <= 0:
            self._reject(f"gripper command rejected: {positions}")
            return
        with self._lock:
            self._gripper_cmd = float(np.clip(np.mean(positions) / self._max_opening, 0.0, 1.0))

    def _on_forward(self, msg: Float64MultiArray) -> None:
        if len(msg.data) != len(self.controller_joints):  # ros2_control drops these too
            self._reject(f"/commands has {len(msg.data)} values, "
                         f"the controller has {len(self.controller_joints)} joints")
            return
        self._set_arm(self.kin.from_named(self.controller_joints, list(msg.data)))

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        if not msg.points:
            self._reject("joint_trajectory without points")
            return
        try:
            self._set_arm(self.kin.from_named(msg.joint_names, list(msg.points[-1].positions)))
        except ValueError as err:
            self._reject(f"joint_trajectory rejected: {err}")

    def _on_joint_command(self, msg: JointState) -> None:
        try:
            self._set_arm(self.kin.from_named(msg.name, list(msg.position)))
        except ValueError as err:
            self._reject(f"joint command rejected: {err}")
            return
        fingers = [p for n, p in zip(msg.name, msg.position) if n in self.kin.gripper_joint_names]
        if fingers:
            self._set_gripper_positions(fingers)

    def _on_gripper(self, msg: Float64MultiArray) -> None:
        self._set_gripper_positions(list(msg.data))

    def _on_reset(self, msg: String) -> None:
        try:
            request = json.loads(msg.data) if msg.data.strip() else {}
            if not isinstance(request, dict):
                raise ValueError("expected a JSON object")
            seed = int(request.get("seed", self.cfg.seed))
            color = request.get("color") or None
        except (ValueError, TypeError) as err:
            self._reject(f"reset rejected: {err}: {msg.data!r}")
            return
        with self._lock:
            self._pending_reset = {"seed": seed, "color": color}

    # --- physics (own thread) -----------------------------------------------------------------
    def _physics_loop(self) -> None:
        try:
            self._physics()
        finally:  # the GL context belongs to this thread: release it here
            self.env.close()

    def _physics(self) -> None:
        cfg = self.cfg
        dt = cfg.physics_dt
        camera_every = max(1, int(round(cfg.joint_state_rate_hz / cfg.camera_rate_hz)))
        step = 0
        wall0 = time.monotonic()
        next_instruction = 0.0
        settle_from, reset_pose = -math.inf, None
        while not self._stop.is_set() and rclpy.ok(context=self.context):
            with self._lock:
                reset, self._pending_reset = self._pending_reset, None
                q_cmd, gripper_cmd = self._q_cmd, self._gripper_cmd
            if reset is not None:
                self._start_episode(reset)
                next_instruction = 0.0
                settle_from, reset_pose = self._elapsed, self.env.joint_positions()
            if reset_pose is not None and settling_after_reset(self._elapsed - settle_from, q_cmd, reset_pose):
                with self._lock:
                    self._q_cmd = self._gripper_cmd = None
                q_cmd = gripper_cmd = None
            else:
                reset_pose = None
            if q_cmd is not None or gripper_cmd is not None:
                self.env.apply_joint_targets(q_cmd if q_cmd is not None else self.env.data.ctrl[
                    self.env.handles.arm_actuators].copy(), gripper_cmd if gripper_cmd is not None
                    else self.env.gripper_command)
            self.env.advance()
            self._elapsed += dt
            step += 1
            stamp = _stamp(self.sim_time)
            self._pub_clock.publish(Clock(clock=stamp))
            self._publish_joints(stamp)
            if step % camera_every == 0:
                self._publish_image(stamp)
            if self._episode is not None:
                self._episode["min_clearance_m"] = min(self._episode["min_clearance_m"], self.env.target_clearance())
                if self._elapsed >= next_instruction:
                    self._pub_instruction.publish(String(data=self.env.instruction))
                    next_instruction = self._elapsed + INSTRUCTION_REPEAT_S
                if self.env.done:
                    self._finish_episode()
            if cfg.real_time_factor > 0:
                delay = wall0 + self._elapsed / cfg.real_time_factor - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                elif delay < -0.5:  # far behind (machine busy): do not try to catch up in a burst
                    wall0 = time.monotonic() - self._elapsed / cfg.real_time_factor

    def _start_episode(self, request: dict[str, Any]) -> None:
        try:
            self.env.reset(request["seed"], request["color"])
        except ValueError as err:
            self._reject(f"reset rejected: {err}")
            return
        with self._lock:  # commands for the previous episode's arm must not move the new one
            self._q_cmd = self._gripper_cmd = None
        if not request.get("episode", True):
            return
        self._episode = {"seed": request["seed"], "color": self.env.color, "instruction": self.env.instruction,
                         "start": self._elapsed, "min_clearance_m": self.env.target_clearance(),
                         "start_clearance_m": self.env.target_clearance()}
        self._pub_instruction.publish(String(data=self.env.instruction))
        self.get_logger().info(f"episode seed {request['seed']}: {self.env.instruction}")

    def _finish_episode(self) -> None:
        assert self._episode is not None
        episode, self._episode = self._episode, None
        report = {"seed": episode["seed"], "color": episode["color"], "instruction": episode["instruction"],
                  "success": bool(self.env.success()), "steps": int(self.env.steps),
                  "duration_s": self._elapsed - episode["start"], "min_clearance_m": float(episode["min_clearance_m"]),
                  "start_clearance_m": float(episode["start_clearance_m"])}
        self._pub_episode.publish(String(data=json.dumps(report)))
        self._pub_success.publish(Bool(data=report["success"]))
        self.get_logger().info(f"episode seed {report['seed']}: success={report['success']} "
                               f"after {report['duration_s']:.2f} s")

    def _publish_joints(self, stamp: Time) -> None:
        msg = JointState(name=list(self.kin.joint_names) + list(self.kin.gripper_joint_names))
        msg.header.stamp = stamp
        fingers = self.env.finger_positions()
        msg.position = self.env.joint_positions().tolist() + fingers.tolist()
        msg.velocity = self.env.joint_velocities().tolist() + [0.0] * len(fingers)
        self._pub_joints.publish(msg)

    def _publish_image(self, stamp: Time) -> None:
        self._pub_image.publish(_image_message(self.env.render(), stamp, "camera"))
        if self._pub_wrist is not None:
            self._pub_wrist.publish(_image_message(self.env.render(self.env.handles.wrist_camera), stamp, "wrist"))

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


def _image_message(rgb: np.ndarray, stamp: Time, frame_id: str) -> Image:
    msg = Image(height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8", step=rgb.shape[1] * 3)
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.data = rgb.tobytes()
    return msg


def main(args: list[str] | None = None) -> int:
    return run_node(NODE_NAME, SimBridgeNode, lambda node: SingleThreadedExecutor(), args)


if __name__ == "__main__":
    sys.exit(main())
