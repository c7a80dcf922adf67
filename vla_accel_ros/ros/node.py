"""``vla_accel_node``: the rclpy adapter around the control core and the inference worker.

A managed (lifecycle) node. ``configure`` loads the URDF (``ros/robot_description.py``) and the
checkpoint, checks that the checkpoint was made for this robot (``core/robot_record.py``) and starts
the inference worker (``ros/inference_workers.py``); ``activate`` starts commanding; ``deactivate``
stops publishing commands (the controllers keep the last one; ``~/enable false`` instead keeps
publishing a hold); ``cleanup`` and ``shutdown`` release it all. ``autostart`` drives configure and
activate at start-up, for systems without a lifecycle manager.

Interface (topic names are relative, so they resolve in the node's namespace; every parameter is
declared with a description and range, see ``ros/parameters.py``'s ``NodeConfig`` and
config/vla_accel.yaml):

- subscribes ``image_topic`` (sensor_msgs/Image, or CompressedImage; in a child process,
  ``ros/camera_intake.py``), ``joint_states_topic`` (sensor-data QoS), ``~/instruction``
  (std_msgs/String) and, when the URDF is not given by parameter, ``robot_description``
  (transient local);
- publishes every tick while active, reliably, one of: ``<controller>/commands``
  (Float64MultiArray, in ``controller_joints`` order), ``<controller>/joint_trajectory`` (one point
  at one period) or ``joint_command_topic`` (JointState, arm + fingers); plus
  ``<gripper_controller>/commands`` (``ros/command_publishers.py``);
- ``/diagnostics`` (status named by the node's fully qualified name; its level and message from
  ``runtime/health.py``) and ``~/stats`` (JSON) at ``stats_rate_hz``, in every lifecycle state;
  service ``~/enable`` (SetBool) while active.

The control timer runs on the node clock (``use_sim_time`` works, fixed once configured) in its own
mutually exclusive callback group; inference never runs in a callback: by default in a child
process, optionally in a worker thread or on another machine (``inference_mode``). No camera
message reaches this process: a child takes, bounds and converts them (``max_image_pixels``). A
watchdog on the wall clock stands in for the control timer when the node's clock stops (sim time
without ``/clock``): it holds the arm and reports ERROR. A tick later than ``stall_after_periods``
periods is a stall, a WARN on ``/diagnostics`` that names its likely cause (``runtime/stalls.py``);
reporting runs on the wall clock too. The thread that spins the executor runs under SCHED_FIFO
(``realtime_priority``) where the system allows it. ``stats_file`` receives the run's record at
shutdown (``ros/run_summary.py``).
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys
import time
from dataclasses import replace
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from std_srvs.srv import SetBool

from vla_accel_ros.core.controller import Controller, TickResult
from vla_accel_ros.core.convert import controller_joint_order, joint_state_to_arm
from vla_accel_ros.core.input_errors import InputErrorLog, shorten
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.core.robot_record import check_checkpoint_robot
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.core.stamp_order import StampOrder
from vla_accel_ros.models.load import check_device, declared_action_space
from vla_accel_ros.ros.command_publishers import CommandPublisher, command_publishers
from vla_accel_ros.ros.inference_workers import Worker, start_inference
from vla_accel_ros.ros.node_cameras import NodeCameras, check_image_slots
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS, declare_config, run_node, set_realtime_priority
from vla_accel_ros.ros.remote_link import RemoteLink
from vla_accel_ros.ros.robot_description import ROBOT_DESCRIPTION_TOPIC, description_mismatch, load_arm
from vla_accel_ros.ros.run_summary import TickLog, own_peak_rss_mb, write_stats_file
from vla_accel_ros.runtime.builder import build_controller
from vla_accel_ros.runtime.health import ERROR, OK, WARN, Health, NodeState
from vla_accel_ros.runtime.process_worker import ProcessInferenceWorker
from vla_accel_ros.runtime.stalls import StallMonitor

NODE_NAME = "vla_accel_node"
COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
LOG_THROTTLE_S = 10.0  # each kind of input problem is logged at most once per this long
INSTRUCTION_LOG_S = 1.0  # instruction changes are logged at most once per this long
# The node's clock standing still this long on the wall clock (and stall_after_periods periods) is a
# stopped clock. A sim's /clock under load pauses for a while (0.14-0.24 s seen on a loaded host):
# that is no reason to drop the policy's actions and hold; its robot stood still too.
CLOCK_STOPPED_MIN_S = 0.5
MAX_CLOCK_LAG_S = 1.0  # the most a /clock step widens the future-stamp tolerance
INSTRUCTION_LOG_CHARS = 200  # of an instruction, the log, /diagnostics and ~/stats show this many characters
LEVELS = {OK: DiagnosticStatus.OK, WARN: DiagnosticStatus.WARN, ERROR: DiagnosticStatus.ERROR}


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
        self.worker: Worker | None = None
        self.image_size = 0
        self._description_fallback = False  # the package's URDF, for want of a description
        self._robot_warning = ""  # the checkpoint's robot differs, run with allow_unmatched_robot
        self._policy_warnings: list[str] = []  # the decoder's fallbacks for what the policy lacks
        self._configure_error: ConfigError | None = None
        self._inputs: dict[str, Any] = {}  # topic -> subscription
        self._commands: list[CommandPublisher] = []
        self._remote: RemoteLink | None = None  # made at the first configure in remote mode
        self._timer: Any = None  # the control tick, while active
        self._lifecycle = "unconfigured"
        self._joint_names: list[str] = []  # kept after cleanup for the run summary

        self._errors = InputErrorLog(LOG_THROTTLE_S)
        self._camera_output = InputErrorLog(LOG_THROTTLE_S)  # what the camera child prints (libpng, ...)
        self._health = Health(1.0 / cfg.stats_rate_hz, stale_after_s=max(cfg.action_timeout_s, 3 * cfg.period_s))
        self._realtime_priority = 0  # set by apply_realtime_priority()
        self._last_tick: TickResult | None = None
        self.ticks = TickLog(whole_run=bool(cfg.stats_file))  # else a ring of the newest: flat memory
        self._stamps = StampOrder(max(cfg.camera_timeout_s, cfg.joint_state_timeout_s), cfg.future_stamp_tolerance_s)
        self._camera: NodeCameras | None = None  # made at configure
        self._stalls = StallMonitor(cfg.period_s, cfg.stall_after_periods, cfg.stall_holdoff_s)
        gc.callbacks.append(self._stalls.gc_callback)  # a collection in the timer's thread delays a tick
        self._watchdog: Any = None  # the wall-clock stand-in for the control timer, while active
        self._stall_bound_s = cfg.stall_after_periods * cfg.period_s
        self._stall_logged = -float("inf")  # time.monotonic() a stall was last logged
        self._tick_wall = 0.0  # time.monotonic() of the last tick
        self._clock_value = 0.0  # the node's clock at the watchdog's last look
        self._clock_step = 0.0  # use_sim_time: its last step between two looks (a /clock period or more), <= 1 s
        self._clock_moved = 0.0  # time.monotonic() the watchdog last saw the node's clock move
        self._clock_stopped_at = 0.0  # time.monotonic() of the last tick before the clock stopped
        self._instruction_logged = (-float("inf"), 0)  # (when, changes since)

        # Under a MultiThreadedExecutor the inputs never wait behind the control tick (its own group),
        # and never run during a lifecycle transition: they share the group of the lifecycle
        # services. Reporting and ~/enable run in every lifecycle state.
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self._io_group = self.default_callback_group
        self._pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._pub_stats = self.create_publisher(String, "~/stats", 10)
        self.create_service(SetBool, "~/enable", self._stalls.wrap("~/enable", self._on_enable),
                            callback_group=self._io_group)
        self.add_on_set_parameters_callback(self._stalls.wrap("parameter change", self._on_set_parameters))
        # On the wall clock: a clock that stops (sim time without /clock) must not silence the report.
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._stats_timer = self.create_timer(1.0 / cfg.stats_rate_hz, self._stalls.wrap("report", self._publish_stats),
                                              callback_group=self._io_group, clock=self._steady)
        if cfg.autostart:
            self.start()
        else:  # said once: an unconfigured node is otherwise silent
            self.get_logger().info(f"unconfigured: waiting for a lifecycle manager to configure and activate it "
                                   f"(ros2 lifecycle set {self.get_fully_qualified_name()} configure, then activate), "
                                   f"or start it with autostart:=true")

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
            # The constructor raises: nobody else destroys this node, and while it lives rcl keeps
            # its name's /rosout publisher, so the next node of that name in the process logs nowhere.
            self.destroy_node()
            raise self._configure_error or ConfigError("configure failed")
        if self.trigger_activate() != TransitionCallbackReturn.SUCCESS:
            refusal = self._refuse(ConfigError("activate failed"))
            self.destroy_node()
            raise refusal

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
        self._stalls.restart()
        self._tick_wall = self._clock_moved = time.monotonic()
        self._clock_value = self._now()
        if self._timer is None:
            self._timer = self.create_timer(self.cfg.period_s, self._on_tick, callback_group=self._timer_group)
            # Half a period: it takes over within stall_after_periods of the last tick.
            self._watchdog = self.create_timer(0.5 * self.cfg.period_s, self._on_watchdog,
                                               callback_group=self._timer_group, clock=self._steady)
        else:
            self._timer.reset()
            self._watchdog.reset()
        self._lifecycle = "active"
        result = super().on_activate(state)
        cfg = self.cfg
        outputs = ", ".join(c.publisher.topic_name for c in self._commands)
        subscriptions = [*self._inputs.values(), *([self._remote.subscription] if self._remote else [])]
        inputs = ", ".join(s.topic_name for s in subscriptions)
        self.get_logger().info(
            f"ready: {cfg.control_rate_hz:g} Hz, output {cfg.output} on {outputs}, inputs {inputs}, joints "
            f"{list(self.controller_joints)}, decoder {cfg.policy.decoder if self.worker else '(inference off)'} "
            f"({cfg.inference_mode}), image {self.image_size}px from cameras {list(cfg.camera_topics)}")
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop commanding: no more ticks, so the controllers keep the last command."""
        if self._timer is not None:
            self._timer.cancel()
            self._watchdog.cancel()
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
            self._watchdog.cancel()
        self._release()
        self._lifecycle = "finalized"
        return super().on_shutdown(state)

    def _release(self) -> None:
        """Undo on_configure: stop the worker and the camera intake, drop the command publishers."""
        if self._camera is not None:
            self._camera.stop()
            self._camera = None
        if self.worker is not None:
            self.worker.stop()
        if self._remote is not None:
            self._remote.disconnect()
        for command in self._commands:
            self.destroy_lifecycle_publisher(command.publisher)
        self._commands = []
        self.worker = self.controller = self.kin = None
        self._robot_warning = ""
        self._policy_warnings = []

    def _configure(self) -> None:
        cfg = self.cfg
        checkpoint = cfg.runner_config().checkpoint_path
        if cfg.inference and cfg.inference_mode != "remote" and (problem := checkpoint_problem(checkpoint)):
            raise ConfigError(f"{checkpoint}: {problem}")  # before any URDF wait: the example's placeholder
        if cfg.inference and cfg.inference_mode != "remote":
            check_device(cfg.runner_config().checkpoint_ref, cfg.runner_config().device)  # a GPU: LeRobot only
        # Spawned first: its imports run while the URDF and the policy load.
        self._camera = NodeCameras(cfg, lambda: self.controller, self._now, self._stamp_in_order, self._reject,
                                   self._on_camera_output, self._stalls.timed)
        self._camera.spawn()
        arm = load_arm(self, cfg)
        self.kin, self._description_fallback = arm.kin, arm.fallback
        self.get_logger().info(f"URDF from {arm.source}: arm joints {list(arm.kin.joint_names)}, "
                               f"gripper {list(arm.kin.gripper_joint_names)}")
        # remote: the inference node checks its robot; a policy server (openpi://) carries no robot record
        if cfg.inference and cfg.inference_mode != "remote" and not cfg.runner_config().checkpoint_ref.address:
            # first: a policy for another arm is the root cause of any mismatch below
            self._robot_warning = check_checkpoint_robot(
                cfg.runner_config().checkpoint_path, self.kin.joint_names, self.kin.tcp_frame,
                action_dt_s=cfg.action_dt_s, image_size=cfg.image_size, allow_unmatched=cfg.allow_unmatched_robot)
            if self._robot_warning:
                self.get_logger().warning(self._robot_warning)
        self.controller_joints = controller_joint_order(self.kin, cfg.controller_joints)
        controller_config = cfg.controller_config()
        if cfg.inference and cfg.inference_mode != "remote":  # remote inference carries end-effector deltas
            controller_config = replace(controller_config,
                                        action_space=declared_action_space(cfg.runner_config().checkpoint_ref))
        self.controller = build_controller(controller_config, self.kin, enabled=False,
                                           instruction=str(self.get_parameter("instruction").value))
        self._joint_names = list(self.kin.joint_names)
        model_size = 0
        if cfg.inference:
            if cfg.inference_mode == "remote" and self._remote is None:
                self._remote = RemoteLink(self, cfg.remote_compressed_image, self._reject, self._io_group)
            inference = start_inference(cfg, self.controller, self.kin, self._now, self._remote)
            self.worker, self._policy_warnings = inference.worker, inference.warnings
            model_size = inference.model_image_size
            check_image_slots(len(self._camera), inference.model_image_slots)
        self.image_size = cfg.image_size or model_size or 128
        if model_size and self.image_size != model_size:
            raise ConfigError(f"parameter 'image_size' = {cfg.image_size} but the checkpoint expects "
                              f"{model_size}; set 0 to use the checkpoint's size")
        self._subscribe_inputs()
        self._camera.start(self.resolve_topic_name, self.image_size, cfg.max_image_pixels, cfg.image_reliable,
                           self.context.get_domain_id(), self.get_name(), self.get_namespace())
        # Outputs, reliable; they publish only while active.
        self._commands = command_publishers(
            cfg, self.kin, self.controller_joints, clock=self.get_clock(),
            make=lambda msg_type, topic: self.create_lifecycle_publisher(msg_type, topic, COMMAND_QOS))
        for warning in self._policy_warnings:
            self.get_logger().warning(warning)
        # Start-up garbage (imports, model, URDF) is never scanned again: a full collection over it
        # took 20-80 ms, i.e. whole missed ticks, when it happened to run in the executor thread.
        gc.collect()
        gc.freeze()

    def _subscribe_inputs(self) -> None:
        """Sensor data best effort (matches reliable publishers too). Made once and kept over cleanup
        (their callbacks ignore messages while unconfigured): destroying a subscription while a
        multi-threaded executor waits on it raises in that executor."""
        cfg = self.cfg
        wanted = [(JointState, self._on_joint_state, cfg.joint_states_topic, qos_profile_sensor_data),
                  (String, self._on_instruction, "~/instruction", 10)]
        if self._description_fallback:  # a robot_state_publisher that starts after us is checked
            wanted.append((String, self._on_late_description, ROBOT_DESCRIPTION_TOPIC, LATCHED_QOS))
        for msg_type, callback, topic, qos in wanted:
            if topic not in self._inputs:
                timed = self._stalls.wrap(f"{self.resolve_topic_name(topic)} callback", callback)
                self._inputs[topic] = self.create_subscription(msg_type, topic, timed, qos,
                                                               callback_group=self._io_group)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # --- inputs -------------------------------------------------------------------------------
    def _reject(self, message: str) -> None:
        """Count, keep for /diagnostics, and log each kind of problem once per LOG_THROTTLE_S."""
        if self._errors.add(message, time.monotonic()):
            self.get_logger().warning(message)

    def _stamp_in_order(self, what: str, stamp: float) -> bool:
        take, problem = self._stamps.check(what, stamp, self._now(), self._clock_step)
        if problem:
            self._reject(problem)
        return take

    def _on_late_description(self, msg: String) -> None:
        """robot_description published after start-up (the package URDF is in use): hold while it
        describes another arm, carry on when it matches (restart the node to adopt a new one)."""
        if self.controller is None or self.kin is None or not self._description_fallback:
            return
        problem = description_mismatch(self.kin, msg.data, self.cfg.tcp_frame)
        fault = f"robot_description received after start-up {problem}; holding (restart the node to use it)"
        self.controller.set_config_fault(fault if problem else "")
        if problem:
            self._reject(fault)
        else:
            self.get_logger().info("robot_description received after start-up matches the URDF in use")

    def _on_camera_output(self, line: str) -> None:
        """A line the camera intake process printed (rclpy's log, libpng's and OpenCV's complaints about
        bad images): each kind logged at most once per LOG_THROTTLE_S."""
        if self._camera_output.add(line, time.monotonic()):
            self.get_logger().warning(f"camera intake: {shorten(line)}")

    def _on_joint_state(self, msg: JointState) -> None:
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        if self.controller is None or self.kin is None or not self._stamp_in_order("joint state", stamp):
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
            self._log_instruction(self.controller.instruction)

    def _log_instruction(self, text: str) -> None:
        """An instruction change, logged cut to INSTRUCTION_LOG_CHARS and at most once per
        INSTRUCTION_LOG_S (a flood of long instructions once filled the disk with logs)."""
        now = time.monotonic()
        logged_at, unlogged = self._instruction_logged
        if now - logged_at < INSTRUCTION_LOG_S:
            self._instruction_logged = (logged_at, unlogged + 1)
            return
        more = f" ({unlogged} change(s) since the last one logged)" if unlogged else ""
        self.get_logger().info(f"instruction: '{shorten(text, INSTRUCTION_LOG_CHARS)}'{more}")
        self._instruction_logged = (now, 0)

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        for p in params:
            if p.name == "use_sim_time" and self._lifecycle != "unconfigured":
                # rclpy's own parameter, writable by default: true without /clock stopped both timers.
                reason = (f"use_sim_time is fixed once the node is configured (it is {self._lifecycle}): the "
                          f"control timer and every input's time run on the clock chosen then. Set it at launch, "
                          f"or clean the node up, set it and configure again")
                self._reject(f"parameter change refused: {reason}")
                return SetParametersResult(successful=False, reason=reason)
            if p.name == "instruction":
                text = str(p.value).strip()
                if not text:
                    return SetParametersResult(successful=False, reason="instruction must not be empty")
                if len(text) > self.cfg.max_instruction_chars:
                    return SetParametersResult(successful=False, reason=(
                        f"instruction has {len(text)} characters, more than max_instruction_chars = "
                        f"{self.cfg.max_instruction_chars}"))
                if self.controller is not None:  # else configure reads the parameter
                    previous = self.controller.instruction
                    self.controller.set_instruction(text)
                    if self.controller.instruction != previous:
                        self._log_instruction(text)
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
        """The control timer's tick, on the node's clock."""
        if self.controller is None:
            return
        if self.controller.clock_fault:  # the node's clock moves again: this timer follows it
            self.controller.set_clock_fault("")
            self.get_logger().info(f"clock running again after {time.monotonic() - self._clock_stopped_at:.3f} s: "
                                   "the control timer ticks")
        self._tick(self._now())

    def _on_watchdog(self) -> None:
        """Stands in for the control timer when the node's clock has stopped (sim time without
        /clock): neither a tick nor a change of the node's clock for ``stall_after_periods`` periods (at
        least CLOCK_STOPPED_MIN_S) on the wall clock. It then holds the arm (the controller's clock
        fault) and ticks once a period on the wall clock until the control timer ticks again."""
        if self.controller is None:
            return
        wall, now = time.monotonic(), self._now()
        if now != self._clock_value:
            if self.get_clock().ros_time_is_active:  # sim time: the clock moves in /clock steps
                self._clock_step = min(max(now - self._clock_value, 0.0), MAX_CLOCK_LAG_S)
            self._clock_value, self._clock_moved = now, wall
        if self.controller.clock_fault:
            if wall - self._tick_wall >= 0.99 * self.cfg.period_s:  # checked twice a period: tick once
                self._tick(now)
            return
        # Checked every half period: the last check before the bound comes within half a period of it.
        still = wall - max(self._tick_wall, self._clock_moved)
        if still < max(self._stall_bound_s, CLOCK_STOPPED_MIN_S) - 0.5 * self.cfg.period_s:
            return  # ticking, or the clock moves and a tick is merely late (the stall report names it)
        self._clock_stopped_at = self._tick_wall
        reason = (f"clock stopped: the node's clock has stood at {now:.3f} s for {still:.3f} s (use_sim_time "
                  f"without /clock?); holding, one command per period on the wall clock")
        self.controller.set_clock_fault(reason)
        self.get_logger().error(reason)
        self._tick(now)

    def _tick(self, now: float) -> None:
        assert self.controller is not None and self.kin is not None
        wall = time.monotonic()
        self._tick_wall = wall
        result = self.controller.tick(now)
        self._last_tick = result
        self._health.ticked(result.source, result.stamp)
        if result.q_command is not None:
            for command in self._commands:
                command.publish(result)
        self.ticks.add(wall, result, self.kin.n)
        if (stall := self._stalls.tick(now)) is not None and wall - self._stall_logged >= LOG_THROTTLE_S:
            self._stall_logged = wall
            self.get_logger().warning(f"control loop stalled: {stall.gap_s:.3f} s between two ticks ({stall.missed} "
                                   f"missed); likely cause: {stall.cause}")

    # --- reporting ----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lifecycle_state": self._lifecycle, "control_rate_hz": self.cfg.control_rate_hz,
                               **self._errors.to_json(),
                               "peak_rss_mb": own_peak_rss_mb(), "realtime_priority": self._realtime_priority,
                               "robot_warning": self._robot_warning,
                               "decoder": self.cfg.policy.decoder if self.worker else ""}
        if self.controller is None:
            return out
        tick = self._last_tick
        instruction = self.controller.instruction
        out.update({"enabled": self.controller.enabled, "instruction": shorten(instruction, INSTRUCTION_LOG_CHARS),
                    "instruction_sha256": hashlib.sha256(instruction.encode()).hexdigest()[:16],
                    "source": tick.source if tick else "", "reason": tick.reason if tick else "",
                    "hold_reason": self.controller.hold_reason, "clock_fault": self.controller.clock_fault,
                    **self.controller.stats.__dict__, **self.controller.timing(), **self.controller.chunk_timing(),
                    **self._stalls.stats()})
        if self._camera is not None:
            out.update(self._camera.stats())
            out["camera_output_lines"] = self._camera_output.total
        if self.worker is not None:
            out.update({f"inference_{k}": v for k, v in self.worker.stats().items()})
            out["inference_alive"] = self.worker.alive
        return out

    def _state(self, stats: dict[str, Any]) -> NodeState:
        """What /diagnostics judges (``runtime/health.py``)."""
        tick = self._last_tick
        return NodeState(
            lifecycle=self._lifecycle, configured=self.controller is not None, stats=stats, clock_s=self._now(),
            tick_source=tick.source if tick else "", tick_reason=tick.reason if tick else "",
            commanded=tick is not None and tick.q_command is not None, inference=self.worker is not None,
            inference_alive=self.worker is not None and self.worker.alive,
            action_starved_s=self.controller.action_starved_s if self.controller is not None else 0.0,
            warnings=[*([self._robot_warning] if self._robot_warning else []), *self._policy_warnings],
            recent_input_errors=self._errors.recent(time.monotonic(), self._health.window_s),
            clock_stopped=self.controller.clock_fault if self.controller is not None else "",
            stall=self._stalls.report(self._now()) if self._lifecycle == "active" else "")

    def _publish_stats(self) -> None:
        stats = self.stats()
        self._pub_stats.publish(String(data=json.dumps(stats)))
        report = self._health.assess(self._state(stats))
        # Fully qualified: two arms in two namespaces report apart on the one /diagnostics topic.
        status = DiagnosticStatus(name=f"{self.get_fully_qualified_name()}: control loop", hardware_id="vla_accel_ros",
                                  level=LEVELS[report.level], message=report.message)
        status.values = [KeyValue(key=k, value=str(v)) for k, v in stats.items()]
        status.values += [KeyValue(key=f"recent_input_error_{i}", value=m)
                          for i, m in enumerate(report.recent_input_errors)]
        diag = DiagnosticArray(status=[status])
        diag.header.stamp = self.get_clock().now().to_msg()
        self._pub_diag.publish(diag)

    def run_summary(self) -> dict[str, Any]:
        """Statistics of the whole run plus the tick log (for ``stats_file``)."""
        return {**self.stats(), **self.ticks.jitter_ms(self.cfg.period_s), "executor": self.cfg.executor,
                "switch_interval_s": self.cfg.switch_interval_s, "joint_names": self._joint_names,
                "tick_log": self.ticks.to_json()}

    def apply_realtime_priority(self) -> int:
        """The calling thread (the one about to spin the executor) under SCHED_FIFO at
        ``realtime_priority`` (:func:`~vla_accel_ros.ros.rclpy_util.set_realtime_priority`), and the
        process mode's feeder thread too: it shares the GIL with this thread. Returns the priority
        in effect (0: normal scheduling)."""
        feeder = [self.worker.set_realtime_priority] if isinstance(self.worker, ProcessInferenceWorker) else []
        self._realtime_priority = set_realtime_priority(self.cfg.realtime_priority, self.get_logger(), feeder)
        return self._realtime_priority

    def shutdown(self) -> None:
        """Stop the worker and the camera intake, and write ``stats_file`` if set."""
        if self.worker is not None:
            self.worker.stop()
        if self._camera is not None:
            self._camera.stop()
        self._forget_gc()
        if self.cfg.stats_file:
            write_stats_file(self.cfg.stats_file, self.run_summary())

    def destroy_node(self) -> None:
        # Also after a refusal in the constructor, before these were made.
        if getattr(self, "_camera", None) is not None:
            self._camera.stop()
        if hasattr(self, "_stalls"):
            self._forget_gc()
        super().destroy_node()

    def _forget_gc(self) -> None:
        if self._stalls.gc_callback in gc.callbacks:
            gc.callbacks.remove(self._stalls.gc_callback)


def make_executor(kind: str) -> SingleThreadedExecutor | MultiThreadedExecutor:
    return MultiThreadedExecutor(num_threads=2) if kind == "multi" else SingleThreadedExecutor()


def main(args: list[str] | None = None) -> int:
    # The thread that spins the executor runs the control timer: it gets the realtime priority.
    return run_node(NODE_NAME, VlaAccelNode, lambda node: make_executor(node.cfg.executor), args,
                    before_spin=VlaAccelNode.apply_realtime_priority)


if __name__ == "__main__":
    sys.exit(main())
