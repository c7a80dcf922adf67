"""``vla_accel_node``: the rclpy adapter around the control core and the inference worker.

A managed (lifecycle) node. ``configure`` loads the URDF (``ros/robot_description.py``) and the
checkpoint, checks that the checkpoint was made for this robot (``ros/configure_checks.py``) and starts
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
  (transient local) (``ros/node_inputs.py``); ``instruction`` may change at run time
  (``ros/parameter_changes.py``);
- publishes every tick while active, reliably, one of: ``<controller>/commands``
  (Float64MultiArray, in ``controller_joints`` order), ``<controller>/joint_trajectory`` (one point
  at one period) or ``joint_command_topic`` (JointState, arm + fingers); plus
  ``<gripper_controller>/commands`` (``ros/command_publishers.py``);
- ``/diagnostics`` (status named by the node's fully qualified name; its level and message from
  ``runtime/health.py``) and ``~/stats`` (JSON) at ``stats_rate_hz``, in every lifecycle state
  (``ros/node_report.py``); service ``~/enable`` (SetBool) while active.

The control timer runs on the node clock (``use_sim_time`` works, fixed once configured) in its own
mutually exclusive callback group; inference never runs in a callback: by default in a child
process, optionally in a worker thread or on another machine (``inference_mode``). No camera
message reaches this process: a child takes, bounds and converts them (``max_image_pixels``). A
watchdog on the wall clock stands in for the control timer when the node's clock stops (sim time
without ``/clock``, ``runtime/clock_watch.py``): it holds the arm and reports ERROR. A tick later
than ``stall_after_periods`` periods is a stall, a WARN on ``/diagnostics`` that names its likely
cause (``runtime/stalls.py``); reporting runs on the wall clock too. The thread that spins the
executor runs under SCHED_FIFO (``realtime_priority``) where the system allows it. ``stats_file``
receives the run's record at shutdown (``ros/run_summary.py``).
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import replace
from typing import Any

from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_srvs.srv import SetBool

from vla_accel_ros.core.controller import Controller, TickResult
from vla_accel_ros.core.convert import controller_joint_order
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.ros.command_publishers import CommandPublisher, command_publishers
from vla_accel_ros.ros.configure_checks import check_checkpoint_present, checkpoint_checks, image_size
from vla_accel_ros.ros.inference_workers import Worker, start_inference
from vla_accel_ros.ros.node_cameras import NodeCameras, check_image_slots
from vla_accel_ros.ros.node_inputs import LOG_THROTTLE_S, NodeInputs
from vla_accel_ros.ros.node_report import NodeReport
from vla_accel_ros.ros.parameter_changes import change_parameters
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.ros.rclpy_util import declare_config, run_node, set_realtime_priority
from vla_accel_ros.ros.remote_link import RemoteLink
from vla_accel_ros.ros.robot_description import load_arm
from vla_accel_ros.ros.run_summary import TickLog, write_stats_file
from vla_accel_ros.runtime.builder import build_controller
from vla_accel_ros.runtime.clock_watch import ClockWatch
from vla_accel_ros.runtime.process_worker import ProcessInferenceWorker
from vla_accel_ros.runtime.stalls import StallMonitor

NODE_NAME = "vla_accel_node"
COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)


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
        self.robot_warning = ""  # the checkpoint's robot differs, run with allow_unmatched_robot
        self.policy_warnings: list[str] = []  # the decoder's fallbacks for what the policy lacks
        self._configure_error: ConfigError | None = None
        self._commands: list[CommandPublisher] = []
        self._remote: RemoteLink | None = None  # made at the first configure in remote mode
        self._timer: Any = None  # the control tick, while active
        self._lifecycle = "unconfigured"
        self.joint_names: list[str] = []  # kept after cleanup for the run summary

        self.realtime_priority = 0  # set by apply_realtime_priority()
        self._last_tick: TickResult | None = None
        self.ticks = TickLog(whole_run=bool(cfg.stats_file))  # else a ring of the newest: flat memory
        self.cameras: NodeCameras | None = None  # made at configure
        self._stalls = StallMonitor(cfg.period_s, cfg.stall_after_periods, cfg.stall_holdoff_s)
        gc.callbacks.append(self._stalls.gc_callback)  # a collection in the timer's thread delays a tick
        self._watchdog: Any = None  # the wall-clock stand-in for the control timer, while active
        self._clock_watch = ClockWatch(cfg.period_s, cfg.stall_after_periods)  # the watchdog's judge
        self._stall_logged = -float("inf")  # time.monotonic() a stall was last logged

        # Under a MultiThreadedExecutor the inputs never wait behind the control tick (its own group),
        # and never run during a lifecycle transition: they share the group of the lifecycle
        # services. Reporting and ~/enable run in every lifecycle state.
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self._io_group = self.default_callback_group
        # Joint states, ~/instruction, a late robot_description; the account of rejected input.
        self._inputs = NodeInputs(self, cfg, lambda: self.controller, self._now, self._clock_watch, self._stalls,
                                  self._io_group)
        self.create_service(SetBool, "~/enable", self._stalls.wrap("~/enable", self._on_enable),
                            callback_group=self._io_group)
        self.add_on_set_parameters_callback(self._stalls.wrap("parameter change", self._on_set_parameters))
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)  # the report's and the watchdog's
        self._report = NodeReport(self, self._io_group, self._steady, self._inputs, self._stalls, self._now)
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

    @property
    def last_tick(self) -> TickResult | None:
        """The newest tick's result (None before the first)."""
        return self._last_tick

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
        self._clock_watch.restart(time.monotonic(), self._now())
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
        subscriptions = [*self._inputs.subscriptions.values(), *([self._remote.subscription] if self._remote else [])]
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
        if self.cameras is not None:
            self.cameras.stop()
            self.cameras = None
        if self.worker is not None:
            self.worker.stop()
        if self._remote is not None:
            self._remote.disconnect()
        for command in self._commands:
            self.destroy_lifecycle_publisher(command.publisher)
        self._commands = []
        self.worker = self.controller = self.kin = None
        self.robot_warning = ""
        self.policy_warnings = []

    def _configure(self) -> None:
        cfg, runner, inputs = self.cfg, self.cfg.runner_config(), self._inputs
        local = cfg.inference and cfg.inference_mode != "remote"  # remote: the inference node checks its checkpoint
        if local:
            check_checkpoint_present(runner)  # before any URDF wait: the example's placeholder
        # Spawned first: its imports run while the URDF and the policy load.
        self.cameras = NodeCameras(cfg, lambda: self.controller, self._now, inputs.stamp_in_order, inputs.reject,
                                   inputs.on_camera_output, self._stalls.timed)
        self.cameras.spawn()
        arm = load_arm(self, cfg)
        self.kin, inputs.description_fallback = arm.kin, arm.fallback
        self.get_logger().info(f"URDF from {arm.source}: arm joints {list(arm.kin.joint_names)}, "
                               f"gripper {list(arm.kin.gripper_joint_names)}")
        controller_config = cfg.controller_config()
        if local:  # first: a policy for another arm is the root cause of any mismatch below
            checked = checkpoint_checks(runner, cfg, self.kin)
            runner = replace(runner, resolved=checked.resolved)  # the worker loads it without resolving it again
            controller_config = replace(controller_config, action_space=checked.resolved.action_space)
            self.robot_warning = checked.robot_warning
            if self.robot_warning:
                self.get_logger().warning(self.robot_warning)
        self.controller_joints = controller_joint_order(self.kin, cfg.controller_joints)
        self.controller = build_controller(controller_config, self.kin, enabled=False,
                                           instruction=str(self.get_parameter("instruction").value))
        self.joint_names = list(self.kin.joint_names)
        model_size = 0
        if cfg.inference:
            if cfg.inference_mode == "remote" and self._remote is None:
                self._remote = RemoteLink(self, cfg.remote_compressed_image, inputs.reject, self._io_group)
            inference = start_inference(cfg, runner, self.controller, self.kin, self._now, self._remote)
            self.worker, self.policy_warnings = inference.worker, inference.warnings
            model_size = inference.model_image_size
            if stand_in := check_image_slots(len(self.cameras), inference.model_image_slots, cfg.allow_stand_in_images):
                self.policy_warnings = [*self.policy_warnings, stand_in]
        self.image_size = image_size(cfg.image_size, model_size)
        inputs.subscribe()
        self.cameras.start(self.resolve_topic_name, self.image_size, cfg.max_image_pixels, cfg.image_reliable,
                           self.context.get_domain_id(), self.get_name(), self.get_namespace())
        # Outputs, reliable; they publish only while active.
        self._commands = command_publishers(
            cfg, self.kin, self.controller_joints, clock=self.get_clock(),
            make=lambda msg_type, topic: self.create_lifecycle_publisher(msg_type, topic, COMMAND_QOS))
        for warning in self.policy_warnings:
            self.get_logger().warning(warning)
        # Start-up garbage (imports, model, URDF) is never scanned again: a full collection over it
        # took 20-80 ms, i.e. whole missed ticks, when it happened to run in the executor thread.
        gc.collect()
        gc.freeze()

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # --- parameters and ~/enable ------------------------------------------------------------
    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        return change_parameters(params, self._lifecycle, self.cfg.max_instruction_chars, self._inputs.reject,
                                 self._inputs.set_instruction)

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
            stopped_s = self._clock_watch.stopped_for(time.monotonic())
            self.get_logger().info(f"clock running again after {stopped_s:.3f} s: the control timer ticks")
        self._tick(self._now())

    def _on_watchdog(self) -> None:
        """Stands in for the control timer when the node's clock has stopped (``runtime/clock_watch.py``):
        holds the arm (the controller's clock fault) and ticks once a period on the wall clock."""
        if self.controller is None:
            return
        wall, now = time.monotonic(), self._now()
        tick, stopped = self._clock_watch.look(wall, now, self.get_clock().ros_time_is_active,
                                               bool(self.controller.clock_fault))
        if stopped:
            self.controller.set_clock_fault(stopped)
            self.get_logger().error(stopped)
        if tick:
            self._tick(now)

    def _tick(self, now: float) -> None:
        assert self.controller is not None and self.kin is not None
        wall = time.monotonic()
        self._clock_watch.ticked(wall)
        result = self.controller.tick(now)
        self._last_tick = result
        self._report.health.ticked(result.source, result.stamp)
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
        """What ``~/stats`` publishes (``ros/node_report.py``)."""
        return self._report.stats()

    def run_summary(self) -> dict[str, Any]:
        """Statistics of the whole run plus the tick log (for ``stats_file``)."""
        return self._report.run_summary()

    def apply_realtime_priority(self) -> int:
        """The calling thread (the one about to spin the executor) under SCHED_FIFO at
        ``realtime_priority`` (:func:`~vla_accel_ros.ros.rclpy_util.set_realtime_priority`), and the
        process mode's feeder thread too: it shares the GIL with this thread. Returns the priority
        in effect (0: normal scheduling)."""
        feeder = [self.worker.set_realtime_priority] if isinstance(self.worker, ProcessInferenceWorker) else []
        self.realtime_priority = set_realtime_priority(self.cfg.realtime_priority, self.get_logger(), feeder)
        return self.realtime_priority

    def shutdown(self) -> None:
        """Stop the worker and the camera intake, and write ``stats_file`` if set."""
        if self.worker is not None:
            self.worker.stop()
        if self.cameras is not None:
            self.cameras.stop()
        self._forget_gc()
        if self.cfg.stats_file:
            write_stats_file(self.cfg.stats_file, self.run_summary())

    def destroy_node(self) -> None:
        # Also after a refusal in the constructor, before these were made.
        if (cameras := getattr(self, "cameras", None)) is not None:
            cameras.stop()
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
