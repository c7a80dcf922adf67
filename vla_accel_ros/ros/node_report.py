"""What the control node reports, like a diagnostic_updater: ``~/stats`` (JSON) and its
``/diagnostics`` status at ``stats_rate_hz`` on the wall clock (a clock that stops, sim time without
``/clock``, must not silence it), in every lifecycle state, and the run summary for ``stats_file``.
The status is named by the node's fully qualified name (two arms in two namespaces report apart on
the one topic); ``runtime/health.py`` judges its level and message. Reads the node's state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from std_msgs.msg import String

from vla_accel_ros.core.controller import Controller, TickResult
from vla_accel_ros.ros.inference_workers import Worker
from vla_accel_ros.ros.node_cameras import NodeCameras
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.ros.run_summary import TickLog, own_peak_rss_mb
from vla_accel_ros.runtime.health import ERROR, OK, WARN, Health, NodeState
from vla_accel_ros.runtime.instruction_log import instruction_stats
from vla_accel_ros.runtime.stalls import StallMonitor

if TYPE_CHECKING:
    from vla_accel_ros.ros.node_inputs import NodeInputs

LEVELS = {OK: DiagnosticStatus.OK, WARN: DiagnosticStatus.WARN, ERROR: DiagnosticStatus.ERROR}


class ReportedNode(Protocol):
    """What the report reads of the node (``ros/node.py``'s VlaAccelNode), besides rclpy's Node."""

    cfg: NodeConfig
    controller: Controller | None
    worker: Worker | None
    cameras: NodeCameras | None
    ticks: TickLog
    robot_warning: str
    policy_warnings: list[str]
    realtime_priority: int
    joint_names: list[str]

    @property
    def lifecycle_state(self) -> str: ...

    @property
    def last_tick(self) -> TickResult | None: ...

    def create_publisher(self, msg_type: Any, topic: str, qos: int) -> Any: ...

    def create_timer(self, period_s: float, callback: Callable[[], None], callback_group: Any, clock: Any) -> Any: ...

    def get_fully_qualified_name(self) -> str: ...

    def get_clock(self) -> Any: ...


class NodeReport:
    """The node's publishers of ``~/stats`` and ``/diagnostics``, their timer (in ``callback_group``,
    on the wall clock ``steady``, timed by ``stalls``) and the :class:`Health` that judges. Besides
    the node's public state it reports its ``inputs``' errors and ``stalls``; ``now()``: its clock."""

    def __init__(self, node: ReportedNode, callback_group: Any, steady: Any, inputs: NodeInputs,
                 stalls: StallMonitor, now: Callable[[], float]) -> None:
        self._node, self._inputs, self._stalls, self._now = node, inputs, stalls, now
        cfg = node.cfg
        self.health = Health(1.0 / cfg.stats_rate_hz, stale_after_s=max(cfg.action_timeout_s, 3 * cfg.period_s),
                             action_timeout_s=cfg.action_timeout_s, fallback_max_s=cfg.fallback_max_s)
        self._pub_diag = node.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._pub_stats = node.create_publisher(String, "~/stats", 10)
        self._timer = node.create_timer(1.0 / cfg.stats_rate_hz, stalls.wrap("report", self.publish),
                                        callback_group=callback_group, clock=steady)

    def stats(self) -> dict[str, Any]:
        """``~/stats``: the lifecycle state, input errors and settings; once configured also the
        controller's, the stall monitor's, the cameras' and the inference worker's counters."""
        node = self._node
        out: dict[str, Any] = {"lifecycle_state": node.lifecycle_state, "control_rate_hz": node.cfg.control_rate_hz,
                               **self._inputs.errors.to_json(),
                               "peak_rss_mb": own_peak_rss_mb(), "realtime_priority": node.realtime_priority,
                               "robot_warning": node.robot_warning,
                               "decoder": node.cfg.policy.decoder if node.worker else ""}
        controller = node.controller
        if controller is None:
            return out
        tick = node.last_tick
        out.update({"enabled": controller.enabled, **instruction_stats(controller.instruction),
                    "source": tick.source if tick else "", "reason": tick.reason if tick else "",
                    "hold_reason": controller.hold_reason, "clock_fault": controller.clock_fault,
                    **controller.stats.__dict__, **controller.timing(), **controller.chunk_timing(),
                    **self._stalls.stats()})
        if node.cameras is not None:
            out.update(node.cameras.stats())
            out["camera_output_lines"] = self._inputs.camera_output.total
        if node.worker is not None:
            out.update({f"inference_{k}": v for k, v in node.worker.stats().items()})
            out["inference_alive"] = node.worker.alive
        return out

    def state(self, stats: dict[str, Any]) -> NodeState:
        """What /diagnostics judges (``runtime/health.py``)."""
        node = self._node
        tick, controller, worker = node.last_tick, node.controller, node.worker
        return NodeState(
            lifecycle=node.lifecycle_state, configured=controller is not None, stats=stats, clock_s=self._now(),
            tick_source=tick.source if tick else "", tick_reason=tick.reason if tick else "",
            commanded=tick is not None and tick.q_command is not None, inference=worker is not None,
            inference_alive=worker is not None and worker.alive,
            action_starved_s=controller.action_starved_s if controller is not None else 0.0,
            warnings=[*([node.robot_warning] if node.robot_warning else []), *node.policy_warnings],
            recent_input_errors=self._inputs.errors.recent(time.monotonic(), self.health.window_s),
            clock_stopped=controller.clock_fault if controller is not None else "",
            stall=self._stalls.report(self._now()) if node.lifecycle_state == "active" else "")

    def publish(self) -> None:
        """``~/stats``, then the /diagnostics status with the stats as its values."""
        stats = self.stats()
        self._pub_stats.publish(String(data=json.dumps(stats)))
        report = self.health.assess(self.state(stats))
        status = DiagnosticStatus(name=f"{self._node.get_fully_qualified_name()}: control loop",
                                  hardware_id="vla_accel_ros", level=LEVELS[report.level], message=report.message)
        status.values = [KeyValue(key=k, value=str(v)) for k, v in stats.items()]
        status.values += [KeyValue(key=f"recent_input_error_{i}", value=m)
                          for i, m in enumerate(report.recent_input_errors)]
        diag = DiagnosticArray(status=[status])
        diag.header.stamp = self._node.get_clock().now().to_msg()
        self._pub_diag.publish(diag)

    def run_summary(self) -> dict[str, Any]:
        """Statistics of the whole run plus the tick log (for ``stats_file``)."""
        node = self._node
        return {**self.stats(), **node.ticks.jitter_ms(node.cfg.period_s), **node.ticks.affected_ticks(),
                "executor": node.cfg.executor, "switch_interval_s": node.cfg.switch_interval_s,
                "joint_names": node.joint_names, "tick_log": node.ticks.to_json()}
