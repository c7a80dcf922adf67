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

- subscribes ``image_topic`` (sensor_msgs/Image, or CompressedImage), ``joint_states_topic``
  (sensor-data QoS), ``~/instruction`` (std_msgs/String) and, when the URDF is not given by
  parameter, ``robot_description`` (transient local);
- publishes every tick while active, reliably, one of: ``<controller>/commands``
  (Float64MultiArray, in ``controller_joints`` order), ``<controller>/joint_trajectory`` (one point
  at one period) or ``joint_command_topic`` (JointState, arm + fingers); plus
  ``<gripper_controller>/commands`` (``ros/command_publishers.py``);
- ``/diagnostics`` (status named by the node's fully qualified name; its level and message from
  ``runtime/health.py``) and ``~/stats`` (JSON) at ``stats_rate_hz``, in every lifecycle state;
  service ``~/enable`` (SetBool) while active.

The control timer runs on the node clock (``use_sim_time`` works) in its own mutually exclusive
callback group; inference never runs in a callback: by default in a child process, optionally in a
worker thread or on another machine (``inference_mode``). The thread that spins the executor runs
under SCHED_FIFO (``realtime_priority``) where the system allows it. ``stats_file`` receives the
run's record at shutdown (``ros/run_summary.py``).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from std_srvs.srv import SetBool

from vla_accel_ros.core.controller import Controller, TickResult
from vla_accel_ros.core.convert import compressed_to_rgb, controller_joint_order, image_to_rgb, joint_state_to_arm
from vla_accel_ros.core.input_errors import InputErrorLog
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.core.robot_record import check_checkpoint_robot
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.core.stamp_order import StampOrder
from vla_accel_ros.ros.command_publishers import CommandPublisher, command_publishers
from vla_accel_ros.ros.inference_workers import Worker, start_inference
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.ros.rclpy_util import LATCHED_QOS, declare_config, run_node, set_realtime_priority
from vla_accel_ros.ros.remote_link import RemoteLink
from vla_accel_ros.ros.robot_description import ROBOT_DESCRIPTION_TOPIC, description_mismatch, load_arm
from vla_accel_ros.ros.run_summary import TickLog, own_peak_rss_mb, write_stats_file
from vla_accel_ros.runtime.builder import build_controller
from vla_accel_ros.runtime.health import ERROR, OK, WARN, Health, NodeState
from vla_accel_ros.runtime.process_worker import ProcessInferenceWorker

NODE_NAME = "vla_accel_node"
COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
LOG_THROTTLE_S = 10.0  # each kind of input problem is logged at most once per this long
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
        self._health = Health(1.0 / cfg.stats_rate_hz, stale_after_s=max(cfg.action_timeout_s, 3 * cfg.period_s))
        self._realtime_priority = 0  # set by apply_realtime_priority()
        self._last_tick: TickResult | None = None
        self.ticks = TickLog()
        self._stamps = StampOrder(max(cfg.camera_timeout_s, cfg.joint_state_timeout_s))

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
        outputs = ", ".join(c.publisher.topic_name for c in self._commands)
        subscriptions = [*self._inputs.values(), *([self._remote.subscription] if self._remote else [])]
        inputs = ", ".join(s.topic_name for s in subscriptions)
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
        """Undo on_configure: stop the worker, drop the command publishers."""
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
                self.get_logger().warn(self._robot_warning)
        self.controller_joints = controller_joint_order(self.kin, cfg.controller_joints)
        self.controller = build_controller(cfg.controller_config(), self.kin, enabled=False,
                                           instruction=str(self.get_parameter("instruction").value))
        self._joint_names = list(self.kin.joint_names)
        model_size = 0
        if cfg.inference:
            if cfg.inference_mode == "remote" and self._remote is None:
                self._remote = RemoteLink(self, cfg.remote_compressed_image, self._reject, self._io_group)
            inference = start_inference(cfg, self.controller, self.kin, self._now, self._remote)
            self.worker, self._policy_warnings = inference.worker, inference.warnings
            model_size = inference.model_image_size
        self.image_size = cfg.image_size or model_size or 128
        if model_size and self.image_size != model_size:
            raise ConfigError(f"parameter 'image_size' = {cfg.image_size} but the checkpoint expects "
                              f"{model_size}; set 0 to use the checkpoint's size")
        self._subscribe_inputs()
        # Outputs, reliable; they publish only while active.
        self._commands = command_publishers(
            cfg, self.kin, self.controller_joints, clock=self.get_clock(),
            make=lambda msg_type, topic: self.create_lifecycle_publisher(msg_type, topic, COMMAND_QOS))
        for warning in self._policy_warnings:
            self.get_logger().warn(warning)
        # Start-up garbage (imports, model, URDF) is never scanned again: a full collection over it
        # took 20-80 ms, i.e. whole missed ticks, when it happened to run in the executor thread.
        gc.collect()
        gc.freeze()

    def _subscribe_inputs(self) -> None:
        """Sensor data best effort (matches reliable publishers too). Made once and kept over cleanup
        (their callbacks ignore messages while unconfigured): destroying a subscription while a
        multi-threaded executor waits on it raises in that executor."""
        cfg = self.cfg
        wanted = [(CompressedImage if cfg.compressed_image else Image, self._on_image, cfg.image_topic,
                   qos_profile_sensor_data),
                  (JointState, self._on_joint_state, cfg.joint_states_topic, qos_profile_sensor_data),
                  (String, self._on_instruction, "~/instruction", 10)]
        if self._description_fallback:  # a robot_state_publisher that starts after us is checked
            wanted.append((String, self._on_late_description, ROBOT_DESCRIPTION_TOPIC, LATCHED_QOS))
        for msg_type, callback, topic, qos in wanted:
            if topic not in self._inputs:
                self._inputs[topic] = self.create_subscription(msg_type, topic, callback, qos,
                                                               callback_group=self._io_group)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # --- inputs -------------------------------------------------------------------------------
    def _reject(self, message: str) -> None:
        """Count, keep for /diagnostics, and log each kind of problem once per LOG_THROTTLE_S."""
        if self._errors.add(message, time.monotonic()):
            self.get_logger().warn(message)

    def _header_in_order(self, what: str, msg: Any) -> bool:
        take, problem = self._stamps.check(what, msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9)
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

    def _on_image(self, msg: Image | CompressedImage) -> None:
        if self.controller is None or not self._header_in_order("image", msg):
            return
        try:
            rgb = (compressed_to_rgb if self.cfg.compressed_image else image_to_rgb)(msg, self.image_size)
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
        self._health.ticked(result.source, result.stamp)
        if result.q_command is not None:
            for command in self._commands:
                command.publish(result)
        self.ticks.add(wall, result, self.kin.n)

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
        out.update({"enabled": self.controller.enabled, "instruction": self.controller.instruction,
                    "source": tick.source if tick else "", "reason": tick.reason if tick else "",
                    "hold_reason": self.controller.hold_reason, **self.controller.stats.__dict__,
                    **self.controller.timing()})
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
            recent_input_errors=self._errors.recent(time.monotonic(), self._health.window_s))

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
        """Stop the worker and write ``stats_file`` if set."""
        if self.worker is not None:
            self.worker.stop()
        if self.cfg.stats_file:
            write_stats_file(self.cfg.stats_file, self.run_summary())


def make_executor(kind: str) -> SingleThreadedExecutor | MultiThreadedExecutor:
    return MultiThreadedExecutor(num_threads=2) if kind == "multi" else SingleThreadedExecutor()


def main(args: list[str] | None = None) -> int:
    # The thread that spins the executor runs the control timer: it gets the realtime priority.
    return run_node(NODE_NAME, VlaAccelNode, lambda node: make_executor(node.cfg.executor), args,
                    before_spin=VlaAccelNode.apply_realtime_priority)


if __name__ == "__main__":
    sys.exit(main())
