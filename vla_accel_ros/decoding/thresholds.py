"""Acceptance thresholds r (in token bins) for relaxed speculative decoding.

The kinematic threshold is built from *looseness* factors in [0, 1]: 1 means "this signal says the
motion is smooth and predictable, a loose r is safe", 0 means "tight". Each factor is a linear ramp
between two named constants and is monotone in its input; the threshold uses the smallest factor
(the most worried signal decides) and maps it linearly onto [r_min, r_max].

Signals and why they matter:
- KF innovation: the filter's measurements disagree with its constant-acceleration model, so the
  motion is changing and neither the draft nor the KF completion should be trusted loosely.
- End-effector acceleration: fast changes of the commanded delta; a bin of error matters more.
- Path curvature: a small radius of the circle through the last 5 end-effector positions means the
  arm is turning (approach, re-orientation), where per-dimension token errors bend the path.
- Joint-limit margin: near a limit the IK is ill-conditioned and clamps bite; be exact.
- Contact (world-aware only): near the object a bin of error decides a grasp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# KF normalised innovation magnitude (about 1 when the model fits).
INNOVATION_LOOSE = 1.5
INNOVATION_TIGHT = 5.0
# End-effector linear acceleration, m/s^2.
EE_ACCEL_LOOSE = 0.5
EE_ACCEL_TIGHT = 3.0
# Radius of the least-squares circle through the recent end-effector path, m.
RADIUS_TIGHT = 0.02
RADIUS_LOOSE = 0.15
# Smallest joint-limit margin, as a fraction of the joint range (kin.limit_margin).
LIMIT_MARGIN_TIGHT = 0.02
LIMIT_MARGIN_LOOSE = 0.10
# Gripper-to-target clearance, m (2 cm is the near-contact distance of the NCF metric).
CLEARANCE_TIGHT = 0.02
CLEARANCE_LOOSE = 0.10
# Learned near-contact probability.
CONTACT_PROB_LOOSE = 0.2
CONTACT_PROB_TIGHT = 0.8
# Below this spread (m) the recent path is too short for a meaningful circle fit.
MIN_PATH_SPREAD = 1e-4
# Relative second singular value below which the recent path counts as a straight line.
COLLINEAR_RATIO = 1e-3

# World-aware scaling of the kinematic r: near contact it shrinks to NEAR_CONTACT_SCALE * r,
# in free space it grows to FREE_SPACE_SCALE * r; the result is bounded to [R_FLOOR, the ceiling
# FREE_SPACE_SCALE * r_max] (18 at the default r_max 15), so it follows the decoder's r bounds.
NEAR_CONTACT_SCALE = 0.4
FREE_SPACE_SCALE = 1.25
R_FLOOR = 2

N_CURVATURE_POINTS = 5


def _unit(value: float) -> float:
    """``value`` clipped to [0, 1] (plain floats: NumPy's scalar clip costs ten times more)."""
    return min(max(value, 0.0), 1.0)


def _ramp_down(x: float, loose_below: float, tight_above: float) -> float:
    """1 for x <= loose_below, 0 for x >= tight_above, linear in between (monotone non-increasing)."""
    if not math.isfinite(x):
        return 0.0 if x > 0 or math.isnan(x) else 1.0
    return _unit((tight_above - float(x)) / (tight_above - loose_below))


def _ramp_up(x: float, tight_below: float, loose_above: float) -> float:
    """0 for x <= tight_below, 1 for x >= loose_above, linear in between (monotone non-decreasing)."""
    if math.isnan(x):
        return 0.0
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    return _unit((float(x) - tight_below) / (loose_above - tight_below))


def innovation_looseness(innovation: float) -> float:
    """Non-increasing in the KF's normalised innovation magnitude."""
    return _ramp_down(innovation, INNOVATION_LOOSE, INNOVATION_TIGHT)


def acceleration_looseness(ee_acceleration: float) -> float:
    """Non-increasing in the end-effector acceleration (m/s^2)."""
    return _ramp_down(ee_acceleration, EE_ACCEL_LOOSE, EE_ACCEL_TIGHT)


def curvature_looseness(radius: float) -> float:
    """Non-decreasing in the path's curvature radius (m): a sharp bend (small radius) is tight,
    a straight path (radius inf) loose."""
    return _ramp_up(radius, RADIUS_TIGHT, RADIUS_LOOSE)


def limit_looseness(min_limit_margin: float) -> float:
    """Non-decreasing in the smallest joint-limit margin (0 at a limit, 0.5 mid-range)."""
    return _ramp_up(min_limit_margin, LIMIT_MARGIN_TIGHT, LIMIT_MARGIN_LOOSE)


def clearance_looseness(clearance: float) -> float:
    """Non-decreasing in the gripper-to-target clearance (m)."""
    return _ramp_up(clearance, CLEARANCE_TIGHT, CLEARANCE_LOOSE)


def contact_probability_looseness(probability: float) -> float:
    """Non-increasing in the learned near-contact probability."""
    return _ramp_down(probability, CONTACT_PROB_LOOSE, CONTACT_PROB_TIGHT)


def fit_circle_radius(points: np.ndarray) -> float:
    """Radius (m) of the least-squares circle through 3-D points, fitted in their best-fit plane.

    The plane is spanned by the two major principal axes of the centred points (their scatter
    matrix's eigenvectors); the circle is the algebraic least-squares fit
    ``x^2 + y^2 + a x + b y + c = 0`` in plane coordinates. Returns inf for a straight path, for a
    path too short to say (spread below MIN_PATH_SPREAD) and for fewer than 3 points.

    It runs once per control step on 5 points, cold (after the prefill and the simulator): plain
    floats cost a tenth of NumPy's eigh and solve there, for the same fit.
    """
    pts = np.asarray(points, dtype=float)
    if pts.ndim != 2 or pts.shape[1] != 3 or len(pts) < 3:
        return math.inf
    rows = pts.tolist()
    if not all(math.isfinite(v) for row in rows for v in row):
        return math.inf
    k = len(rows)
    mx, my, mz = sum(row[0] for row in rows) / k, sum(row[1] for row in rows) / k, sum(row[2] for row in rows) / k
    centred = [(x - mx, y - my, z - mz) for x, y, z in rows]
    sxx = syy = szz = sxy = sxz = syz = 0.0
    for x, y, z in centred:
        sxx += x * x
        syy += y * y
        szz += z * z
        sxy += x * y
        sxz += x * z
        syz += y * z
    smallest, middle, largest = _symmetric_eigenvalues(sxx, syy, szz, sxy, sxz, syz)
    spread, width = math.sqrt(max(largest, 0.0)), math.sqrt(max(middle, 0.0))
    if spread < MIN_PATH_SPREAD or width < COLLINEAR_RATIO * spread:
        return math.inf
    normal = _null_vector(
        ((sxx - smallest, sxy, sxz), (sxy, syy - smallest, syz), (sxz, syz, szz - smallest)), largest)
    if normal is None:  # the two smallest eigenvalues coincide: let NumPy pick the plane
        return _fit_circle_radius_numpy(pts)
    u, w = _plane_basis(normal)
    # The points are centred, so in plane coordinates the normal equations split into a 2x2 system
    # for (a, b) and c = -mean(x^2 + y^2).
    pxx = pyy = pxy = bx = by = total = 0.0
    for x3, y3, z3 in centred:
        x, y = x3 * u[0] + y3 * u[1] + z3 * u[2], x3 * w[0] + y3 * w[1] + z3 * w[2]
        square = x * x + y * y
        pxx += x * x
        pyy += y * y
        pxy += x * y
        bx -= square * x
        by -= square * y
        total += square
    det = pxx * pyy - pxy * pxy
    if not det > 0.0:  # points in line after all (within rounding): no circle
        return math.inf
    ca, cb = (bx * pyy - by * pxy) / det, (pxx * by - pxy * bx) / det
    r2 = (ca * ca + cb * cb) / 4.0 + total / k
    return float(math.sqrt(r2)) if r2 > 0 else math.inf


def _symmetric_eigenvalues(
    a11: float, a22: float, a33: float, a12: float, a13: float, a23: float
) -> tuple[float, float, float]:
    """Eigenvalues (ascending) of a symmetric 3x3 matrix, in closed form (the trigonometric
    solution of its characteristic cubic)."""
    off = a12 * a12 + a13 * a13 + a23 * a23
    q = (a11 + a22 + a33) / 3.0
    p2 = (a11 - q) ** 2 + (a22 - q) ** 2 + (a33 - q) ** 2 + 2.0 * off
    if p2 <= 0.0:  # a multiple of the identity
        return q, q, q
    p = math.sqrt(p2 / 6.0)
    b11, b22, b33 = (a11 - q) / p, (a22 - q) / p, (a33 - q) / p
    b12, b13, b23 = a12 / p, a13 / p, a23 / p
    half_det = (b11 * (b22 * b33 - b23 * b23) - b12 * (b12 * b33 - b23 * b13) + b13 * (b12 * b23 - b22 * b13)) / 2.0
    phi = math.acos(min(max(half_det, -1.0), 1.0)) / 3.0
    largest = q + 2.0 * p * math.cos(phi)
    smallest = q + 2.0 * p * math.cos(phi + 2.0 * math.pi / 3.0)
    return smallest, 3.0 * q - largest - smallest, largest


def _null_vector(rows: tuple[tuple[float, float, float], ...], scale: float) -> tuple[float, float, float] | None:
    """The unit vector a rank-2 symmetric 3x3 matrix (rows) sends to 0: the largest cross product
    of two of its rows. None when every cross product vanishes against ``scale``^2 (rank 1)."""
    best, best_norm = (0.0, 0.0, 0.0), 0.0
    for (a1, a2, a3), (b1, b2, b3) in ((rows[0], rows[1]), (rows[0], rows[2]), (rows[1], rows[2])):
        cross = (a2 * b3 - a3 * b2, a3 * b1 - a1 * b3, a1 * b2 - a2 * b1)
        norm = math.sqrt(cross[0] ** 2 + cross[1] ** 2 + cross[2] ** 2)
        if norm > best_norm:
            best, best_norm = cross, norm
    if not best_norm > 1e-12 * scale * scale:
        return None
    return best[0] / best_norm, best[1] / best_norm, best[2] / best_norm


def _plane_basis(normal: tuple[float, float, float]) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Two orthonormal vectors perpendicular to the unit vector ``normal`` (the circle fit is the
    same in any such basis)."""
    n1, n2, n3 = normal
    # cross with the coordinate axis least aligned with the normal
    if abs(n1) <= abs(n2) and abs(n1) <= abs(n3):
        u = (0.0, n3, -n2)
    elif abs(n2) <= abs(n3):
        u = (-n3, 0.0, n1)
    else:
        u = (n2, -n1, 0.0)
    norm = math.sqrt(u[0] ** 2 + u[1] ** 2 + u[2] ** 2)
    u = (u[0] / norm, u[1] / norm, u[2] / norm)
    w = (n2 * u[2] - n3 * u[1], n3 * u[0] - n1 * u[2], n1 * u[1] - n2 * u[0])
    return u, w


def _fit_circle_radius_numpy(pts: np.ndarray) -> float:
    """:func:`fit_circle_radius` with NumPy's eigh and solve: the reference, and the fallback when
    the plane is not unique."""
    centred = pts - pts.mean(axis=0)
    variances, axes = np.linalg.eigh(centred.T @ centred)  # ascending
    spread, width = math.sqrt(max(variances[2], 0.0)), math.sqrt(max(variances[1], 0.0))
    if spread < MIN_PATH_SPREAD or width < COLLINEAR_RATIO * spread:
        return math.inf
    xy = centred @ axes[:, 1:]
    a = np.ones((len(xy), 3))
    a[:, :2] = xy
    try:
        ca, cb, cc = np.linalg.solve(a.T @ a, a.T @ -(xy * xy).sum(axis=1))
    except np.linalg.LinAlgError:  # points in line after all (within rounding): no circle
        return math.inf
    r2 = (ca * ca + cb * cb) / 4.0 - cc
    return float(math.sqrt(r2)) if r2 > 0 else math.inf


@dataclass(frozen=True)
class KinematicSignals:
    """What the kinematic threshold looks at; defaults describe smooth free motion."""

    innovation: float = 0.0
    ee_acceleration: float = 0.0
    path_radius: float = math.inf
    min_limit_margin: float = 0.5

    def looseness(self) -> float:
        """The smallest factor: the most worried signal decides."""
        return min(innovation_looseness(self.innovation), acceleration_looseness(self.ee_acceleration),
                   curvature_looseness(self.path_radius), limit_looseness(self.min_limit_margin))


def _check_bounds(r_min: int, r_max: int) -> None:
    if not (0 <= r_min <= r_max):
        raise ValueError(f"threshold bounds need 0 <= r_min <= r_max, got r_min={r_min}, r_max={r_max}")


def kinematic_threshold(signals: KinematicSignals, r_min: int = 5, r_max: int = 15) -> int:
    """r in [r_min, r_max]: r_max in smooth free motion, r_min when any signal is at its tight end."""
    _check_bounds(r_min, r_max)
    return int(round(r_min + (r_max - r_min) * signals.looseness()))


def world_aware_ceiling(r_max: int) -> int:
    """The largest world-aware r for kinematic bounds up to ``r_max``: free space loosens r_max
    itself by FREE_SPACE_SCALE, and no further."""
    return max(R_FLOOR, int(FREE_SPACE_SCALE * r_max))


def world_aware_threshold(r_kinematic: int, contact_looseness: float, r_max: int = 15) -> int:
    """Scale the kinematic r (from bounds up to ``r_max``) by the contact looseness (0 = at
    contact, 1 = free space): from NEAR_CONTACT_SCALE * r to FREE_SPACE_SCALE * r, bounded to
    [R_FLOOR, world_aware_ceiling(r_max)]."""
    c = _unit(float(contact_looseness)) if math.isfinite(contact_looseness) else 0.0
    scale = NEAR_CONTACT_SCALE + (FREE_SPACE_SCALE - NEAR_CONTACT_SCALE) * c
    return min(max(round(r_kinematic * scale), R_FLOOR), world_aware_ceiling(r_max))


def released_schedule_threshold(step: int, max_steps: int, r_start: int = 15, r_min: int = 3) -> float:
    """Time-step decay of the released KERV code: r_min + (r_start - r_min) exp(-(t/tau)^3),
    tau = T / (-ln 1e-30)^(1/3), T = the episode step limit. Returned unrounded, as that code
    compares token distances with it (so r behaves as its floor)."""
    if max_steps <= 0:
        raise ValueError(f"max_steps must be > 0, got {max_steps}")
    _check_bounds(r_min, r_start)
    tau = max_steps / (-math.log(1e-30)) ** (1.0 / 3.0)
    return float(r_min + (r_start - r_min) * math.exp(-((max(step, 0) / tau) ** 3)))
