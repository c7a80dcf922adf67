"""Arm kinematics from a URDF, on Pinocchio.

The *arm* is the chain of movable joints from the URDF root to the tool-centre-point (TCP)
frame; every other movable joint (the gripper fingers, say) is a *gripper* joint and is held at
its lower limit for kinematics. All vectors are in the arm's joint order, in joint coordinates
(one number per joint: an angle for revolute and continuous joints, metres for prismatic).

End-effector deltas are 6-vectors ``[dx, dy, dz, droll, dpitch, dyaw]`` in the world (URDF root)
frame; the angular part is a rotation vector applied on the left, ``R_new = exp(w) @ R``, which
for the small per-step deltas of a policy equals roll/pitch/yaw increments to first order.
"""

from __future__ import annotations

import math
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.urdf_checks import check_urdf

# pinocchio, imported when the first arm is built: a quarter of a second that the modules importing
# this one for their settings (and the commands' --help) do not need.
pin: Any = None


def _import_pinocchio() -> None:
    global pin
    if pin is None:
        import pinocchio

        pin = pinocchio


class MissingJointsError(ValueError):
    """A joint-state message lacks some of the arm's joints."""


@dataclass(frozen=True)
class JointLimits:
    """Per-joint limits; position limits are +-inf for continuous joints."""

    lower: np.ndarray
    upper: np.ndarray
    velocity: np.ndarray
    effort: np.ndarray


@dataclass(frozen=True)
class Pose:
    position: np.ndarray  # (3,)
    rotation: np.ndarray  # (3, 3)


def _read_urdf(source: str | Path) -> tuple[str, str]:
    """Return (xml_text, label) for a path or an XML string; raise ValueError with the reason."""
    text = str(source)
    if text.lstrip().startswith("<"):
        return text, "<robot_description string>"
    path = Path(text).expanduser()
    if not path.is_file():
        raise ValueError(f"URDF file not found: {path}")
    try:
        return path.read_text(), str(path)
    except (OSError, UnicodeDecodeError) as err:  # unreadable, or not text
        raise ValueError(f"cannot read URDF file {path}: {err}") from err


class ArmKinematics:
    """FK, Jacobian, differential IK, limits and name mapping for one serial arm."""

    def __init__(self, urdf: str | Path, tcp_frame: str = "tcp") -> None:
        """Build from a URDF path or XML string; raise ValueError, naming the joint or link at fault,
        for a URDF this class cannot serve (see :mod:`vla_accel_ros.core.urdf_checks`)."""
        _import_pinocchio()
        xml, label = _read_urdf(urdf)
        checked = check_urdf(xml, label, tcp_frame)
        urdf_joints = checked.movable_joints
        self.source = label
        self.urdf_xml = xml
        try:
            full = pin.buildModelFromXML(xml)
        except Exception as err:  # pinocchio raises RuntimeError/ValueError with C++ text
            raise ValueError(f"Pinocchio could not build a model from {label}: {err}") from err
        self.tcp_frame = tcp_frame  # check_urdf found it, and a movable joint before it

        # Arm = movable joints on the chain root -> TCP frame; all others are locked.
        chain: list[int] = []
        jid = full.frames[full.getFrameId(tcp_frame)].parentJoint
        while jid > 0:
            chain.append(jid)
            jid = full.parents[jid]
        chain.reverse()
        arm_ids = set(chain)
        locked = [j for j in range(1, full.njoints) if j not in arm_ids]
        q_ref = pin.neutral(full)
        for j in locked:  # hold gripper joints at their lower limit (fingers closed/at rest)
            idx = full.joints[j].idx_q
            if full.joints[j].nq == 1 and np.isfinite(full.lowerPositionLimit[idx]):
                q_ref[idx] = full.lowerPositionLimit[idx]
        self.model = pin.buildReducedModel(full, locked, q_ref) if locked else full
        self._per_thread = threading.local()  # each thread's own Pinocchio workspace (see ``data``)
        self._tcp_id = self.model.getFrameId(tcp_frame)

        self.joint_names: tuple[str, ...] = tuple(full.names[j] for j in chain)
        if self.joint_names != checked.arm_joints:  # the XML checks judged another chain than Pinocchio built
            raise ValueError(f"{label}: Pinocchio's arm chain to '{tcp_frame}' ({', '.join(self.joint_names)}) "
                             f"differs from the URDF's ({', '.join(checked.arm_joints)})")
        self.gripper_joint_names: tuple[str, ...] = tuple(full.names[j] for j in locked)
        self.n = len(self.joint_names)
        self._index = {name: i for i, name in enumerate(self.joint_names)}
        self._continuous = self.model.nq != self.model.nv
        self._q_neutral = pin.neutral(self.model)
        self.limits = self._limits(self.joint_names, urdf_joints)
        self._lower, self._upper = self.limits.lower.tolist(), self.limits.upper.tolist()
        self.gripper_limits = self._limits(self.gripper_joint_names, urdf_joints)

    @staticmethod
    def _limits(names: Sequence[str], urdf_joints: dict[str, ET.Element]) -> JointLimits:
        lo, hi, vel, eff = [], [], [], []
        for name in names:
            joint = urdf_joints[name]
            lim = joint.find("limit")
            attributes: dict[str, str] = dict(lim.attrib) if lim is not None else {}

            def get(key: str, default: float, attributes: dict[str, str] = attributes) -> float:
                return float(attributes.get(key, default))

            if joint.get("type") == "continuous":
                lo.append(-np.inf)
                hi.append(np.inf)
            else:
                lo.append(get("lower", 0.0))
                hi.append(get("upper", 0.0))
            velocity = get("velocity", 0.0)
            vel.append(velocity if velocity > 0 else np.inf)  # gripper joints: 0/absent means unlimited
            eff.append(get("effort", 0.0))
        as_arr = lambda v: np.asarray(v, dtype=float)  # noqa: E731
        return JointLimits(as_arr(lo), as_arr(hi), as_arr(vel), as_arr(eff))

    @property
    def data(self) -> pin.Data:
        """The calling thread's Pinocchio workspace. FK and Jacobians write their results into it
        and read them back, so two threads sharing one workspace (the node's control timer doing IK
        beside an inference thread's Kalman filter) could read each other's pose."""
        data = getattr(self._per_thread, "data", None)
        if data is None:
            data = self._per_thread.data = self.model.createData()
        return data

    # --- configuration conversion -------------------------------------------------------------
    def _to_pin(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=float)
        if q.shape != (self.n,):
            raise ValueError(f"expected {self.n} joint values, got shape {q.shape}")
        # Continuous joints are (cos, sin) in Pinocchio; integrate from neutral maps angles there.
        return pin.integrate(self.model, self._q_neutral, q) if self._continuous else q

    # --- kinematics ---------------------------------------------------------------------------
    def fk(self, q: np.ndarray) -> Pose:
        """Pose of the TCP frame in the root frame."""
        data = self.data
        pin.framesForwardKinematics(self.model, data, self._to_pin(q))
        placement = data.oMf[self._tcp_id]
        return Pose(placement.translation.copy(), placement.rotation.copy())

    def fk_acceleration(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> tuple[Pose, np.ndarray]:
        """Pose of the TCP frame and its linear acceleration (m/s^2, root frame) at joint positions
        ``q``, velocities ``qd`` and accelerations ``qdd``: ``J qdd + dJ/dt qd``, from one pass of
        Pinocchio's forward kinematics to second order."""
        qd, qdd = np.asarray(qd, dtype=float), np.asarray(qdd, dtype=float)
        if qd.shape != (self.n,) or qdd.shape != (self.n,):
            raise ValueError(f"expected {self.n} joint velocities and accelerations, got {qd.shape} and {qdd.shape}")
        data = self.data
        pin.forwardKinematics(self.model, data, self._to_pin(q), qd, qdd)
        placement = pin.updateFramePlacement(self.model, data, self._tcp_id)
        acceleration = pin.getFrameClassicalAcceleration(
            self.model, data, self._tcp_id, pin.ReferenceFrame.LOCAL_WORLD_ALIGNED).linear
        return Pose(placement.translation.copy(), placement.rotation.copy()), np.array(acceleration)

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        """6 x n TCP Jacobian, linear rows first, in the root-aligned frame at the TCP."""
        return pin.computeFrameJacobian(
            self.model, self.data, self._to_pin(q), self._tcp_id, pin.ReferenceFrame.LOCAL_WORLD_ALIGNED
        ).copy()

    @staticmethod
    def pose_delta(start: Pose, end: Pose) -> np.ndarray:
        """6-D delta taking ``start`` to ``end``: translation, then rotation vector (world frame)."""
        return np.concatenate([end.position - start.position, pin.log3(end.rotation @ start.rotation.T)])

    def ik(self, q: np.ndarray, ee_delta: np.ndarray, damping: float = 0.05, iterations: int = 3) -> np.ndarray:
        """Damped-least-squares differential IK: joint targets that move the TCP by ``ee_delta``.

        A few DLS iterations on the pose error toward the target pose make large deltas accurate;
        the result is not clamped (see :meth:`clamp`).
        """
        ee_delta = np.asarray(ee_delta, dtype=float)
        if ee_delta.shape != (6,) or not np.all(np.isfinite(ee_delta)):
            raise ValueError(f"ee_delta must be 6 finite numbers, got {ee_delta!r}")
        start = self.fk(q)
        target = Pose(start.position + ee_delta[:3], pin.exp3(ee_delta[3:]) @ start.rotation)
        q_new = np.asarray(q, dtype=float).copy()
        lam2 = damping**2
        for _ in range(iterations):
            error = self.pose_delta(self.fk(q_new), target)
            jac = self.jacobian(q_new)
            q_new = q_new + jac.T @ np.linalg.solve(jac @ jac.T + lam2 * np.eye(6), error)
            if np.linalg.norm(error) < 1e-9:
                break
        return q_new

    # --- limits -------------------------------------------------------------------------------
    def clamp(self, q_target: np.ndarray, q_current: np.ndarray, dt: float) -> np.ndarray:
        """Clamp a joint target to the position limits and to what the velocity limits reach in dt."""
        q_target = np.asarray(q_target, dtype=float)
        q_current = np.asarray(q_current, dtype=float)
        step = self.limits.velocity * max(float(dt), 0.0)
        q = np.clip(q_target, q_current - step, q_current + step)
        return np.clip(q, self.limits.lower, self.limits.upper)

    def within_limits(self, q: np.ndarray, tol: float = 1e-9) -> bool:
        q = np.asarray(q, dtype=float)
        return bool(np.all(np.isfinite(q)) and np.all(q >= self.limits.lower - tol)
                    and np.all(q <= self.limits.upper + tol))

    def limit_margin(self, q: np.ndarray) -> np.ndarray:
        """Per joint, distance to the nearer position limit as a fraction of the range (0 at a limit,
        0.5 at mid-range, 0.5 for continuous joints)."""
        span = self.limits.upper - self.limits.lower
        q = np.asarray(q, dtype=float)
        margin = np.minimum(q - self.limits.lower, self.limits.upper - q) / np.where(np.isfinite(span), span, 1.0)
        return np.where(np.isfinite(span), np.clip(margin, 0.0, 0.5), 0.5)

    def min_limit_margin(self, q: np.ndarray) -> float:
        """The smallest of :meth:`limit_margin` (the joint nearest its limit), on plain floats: the
        kinematic threshold asks once per control step, where NumPy's calls cost more."""
        smallest = 0.5
        for value, lower, upper in zip(np.asarray(q, dtype=float).tolist(), self._lower, self._upper):
            if not math.isfinite(value):
                return math.nan
            span = upper - lower
            if span <= 0.0:  # a joint whose limits coincide is always at them
                smallest = 0.0
            elif math.isfinite(span):
                smallest = min(smallest, max(min(value - lower, upper - value) / span, 0.0))
        return smallest

    # --- name mapping -------------------------------------------------------------------------
    def from_named(self, names: Iterable[str], values: Iterable[float]) -> np.ndarray:
        """Arm-ordered vector from a (names, values) pair in any order; extra names are ignored."""
        names = list(names)
        values = list(values)
        if len(names) != len(values):
            raise ValueError(f"{len(names)} joint names but {len(values)} values")
        lookup = dict(zip(names, values))
        missing = [n for n in self.joint_names if n not in lookup]
        if missing:
            raise MissingJointsError(f"missing arm joints: {', '.join(missing)}")
        return np.array([lookup[n] for n in self.joint_names], dtype=float)

    def to_named(self, q: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """Values of ``q`` (arm order) in the order of ``names``; every name must be an arm joint."""
        unknown = [n for n in names if n not in self._index]
        if unknown:
            raise ValueError(f"not arm joints: {', '.join(unknown)}; arm joints are {', '.join(self.joint_names)}")
        q = np.asarray(q, dtype=float)
        return np.array([q[self._index[n]] for n in names], dtype=float)
