"""rclpy pieces shared by the package's nodes and in-process helper nodes.

- ``LATCHED_QOS``: the transient-local profile of ``/robot_description``;
- :func:`declare_config`: declare every field of a config dataclass as a described, ranged ROS
  parameter and build the config from the values (``ConfigError`` naming a bad one);
- :func:`run_node`: the ``main()`` of a node executable (refuse to start with the reason, spin,
  shut down in order), and :func:`set_realtime_priority` for the thread that spins;
- :class:`BackgroundNode`: a plain node in a private context and DDS domain, spun by a daemon
  thread of this process (replay's player, the sim runner's monitor).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import rclpy
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    ParameterType,
)
from rclpy.context import Context
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions

from vla_accel_ros.core.settings import (
    ConfigError,
    ParamSpec,
    from_params,
    parameter_specs,
)

LATCHED_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
_KINDS = {bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
          float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING,
          tuple: ParameterType.PARAMETER_STRING_ARRAY}


def parameter_descriptor(spec: ParamSpec) -> ParameterDescriptor:
    """The ROS descriptor of one config field: type, description, range, choices, read-only
    unless the field is marked dynamic."""
    text = spec.description + (f" (one of: {', '.join(spec.choices)})" if spec.choices else "")
    desc = ParameterDescriptor(name=spec.name, type=_KINDS[spec.kind], description=text, read_only=not spec.dynamic)
    if spec.range is not None and spec.kind is float:
        desc.floating_point_range = [FloatingPointRange(from_value=float(spec.range[0]), to_value=float(spec.range[1]))]
    elif spec.range is not None and spec.kind is int:
        desc.integer_range = [IntegerRange(from_value=int(spec.range[0]), to_value=int(spec.range[1]), step=1)]
    if spec.choices:
        desc.additional_constraints = f"one of: {', '.join(spec.choices)}"
    return desc


def declare_config(node: Node, config_type: type) -> Any:
    """Declare every field of ``config_type`` on ``node`` and build the config from the values."""
    values: dict[str, Any] = {}
    overrides = getattr(node, "_parameter_overrides", {})
    for spec in parameter_specs(config_type):
        if spec.kind is float and spec.name in overrides and overrides[spec.name].type_ == Parameter.Type.INTEGER:
            # YAML and launch files often write 50 for 50.0; accept it instead of failing.
            overrides[spec.name] = Parameter(spec.name, Parameter.Type.DOUBLE, float(overrides[spec.name].value))
        try:
            if spec.kind is tuple:  # an empty default list would be typed as a byte array
                param = node.declare_parameter(spec.name, Parameter.Type.STRING_ARRAY, parameter_descriptor(spec))
                value = list(param.value) if param.value is not None else list(spec.default)
            else:
                value = node.declare_parameter(spec.name, spec.default, parameter_descriptor(spec)).value
        except Exception as err:  # rclpy's type/range exceptions: re-raise with the parameter's meaning
            raise ConfigError(f"invalid parameter '{spec.name}': {err} ({spec.description})") from err
        values[spec.name] = value
    return from_params(config_type, values)


SPIN_POLL_S = 0.1  # how soon the spin loop notices a SIGINT when no callback is due


def run_node(name: str, make_node: Callable[[], Any], make_executor: Callable[[Any], Executor],
             args: list[str] | None = None, before_spin: Callable[[Any], Any] | None = None) -> int:
    """A node executable's ``main()``: 2 when the node refuses to start (the reason on stderr),
    else spin until Ctrl-C or an external shutdown, then ``node.shutdown()`` and clean up; 0.

    SIGINT ends the spin, and one arriving during the clean-up (statistics, the inference child, the
    executor) does not cut it short. Under ros2 launch a terminal's Ctrl-C arrives
    twice: once to the process group, once forwarded by launch."""
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    interrupted = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted.set()  # the spin loop below ends within SPIN_POLL_S

    signal.signal(signal.SIGINT, on_sigint)
    try:
        node = make_node()
    except ValueError as err:  # ConfigError, bad URDF or checkpoint: refuse to start, say why
        if not getattr(err, "logged", False):  # a node logs its own refusal through the ROS logger
            print(f"[{name}] refusing to start: {err}", file=sys.stderr, flush=True)
        rclpy.try_shutdown()
        return 2
    executor = make_executor(node)
    executor.add_node(node)
    if before_spin is not None:
        before_spin(node)
    try:
        while not interrupted.is_set() and executor.context.ok():
            executor.spin_once(timeout_sec=SPIN_POLL_S)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.shutdown()
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
        # A node executable's main is its last act. The interpreter's exit resets the handlers it
        # installed to the default, so a SIGINT then would end the process by the signal: ignore it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return 0


def set_realtime_priority(priority: int, logger: Any, also: Sequence[Callable[[int], None]] = ()) -> int:
    """Put the calling thread (the one about to spin the executor) under SCHED_FIFO at ``priority``,
    so that other processes on the machine cannot delay the control tick by a scheduler slice.
    Threads it creates later (executor pools) inherit it; an inference thread started before does
    not (it would take a core). ``also`` sets it on other threads that share this one's GIL (the
    process worker's feeder). Returns the priority in effect: 0 (normal scheduling) when
    ``priority`` is 0 or the system refuses, which ``logger`` warns about."""
    if priority <= 0:
        return 0
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        for set_priority in also:
            set_priority(priority)
    except (OSError, AttributeError) as err:
        logger.warn(f"could not run the control loop at SCHED_FIFO priority {priority} ({err}); it runs with normal "
                    f"scheduling, so busy processes can delay ticks by a few ms. Grant CAP_SYS_NICE or an rtprio "
                    f"limit, or set realtime_priority: 0 to silence this")
        return 0
    logger.info(f"control loop runs at SCHED_FIFO priority {priority}")
    return priority


class BackgroundNode:
    """A node in its own context on ``domain_id``; ``spin()`` starts a daemon thread that spins it
    until ``close()`` (or the context's shutdown)."""

    def __init__(self, name: str, domain_id: int, **node_kwargs: Any) -> None:
        self.context = Context()
        # rcl gets the program name alone: the command line belongs to the vla-accel command (its own
        # --remap words are bag-topic remaps, not rcl rules).
        rclpy.init(args=sys.argv[:1], context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(name, context=self.context, **node_kwargs)
        self.executor = SingleThreadedExecutor(context=self.context)
        self._thread: threading.Thread | None = None

    def spin(self, timeout_sec: float) -> None:
        """Start spinning (call it once the node's subscriptions exist)."""
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, args=(timeout_sec,), daemon=True)
        self._thread.start()

    def _spin(self, timeout_sec: float) -> None:
        while rclpy.ok(context=self.context):
            try:
                self.executor.spin_once(timeout_sec=timeout_sec)
            except Exception:  # the context was shut down while waiting
                break

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
