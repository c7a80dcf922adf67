"""``vla_accel_node``: the rclpy adapter around the control core and the inference worker.

A managed (lifecycle) node. ``configure`` loads the URDF and the checkpoint, checks that the
checkpoint was made for this robot (``core/robot_record.py``) and starts the inference worker;
``activate`` starts commanding; ``deactivate`` stops publishing commands (the controllers keep the
last one; ``~/enable false`` instead keeps publishing a hold); ``cleanup`` and ``shutdown`` release
it all. ``autostart`` drives configure and activate at start-up, for systems without a lifecycle
manager.

Interface (topic names are relative, so they resolve in the node's namespace; every parameter is
declared with a description and range, see ``ros/parameters.py``'s ``NodeConfig`` and
config/vla_accel.yaml):

- subscribes ``image_topic`` (sensor_msgs/Image, or CompressedImage), ``joint_states_topic``
  (sensor-data QoS), ``~/instruction`` (std_msgs/String) and, when the URDF is not given by
  parameter, ``robot_description`` (transient local);
- publishes every tick while active, reliably, one of: ``<controller>/commands``
  (Float64MultiArray, in ``controller_joints`` order), ``<controller>/joint_trajectory`` (one point
  at one period) or ``joint_command_topic`` (JointState, arm + fingers); plus
  ``<gripper_controller>/commands``;
- ``/diagnostics`` (status named by the node's fully qualified name) and ``~/stats`` (JSON) at
  ``stats_rate_hz``, in every lifecycle state; service ``~/enable`` (SetBool) while active.

The control timer runs on the node clock (``use_sim_time`` works) in its own mutually exclusive
callback group; inference never runs in a callback: by default in a child process
(``inference_mode: process``, ``runtime/process_worker.py``), optionally in a worker thread. The thread
that spins the executor runs under SCHED_FIFO (``realtime_priority``) where the system allows it.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from builtin_interfaces.msg import Duration
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import (
    HistoryPolicy,
    QoSProfile,
    ReliabilityPolicy,
    qos_profile_sensor_data,
)
from rclpy.wait_for_message import wait_for_message
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_accel_ros.ros import remote_protocol
from vla_accel_ros.core.controller import Controller, TickResult
from vla_accel_ros.core.convert import (
    compressed_to_rgb,
    controller_joint_order,
    image_to_rgb,
    joint_state_to_arm,
    kinematics_difference,
)
from vla_accel_ros.core.input_errors import InputErrorCounts
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.core.robot_record import check_checkpoint_robot
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS, declare_config, run_node
from vla_accel_ros.runtime.builder import build_controller, build_runner
from vla_accel_ros.runtime.process_worker import ChildSpec, ProcessInferenceWorker
from vla_accel_ros.runtime.remote_worker import RemoteInferenceWorker
from vla_accel_ros.runtime.thread_worker import InferenceWorker

if TYPE_CHECKING:  # the runner (and torch with it) loads only in thread mode
    from vla_accel_ros.runtime.runner import PolicyRunner

NODE_NAME = "vla_accel_node"
ROBOT_DESCRIPTION_TOPIC = "robot_description"  # relative: robot_state_publisher in the same namespace
COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
SOURCE_CODES = {"policy": 0, "fallback": 1, "hold": 2}
MAX_TICK_LOG = 200_000
LOG_THROTTLE_S = 10.0  # each kind of input problem is logged at most once per this long
# Holding this long for want of a policy action, with inference failing or having run before, is
# an ERROR on /diagnostics (a first action still loading is not).
INFERENCE_STARVED_ERROR_S = 1.0


def _rss_mb() -> float:
    """Peak resident set size of this process (MiB)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class VlaAccelNode(LifecycleNode):
    """See the module docstring. With ``autostart`` the constructor configures and activates the
    node, and raises ConfigError (a ValueError) on invalid parameters, URDF or checkpoint, with a
    message naming the problem; without it a lifecycle manager drives the transitions."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        try:
            self.cfg: NodeConfig = declare_config(self, NodeConfig)
        except ConfigError as err:
            raise self._refuse(err) from err
        cfg = self.cfg
        sys.setswitchinterval(cfg.switch_interval_s)
        # Configured state (on_configure builds it, on_cleanup releases it).
        self.kin: ArmKinematics | None = None
        self.controller: Controller | None = None
        self.controller_joints: tuple[str, ...] = ()
        self.runner: PolicyRunner | None = None  # thread mode only; process mode keeps it in the child
        self.worker: InferenceWorker | ProcessInferenceWorker | RemoteInferenceWorker | None = None
        self.image_size = 0
        self._robot_warning = ""  # the checkpoint's robot differs, run with allow_unmatched_robot
        self._policy_warnings: list[str] = []  # the decoder's fallbacks for what the policy lacks
        self._configure_error: ConfigError | None = None
        self._inputs: dict[str, Any] = {}  # topic -> subscription
        self._outputs: list[Any] = []
        self._pub_forward = self._pub_trajectory = self._pub_joint_command = self._pub_gripper = None
        self._pub_remote_image = self._pub_remote_state = self._pub_remote_task = None
        self._remote_task: str | None = None
        self._timer: Any = None  # the control tick, while active
        self._lifecycle = "unconfigured"
        self._joint_names: list[str] = []  # kept after cleanup for the run summary

        self._input_errors = 0
        self._error_counts = InputErrorCounts()
        self._realtime_priority = 0  # set by apply_realtime_priority()
        self._last_input_error = ""
        self._last_tick: TickResult | None = None
        self._tick_log: list[tuple[Any, ...]] = []
        self._started_wall = time.monotonic()
        self._logged: dict[str, float] = {}  # kind of problem -> when it was last logged
        self._recent_errors: deque[tuple[float, str]] = deque(maxlen=64)  # (monotonic, message)
        self._header_stamps: dict[str, float] = {}
        self._inference_errors_seen = 0
        self._outliers_seen = 0
        self._last_policy_stamp: float | None = None

        # Under a MultiThreadedExecutor the inputs never wait behind the control tick (its own group),
        # and never run during a lifecycle transition: they share the group of the lifecycle
        # services. Reporting and ~/enable run in every lifecycle state.
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self._io_group = self.default_callback_group
        self._pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._pub_stats = self.create_publisher(String, "~/stats", 10)
        self.create_service(SetBool, "~/enable", self._on_enable, callback_group=self._io_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._stats_timer = self.create_timer(1.0 / cfg.stats_rate_hz, self._publish_stats,
                                              callback_group=self._io_group)
        if cfg.autostart:
            self.start()

    def _refuse(self, err: Exception) -> ConfigError:
        """Log why the node cannot start through the ROS logger (it reaches /rosout) and return the
        error, marked as logged, for the caller to raise."""
        self.get_logger().fatal(f"refusing to start: {err}")
        refusal = err if isinstance(err, ConfigError) else ConfigError(str(err))
        refusal.logged = True  # type: ignore[attr-defined]  # run_node does not print it again
        return refusal

    def start(self) -> None:
        """Configure, then activate (what ``autostart`` does). Raises ConfigError when either fails."""
        if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            raise self._configure_error or ConfigError("configure failed")
        if self.trigger_activate() != TransitionCallbackReturn.SUCCESS:
            raise self._refuse(ConfigError("activate failed"))

    @property
    def lifecycle_state(self) -> str:
        """unconfigured, inactive, active or finalized."""
        return self._lifecycle

    # --- lifecycle ----------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load the URDF and the checkpoint, check the robot, start the inference worker, create
        the subscriptions and the (inactive) command publishers."""
        self._configure_error = None
        try:
            self._configure()
        except (ValueError, OSError, KeyError) as err:  # ConfigError, bad URDF or checkpoint
            self._release()
            self._configure_error = self._refuse(err)
            return TransitionCallbackReturn.FAILURE
        self._lifecycle = "inactive"
        return super().on_configure(state)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Command: the control tick starts, enabled (``~/enable false`` makes it hold)."""
        assert self.controller is not None and self.kin is not None
        self.controller.set_enabled(True)
        # The timer uses the node clock: with use_sim_time it follows /clock. Cancelled, not
        # destroyed, on deactivate (the executor may be waiting on it).
        if self._timer is None:
            self._timer = self.create_timer(self.cfg.period_s, self._on_tick, callback_group=self._timer_group)
        else:
            self._timer.reset()
        self._lifecycle = "active"
        result = super().on_activate(state)
        cfg = self.cfg
        outputs = ", ".join(p.topic_name for p in self._outputs)
        inputs = ", ".join(s.topic_name for s in self._inputs.values())
        self.get_logger().info(
            f"ready: {cfg.control_rate_hz:g} Hz, output {cfg.output} on {outputs}, inputs {inputs}, joints "
            f"{list(self.controller_joints)}, decoder {cfg.policy.decoder if self.worker else '(inference off)'} "
            f"({cfg.inference_mode}), image {self.image_size}px")
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop commanding: no more ticks, so the controllers keep the last command."""
        if self._timer is not None:
            self._timer.cancel()
        self._lifecycle = "inactive"
        self.get_logger().info("deactivated: not commanding (the controllers keep the last command)")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self._lifecycle = "unconfigured"
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self._timer is not None:
            self._timer.cancel()
        self._release()
        self._lifecycle = "finalized"
        return super().on_shutdown(state)

    def _release(self) -> None:
        """Undo on_configure: stop the worker, drop the subscriptions and the command publishers."""
        if self.worker is not None:
            self.worker.stop()
        for pub in self._outputs:
            self.destroy_lifecycle_publisher(pub)
        self._outputs = []
        self._pub_forward = self._pub_trajectory = self._pub_joint_command = self._pub_gripper = None
        self.worker = self.runner = self.controller = self.kin = None
        self._robot_warning = ""
        self._policy_warnings = []

    def _configure(self) -> None:
        cfg = self.cfg
        self.kin = self._load_kinematics()
        runner_config = cfg.runner_config()
        if cfg.inference and cfg.inference_mode != "remote":  # remote: the inference node checks its robot
            # first: a policy for another arm is the root cause of any mismatch below
            self._robot_warning = check_checkpoint_robot(
                runner_config.checkpoint_path, self.kin.joint_names, self.kin.tcp_frame, action_dt_s=cfg.action_dt_s,
                image_size=cfg.image_size, allow_unmatched=cfg.allow_unmatched_robot)
            if self._robot_warning:
                self.get_logger().warn(self._robot_warning)
        self.controller_joints = controller_joint_order(self.kin, cfg.controller_joints)
        self.controller = build_controller(cfg.controller_config(), self.kin, enabled=False,
                                           instruction=str(self.get_parameter("instruction").value))
        self._joint_names = list(self.kin.joint_names)
        model_size = 0
        if cfg.inference:
            try:
                if cfg.inference_mode == "remote":  # the inference node resizes to its model's size
                    self.worker = RemoteInferenceWorker(self.controller, self._send_observation, self._now,
                                                        lost_after_s=cfg.remote_lost_after_s,
                                                        max_age_s=cfg.action_timeout_s)
                elif cfg.inference_mode == "process":  # started here: it reports the model's image size
                    spec = ChildSpec(runner_config, self.kin.urdf_xml, self.kin.tcp_frame)
                    self.worker = ProcessInferenceWorker(self.controller, spec, self._now,
                                                         max_restarts=cfg.inference_restarts,
                                                         python=cfg.inference_python)
                    self.worker.start()
                    model_size = self.worker.image_size
                else:
                    self.runner = build_runner(runner_config, self.kin)
                    model_size = self.runner.image_size
            except (OSError, ValueError, KeyError) as err:
                raise ConfigError(f"cannot load policy checkpoint '{runner_config.checkpoint_path}' with decoder "
                                  f"'{cfg.policy.decoder}': {err}") from err
        self.image_size = cfg.image_size or model_size or 128
        if model_size and self.image_size != model_size:
            raise ConfigError(f"parameter 'image_size' = {cfg.image_size} but the checkpoint expects "
                              f"{model_size}; set 0 to use the checkpoint's size")

        # Inputs: sensor data best effort (matches reliable publishers too). Made once and kept over
        # cleanup (their callbacks ignore messages while unconfigured): destroying a subscription
        # while a multi-threaded executor waits on it raises in that executor.
        def subscribe(msg_type: Any, topic: str, callback: Callable[[Any], None], qos: Any) -> None:
            if topic not in self._inputs:
                self._inputs[topic] = self.create_subscription(msg_type, topic, callback, qos,
                                                               callback_group=self._io_group)

        if cfg.compressed_image:
            subscribe(CompressedImage, cfg.image_topic, self._on_compressed, qos_profile_sensor_data)
        else:
            subscribe(Image, cfg.image_topic, self._on_image, qos_profile_sensor_data)
        subscribe(JointState, cfg.joint_states_topic, self._on_joint_state, qos_profile_sensor_data)
        subscribe(String, "~/instruction", self._on_instruction, 10)
        if self._description_fallback:  # a robot_state_publisher that starts after us is checked
            subscribe(String, ROBOT_DESCRIPTION_TOPIC, self._on_late_description, LATCHED_QOS)

        # Outputs, reliable; they publish only while active.
        def publisher(msg_type: Any, topic: str) -> Any:
            self._outputs.append(self.create_lifecycle_publisher(msg_type, topic, COMMAND_QOS))
            return self._outputs[-1]

        controller = cfg.controller.strip("/")
        if cfg.output == "forward_position":
            self._pub_forward = publisher(Float64MultiArray, f"{controller}/commands")
        elif cfg.output == "joint_trajectory":
            self._pub_trajectory = publisher(JointTrajectory, f"{controller}/joint_trajectory")
        else:
            self._pub_joint_command = publisher(JointState, cfg.joint_command_topic)
        gripper = cfg.gripper_controller.strip("/")
        if gripper and self.kin.gripper_joint_names:
            self._pub_gripper = publisher(Float64MultiArray, f"{gripper}/commands")

        if self.runner is not None:
            self._policy_warnings = list(self.runner.warnings)
        elif isinstance(self.worker, ProcessInferenceWorker):
            self._policy_warnings = list(self.worker.warnings)
        for warning in self._policy_warnings:
            self.get_logger().warn(warning)
        if isinstance(self.worker, RemoteInferenceWorker):
            self._connect_remote()
            self.worker.start()
        if self.runner is not None:
            self.worker = InferenceWorker(self.controller, self.runner, self._now, torch_threads=cfg.torch_threads)
            self.worker.start()
        # Start-up garbage (imports, model, URDF) is never scanned again: a full collection over it
        # took 20-80 ms, i.e. whole missed ticks, when it happened to run in the executor thread.
        gc.collect()
        gc.freeze()

    # --- set-up -------------------------------------------------------------------------------
    def _load_kinematics(self) -> ArmKinematics:
        cfg = self.cfg
        self._description_fallback = False
        if cfg.robot_description.strip():
            source, label = cfg.robot_description, "parameter robot_description"
        elif cfg.urdf_file:
            source, label = cfg.urdf_file, f"urdf_file {cfg.urdf_file}"
        else:
            xml = self._wait_robot_description(cfg.robot_description_timeout_s)
            topic = self.resolve_topic_name(ROBOT_DESCRIPTION_TOPIC)
            source, label = (xml, f"topic {topic}") if xml else (str(default_urdf()), "package URDF")
            self._description_fallback = not xml
        try:
            kin = ArmKinematics(source, tcp_frame=cfg.tcp_frame)
        except ValueError as err:
            raise ConfigError(f"bad URDF from {label}: {err}") from err
        self.get_logger().info(f"URDF from {label}: arm joints {list(kin.joint_names)}, "
                               f"gripper {list(kin.gripper_joint_names)}")
        return kin

    def _wait_robot_description(self, timeout_s: float) -> str:
        """The latched robot description, waited for without an executor (configure may run inside
        one of the executor's callbacks)."""
        if timeout_s <= 0:
            return ""
        received, msg = wait_for_message(String, self, ROBOT_DESCRIPTION_TOPIC, qos_profile=LATCHED_QOS,
                                         time_to_wait=timeout_s)
        return msg.data if received and msg is not None else ""

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # --- remote inference ---------------------------------------------------------------------
    def _connect_remote(self) -> None:
        """Observations out (best effort, depth 1), the task out (latched), actions in (reliable)."""
        observation_qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT,
                                     history=HistoryPolicy.KEEP_LAST)
        action_qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        if self._pub_remote_image is None:  # made once, as the subscriptions (see _configure)
            self._pub_remote_image = (
                self.create_publisher(CompressedImage, remote_protocol.COMPRESSED_IMAGE_TOPIC, observation_qos)
                if self.cfg.remote_compressed_image
                else self.create_publisher(Image, remote_protocol.IMAGE_TOPIC, observation_qos))
            self._pub_remote_state = self.create_publisher(JointState, remote_protocol.STATE_TOPIC, observation_qos)
            self._pub_remote_task = self.create_publisher(String, remote_protocol.INSTRUCTION_TOPIC, LATCHED_QOS)
            self._inputs[remote_protocol.ACTION_TOPIC] = self.create_subscription(
                JointState, remote_protocol.ACTION_TOPIC, self._on_remote_action, action_qos,
                callback_group=self._io_group)
        self._remote_task = None

    def _send_observation(self, obs: Observation) -> None:
        """Publish one observation for the inference node (the remote worker's thread)."""
        assert self.kin is not None and self._pub_remote_state is not None
        if obs.instruction != self._remote_task:
            self._pub_remote_task.publish(String(data=obs.instruction))
            self._remote_task = obs.instruction
        self._pub_remote_image.publish(remote_protocol.compressed_image_message(obs) if self.cfg.remote_compressed_image
                                       else remote_protocol.image_message(obs))
        self._pub_remote_state.publish(remote_protocol.state_message(obs, self.kin.joint_names))

    def _on_remote_action(self, msg: JointState) -> None:
        if not isinstance(self.worker, RemoteInferenceWorker):
            return
        try:
            answer = remote_protocol.action_from(msg)
        except ValueError as err:
            self._reject(f"remote action rejected: {err}")
            return
        self.worker.on_remote_action(answer)

    # --- inputs -------------------------------------------------------------------------------
    def _reject(self, message: str) -> None:
        """Count, keep for /diagnostics, and log each kind of problem once per LOG_THROTTLE_S."""
        self._input_errors += 1
        self._last_input_error = message
        now = time.monotonic()
        self._recent_errors.append((now, message))
        kind = self._error_counts.add(message)  # the same problem with other numbers is one kind
        if now - self._logged.get(kind, -math.inf) >= LOG_THROTTLE_S:
            self._logged[kind] = now
            self.get_logger().warn(message)

    def _header_in_order(self, what: str, msg: Any) -> bool:
        """Header stamps a little older than the previous one: out-of-order delivery, drop it;
        much older (past the watchdogs): the sender's clock was reset, report it and go on."""
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        last = self._header_stamps.get(what)
        if stamp <= 0.0 or last is None or stamp >= last:
            self._header_stamps[what] = max(stamp, last or 0.0)
            return True
        back = last - stamp
        if back <= max(self.cfg.camera_timeout_s, self.cfg.joint_state_timeout_s):
            self._reject(f"{what} dropped: header stamp {stamp:.6f} is {back:.3f} s older than the previous "
                         f"one (out-of-order delivery)")
            return False
        self._header_stamps[what] = stamp
        self._reject(f"{what}: header stamps went back by {back:.3f} s (sender clock reset?); following them")
        return True

    def _on_late_description(self, msg: String) -> None:
        """robot_description published after start-up (the package URDF is in use): hold while it
        describes another arm, carry on when it matches (restart the node to adopt a new one)."""
        if self.controller is None or self.kin is None or not self._description_fallback:
            return
        try:
            problem = kinematics_difference(self.kin, ArmKinematics(msg.data, tcp_frame=self.cfg.tcp_frame))
        except ValueError as err:
            problem = f"is not a usable URDF: {err}"
        if problem:
            reason = f"robot_description received after start-up {problem}; holding (restart the node to use it)"
            self.controller.set_config_fault(reason)
            self._reject(reason)
        else:
            self.controller.set_config_fault("")
            self.get_logger().info("robot_description received after start-up matches the URDF in use")

    def _on_image(self, msg: Image) -> None:
        self._accept_image(msg, image_to_rgb)

    def _on_compressed(self, msg: CompressedImage) -> None:
        self._accept_image(msg, compressed_to_rgb)

    def _accept_image(self, msg: Image | CompressedImage, to_rgb: Callable[[Any, int], np.ndarray]) -> None:
        if self.controller is None or not self._header_in_order("image", msg):
            return
        try:
            rgb = to_rgb(msg, self.image_size)
        except ValueError as err:
            self._reject(f"image on {self.cfg.image_topic} rejected: {err}")
            return
        if (error := self.controller.on_image(rgb, self._now())) is not None:
            self._reject(error)

    def _on_joint_state(self, msg: JointState) -> None:
        if self.controller is None or self.kin is None or not self._header_in_order("joint state", msg):
            return
        try:
            q, gripper = joint_state_to_arm(self.kin, msg.name, msg.position)
        except ValueError as err:
            self._reject(f"joint state rejected: {err}")
            return
        if (error := self.controller.on_joint_state(q, gripper, self._now())) is not None:
            self._reject(error)

    def _on_instruction(self, msg: String) -> None:
        if self.controller is None:
            return
        previous = self.controller.instruction
        if (error := self.controller.set_instruction(msg.data)) is not None:
            self._reject(error)
        elif self.controller.instruction != previous:
            self.get_logger().info(f"instruction: '{self.controller.instruction}'")

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        for p in params:
            if p.name == "instruction":
                if not str(p.value).strip():
                    return SetParametersResult(successful=False, reason="instruction must not be empty")
                if self.controller is not None:  # else configure reads the parameter
                    self.controller.set_instruction(str(p.value))
        return SetParametersResult(successful=True)

    def _on_enable(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        if self.controller is None or self._lifecycle != "active":
            response.success = False
            response.message = f"the node is {self._lifecycle}: activate it first (lifecycle)"
            return response
        self.controller.set_enabled(request.data)
        response.success = True
        response.message = "enabled" if request.data else "disabled: holding the measured position"
        self.get_logger().info(response.message)
        return response

    # --- the tick -----------------------------------------------------------------------------
    def _on_tick(self) -> None:
        if self.controller is None or self.kin is None:
            return
        wall = time.monotonic()
        result = self.controller.tick(self._now())
        self._last_tick = result
        if result.source == "policy" or self._last_policy_stamp is None:
            self._last_policy_stamp = result.stamp
        if result.q_command is not None:
            self._publish_command(result)
        if len(self._tick_log) < MAX_TICK_LOG:
            meas = result.q_measured if result.q_measured is not None else np.full(self.kin.n, np.nan)
            cmd = result.q_command if result.q_command is not None else np.full(self.kin.n, np.nan)
            self._tick_log.append((wall, result.stamp, SOURCE_CODES[result.source], cmd, meas))

    def _publish_command(self, result: TickResult) -> None:
        assert result.q_command is not None and self.kin is not None
        positions = self.kin.to_named(result.q_command, self.controller_joints).tolist()
        fingers = result.finger_positions.tolist()
        if self._pub_forward is not None:
            self._pub_forward.publish(Float64MultiArray(data=positions))
        elif self._pub_trajectory is not None:
            sec = self.cfg.period_s
            point = JointTrajectoryPoint(positions=positions,
                                         time_from_start=Duration(sec=int(sec), nanosec=int((sec % 1.0) * 1e9)))
            # A zero header stamp means "start now" to joint_trajectory_controller.
            self._pub_trajectory.publish(JointTrajectory(joint_names=list(self.controller_joints), points=[point]))
        elif self._pub_joint_command is not None:
            msg = JointState(name=list(self.controller_joints) + list(self.kin.gripper_joint_names),
                             position=positions + fingers)
            msg.header.stamp = self.get_clock().now().to_msg()
            self._pub_joint_command.publish(msg)
        if self._pub_gripper is not None and fingers:
            self._pub_gripper.publish(Float64MultiArray(data=fingers))

    # --- reporting ----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lifecycle_state": self._lifecycle, "control_rate_hz": self.cfg.control_rate_hz,
                               "input_errors": self._input_errors, "last_input_error": self._last_input_error,
                               **self._error_counts.to_json(),
                               "peak_rss_mb": _rss_mb(), "realtime_priority": self._realtime_priority,
                               "robot_warning": self._robot_warning,
                               "decoder": self.cfg.policy.decoder if self.worker else ""}
        if self.controller is None:
            return out
        out.update({
            "enabled": self.controller.enabled,
            "instruction": self.controller.instruction,
            "source": self._last_tick.source if self._last_tick else "",
            "reason": self._last_tick.reason if self._last_tick else "",
            "hold_reason": self.controller.hold_reason,
            **self.controller.stats.__dict__,
            **self.controller.timing(),
        })
        if self.worker is not None:
            out.update({f"inference_{k}": v for k, v in self.worker.stats().items()})
            out["inference_alive"] = self.worker.alive
        return out

    def _publish_stats(self) -> None:
        stats = self.stats()
        self._pub_stats.publish(String(data=json.dumps(stats)))
        # Fully qualified: two arms in two namespaces report apart on the one /diagnostics topic.
        status = DiagnosticStatus(name=f"{self.get_fully_qualified_name()}: control loop", hardware_id="vla_accel_ros")
        if self.controller is None or self._lifecycle != "active":
            status.level = DiagnosticStatus.WARN
            status.message = f"{self._lifecycle}: not commanding (lifecycle)"
        elif self._last_tick is None or self._last_tick.q_command is None:
            status.level, status.message = DiagnosticStatus.ERROR, stats["reason"] or "no tick yet"
        elif self.worker is not None and not self.worker.alive:
            why = stats.get("inference_down_reason") or stats.get("inference_last_error") or "thread ended"
            status.level, status.message = DiagnosticStatus.ERROR, f"inference worker stopped: {why}"
        elif (self.worker is not None and self.controller.action_starved_s > INFERENCE_STARVED_ERROR_S
              and (stats.get("inference_errors") or stats.get("inference_actions"))):
            status.level, status.message = DiagnosticStatus.ERROR, f"inference gives no actions: {self._last_tick.reason}"
        elif self._last_tick.source == "hold":
            status.level, status.message = DiagnosticStatus.WARN, f"holding: {self._last_tick.reason}"
        else:
            status.level, status.message = DiagnosticStatus.OK, f"running ({self._last_tick.source})"
        warning, recent = self._warning(stats) if self.controller is not None else ("", [])
        if warning:
            status.level = max(status.level, DiagnosticStatus.WARN)
            status.message = warning if status.message.startswith("running") else f"{status.message}; {warning}"
        status.values = [KeyValue(key=k, value=str(v)) for k, v in stats.items()]
        status.values += [KeyValue(key=f"recent_input_error_{i}", value=m) for i, m in enumerate(recent)]
        diag = DiagnosticArray(status=[status])
        diag.header.stamp = self.get_clock().now().to_msg()
        self._pub_diag.publish(diag)

    def _warning(self, stats: dict[str, Any]) -> tuple[str, list[str]]:
        """What degrades a running node since the last report: input rejected, inference failing
        or too slow to give fresh actions; and the distinct input problems of that window."""
        window = max(2.0, 1.0 / self.cfg.stats_rate_hz)
        now = time.monotonic()
        recent = list(dict.fromkeys(m for t, m in self._recent_errors if now - t <= window))
        warnings = [self._robot_warning] if self._robot_warning else []
        warnings += self._policy_warnings
        errors = int(stats.get("inference_errors", 0) or 0)
        new_errors, self._inference_errors_seen = errors - self._inference_errors_seen, errors
        if new_errors > 0:
            warnings.append(f"inference failed {new_errors} time(s): {stats.get('inference_last_error', '')}")
        if recent:
            warnings.append(f"input rejected: {recent[-1]}")
        outliers = int(stats.get("outliers_rejected", 0) or 0)
        new_outliers, self._outliers_seen = outliers - self._outliers_seen, outliers
        if new_outliers > 0:
            warnings.append(f"{new_outliers} joint-state outlier(s) gated: {stats.get('last_outlier', '')}")
        stale = self._now() - (self._last_policy_stamp if self._last_policy_stamp is not None else self._now())
        if (self.worker is not None and self._last_tick is not None and self._last_tick.source == "fallback"
                and stale > max(self.cfg.action_timeout_s, 3 * self.cfg.period_s)):
            warnings.append(f"no fresh policy action for {stale:.2f} s (inference slow or stuck): Kalman fallback")
        return "; ".join(warnings), recent

    def run_summary(self) -> dict[str, Any]:
        """Statistics of the whole run plus the tick log (for ``stats_file``)."""
        log = self._tick_log
        wall = np.array([t[0] for t in log], dtype=float)
        ros = np.array([t[1] for t in log], dtype=float)
        period = self.cfg.period_s
        jitter = np.abs(np.diff(ros) - period) * 1e3 if ros.size > 1 else np.zeros(0)
        summary = self.stats()
        summary.update({
            "period_jitter_ms_p50": float(np.percentile(jitter, 50)) if jitter.size else 0.0,
            "period_jitter_ms_p99": float(np.percentile(jitter, 99)) if jitter.size else 0.0,
            "period_jitter_ms_max": float(jitter.max()) if jitter.size else 0.0,
            "executor": self.cfg.executor,
            "switch_interval_s": self.cfg.switch_interval_s,
            "joint_names": self._joint_names,
            "tick_log": {
                "wall": wall.tolist(),
                "ros": ros.tolist(),
                "source": [t[2] for t in log],
                "command": [np.asarray(t[3]).tolist() for t in log],
                "measured": [np.asarray(t[4]).tolist() for t in log],
            },
        })
        return summary

    def apply_realtime_priority(self) -> int:
        """Put the calling thread (the one about to spin the executor) under SCHED_FIFO at
        ``realtime_priority``, so that other processes on the machine cannot delay the control tick
        by a scheduler slice. Threads it creates later (executor pools) inherit it; an inference
        thread does not (it would take a core). The process mode's feeder thread gets it too: it
        shares the GIL with this thread. Returns the priority in effect (0: normal scheduling)."""
        prio = self.cfg.realtime_priority
        if prio > 0:
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
                if isinstance(self.worker, ProcessInferenceWorker):
                    self.worker.set_realtime_priority(prio)
                self._realtime_priority = prio
                self.get_logger().info(f"control loop runs at SCHED_FIFO priority {prio}")
            except (OSError, AttributeError) as err:
                self.get_logger().warn(
                    f"could not run the control loop at SCHED_FIFO priority {prio} ({err}); it runs with normal "
                    f"scheduling, so busy processes can delay ticks by a few ms. Grant CAP_SYS_NICE or an rtprio "
                    f"limit, or set realtime_priority: 0 to silence this")
        return self._realtime_priority

    def shutdown(self) -> None:
        """Stop the worker and write ``stats_file`` if set."""
        if self.worker is not None:
            self.worker.stop()
        if self.cfg.stats_file:
            path = Path(self.cfg.stats_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(json.dumps(self.run_summary()))  # NaN marks ticks without a command
            os.replace(tmp, path)


def make_executor(kind: str) -> SingleThreadedExecutor | MultiThreadedExecutor:
    return MultiThreadedExecutor(num_threads=2) if kind == "multi" else SingleThreadedExecutor()


def main(args: list[str] | None = None) -> int:
    # The thread that spins the executor runs the control timer: it gets the realtime priority.
    return run_node(NODE_NAME, VlaAccelNode, lambda node: make_executor(node.cfg.executor), args,
                    before_spin=VlaAccelNode.apply_realtime_priority)


if __name__ == "__main__":
    sys.exit(main())
