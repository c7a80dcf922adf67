"""The HeiSD boundary metric: is the arm in free motion (retrieve) or near a task boundary (decode)?

Over the last 5 end-effector (TCP) positions:

- R, the radius of the least-squares circle through them, fitted in their best-fit plane (SVD;
  :func:`~vla_accel_ros.decoding.thresholds.fit_circle_radius`): a long straight stretch has a
  large (or infinite) radius, a bend towards an object a small one;
- D = sum_i ||p_last - p_i||: how far the arm travelled lately; it slows down near a grasp;
- each is min-max normalised to [0, 1] over a range (R_lo, R_hi), (D_lo, D_hi) and clipped, and
  m = 0.5 R^ + 0.5 D^.

A large m (fast, straight motion) is the stretch where stored demonstration trajectories are good
drafts; m > threshold selects the retrieval mode. Too little history or a non-finite position
gives NaN, which the decoder treats as "run the model".

Two presets of ranges and threshold:

- ``published``: the peer's figures, R in (1e-6, 0.0146) m, D in (9e-6, 0.120) m, threshold 0.1432
  (the 25th percentile of m in its data). On our arm's motion R exceeds 0.0146 m almost everywhere,
  so about 96% of our demonstration windows land in the retrieval mode under it.
- ``calibrated``: the same recipe on our demonstrations (:func:`calibrate_boundary`, run by
  ``vla-accel build-store``): ranges = min / max over all demo windows, threshold = the 25th
  percentile of m. Windows with an infinite radius (perfectly straight motion) are left out of the
  R range; they normalise to 1 anyway.

A stationary arm (spread below ``MIN_PATH_SPREAD``) has no direction of travel; the circle fit
calls that "too short to say" (inf). Here it counts as radius 0 instead: an arm that stopped is at
a boundary (typically closing the gripper), so it must not look like straight free motion.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vla_accel_ros.decoding.thresholds import (
    MIN_PATH_SPREAD,
    N_CURVATURE_POINTS,
    fit_circle_radius,
)

N_BOUNDARY_POINTS = N_CURVATURE_POINTS  # 5 TCP positions
CALIBRATION_PERCENTILE = 25.0


@dataclass(frozen=True)
class BoundaryConfig:
    """Normalisation ranges (m) of R and D and the retrieval threshold on m."""

    r_lo: float
    r_hi: float
    d_lo: float
    d_hi: float
    threshold: float

    def __post_init__(self) -> None:
        values = asdict(self)
        bad = [k for k, v in values.items() if not (isinstance(v, (int, float)) and math.isfinite(v))]
        if bad:
            raise ValueError(f"BoundaryConfig: {', '.join(bad)} must be finite numbers, got {values}")
        if not 0 <= self.r_lo < self.r_hi:
            raise ValueError(f"BoundaryConfig needs 0 <= r_lo < r_hi, got r_lo={self.r_lo}, r_hi={self.r_hi}")
        if not 0 <= self.d_lo < self.d_hi:
            raise ValueError(f"BoundaryConfig needs 0 <= d_lo < d_hi, got d_lo={self.d_lo}, d_hi={self.d_hi}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"BoundaryConfig.threshold must be in [0, 1] (m is), got {self.threshold}")

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoundaryConfig:
        missing = [k for k in ("r_lo", "r_hi", "d_lo", "d_hi", "threshold") if k not in data]
        if missing:
            raise ValueError(f"boundary calibration is missing {missing}")
        return cls(*(float(data[k]) for k in ("r_lo", "r_hi", "d_lo", "d_hi", "threshold")))


PUBLISHED_BOUNDARY = BoundaryConfig(r_lo=1e-6, r_hi=0.0146, d_lo=9e-6, d_hi=0.120, threshold=0.1432)


def boundary_radius(points: np.ndarray) -> float:
    """R (m) of the window: the circle fit's radius (inf on a straight path), 0 for a stationary
    arm, NaN for a window that is not N_BOUNDARY_POINTS finite 3-D points."""
    pts = np.asarray(points, dtype=float)
    if pts.shape != (N_BOUNDARY_POINTS, 3) or not np.all(np.isfinite(pts)):
        return math.nan
    spread = float(np.linalg.norm(pts - pts.mean(axis=0), axis=1).max())
    if spread < MIN_PATH_SPREAD:
        return 0.0
    return fit_circle_radius(pts)


def boundary_distance(points: np.ndarray) -> float:
    """D (m) = sum over the window of ||p_last - p_i||; NaN for a bad window."""
    pts = np.asarray(points, dtype=float)
    if pts.shape != (N_BOUNDARY_POINTS, 3) or not np.all(np.isfinite(pts)):
        return math.nan
    return float(np.linalg.norm(pts[-1] - pts[:-1], axis=1).sum())


def _normalise(x: float, lo: float, hi: float) -> float:
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    return float(np.clip((x - lo) / (hi - lo), 0.0, 1.0))


def metric_from_features(radius: float, distance: float, config: BoundaryConfig) -> float:
    """m = 0.5 R^ + 0.5 D^ in [0, 1]; NaN when either input is NaN."""
    r_hat = _normalise(radius, config.r_lo, config.r_hi)
    d_hat = _normalise(distance, config.d_lo, config.d_hi)
    return 0.5 * r_hat + 0.5 * d_hat


def boundary_metric(tcp_positions: np.ndarray, config: BoundaryConfig) -> float:
    """m over the LAST N_BOUNDARY_POINTS positions of ``tcp_positions`` (H, 3), oldest first;
    NaN with fewer positions (too little history) or a non-finite one."""
    pts = np.asarray(tcp_positions, dtype=float)
    if pts.ndim != 2 or pts.shape[1] != 3 or len(pts) < N_BOUNDARY_POINTS:
        return math.nan
    window = pts[-N_BOUNDARY_POINTS:]
    return metric_from_features(boundary_radius(window), boundary_distance(window), config)


def window_features(tcp_positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, D) of every full window of one trajectory (T, 3): arrays of length max(T - 4, 0)."""
    pts = np.asarray(tcp_positions, dtype=float)
    n = max(len(pts) - N_BOUNDARY_POINTS + 1, 0)
    windows = [pts[t : t + N_BOUNDARY_POINTS] for t in range(n)]
    return (
        np.array([boundary_radius(w) for w in windows], dtype=float),
        np.array([boundary_distance(w) for w in windows], dtype=float),
    )


def calibrate_boundary(
    radii: np.ndarray, distances: np.ndarray, percentile: float = CALIBRATION_PERCENTILE
) -> tuple[BoundaryConfig, dict[str, Any]]:
    """Ranges (min / max over the windows) and threshold (the ``percentile``-th percentile of m)
    from demonstration windows; also returns the figures behind them for the store's JSON.

    Windows with a NaN feature are dropped; infinite radii (straight motion) are left out of the R
    range only. Raises ValueError when too few windows remain to define the ranges.
    """
    radii = np.asarray(radii, dtype=float).reshape(-1)
    distances = np.asarray(distances, dtype=float).reshape(-1)
    if radii.shape != distances.shape:
        raise ValueError(f"radii {radii.shape} and distances {distances.shape} differ in length")
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {percentile}")
    ok = ~np.isnan(radii) & ~np.isnan(distances)
    radii, distances = radii[ok], distances[ok]
    finite_r = radii[np.isfinite(radii)]
    if (len(finite_r) < 2 or len(distances) < 2 or finite_r.min() >= finite_r.max()
            or distances.min() >= distances.max()):
        raise ValueError(f"too few distinct boundary windows to calibrate ({len(distances)} usable)")
    provisional = BoundaryConfig(float(finite_r.min()), float(finite_r.max()), float(distances.min()),
                                 float(distances.max()), 0.0)
    m = np.array([metric_from_features(r, d, provisional) for r, d in zip(radii, distances)])
    config = BoundaryConfig(provisional.r_lo, provisional.r_hi, provisional.d_lo, provisional.d_hi,
                            float(np.percentile(m, percentile)))
    info = {
        "method": f"ranges = min/max over demo windows (R: finite radii only); "
                  f"threshold = {percentile:g}th percentile of m",
        "windows": len(m),
        "infinite_radius_share": float(1.0 - len(finite_r) / len(radii)),
        "r_percentiles_1_50_99": [float(v) for v in np.percentile(finite_r, [1, 50, 99])],
        "d_percentiles_1_50_99": [float(v) for v in np.percentile(distances, [1, 50, 99])],
        "m_percentiles_5_25_50_75": [float(v) for v in np.percentile(m, [5, 25, 50, 75])],
        "retrieval_share": float(np.mean(m > config.threshold)),
        "published_retrieval_share": float(
            np.mean([metric_from_features(r, d, PUBLISHED_BOUNDARY) > PUBLISHED_BOUNDARY.threshold
                     for r, d in zip(radii, distances)])
        ),
    }
    return config, info


def tcp_history(kin: Any, joint_positions: np.ndarray, n: int = N_BOUNDARY_POINTS) -> np.ndarray:
    """TCP positions (<= n, 3) by forward kinematics of the last ``n`` joint samples (H, dof);
    rows that are not finite or do not match ``kin.n`` are dropped (the caller then sees too little
    history)."""
    q = np.asarray(joint_positions, dtype=float)
    if q.ndim != 2 or len(q) == 0 or q.shape[1] != kin.n:
        return np.zeros((0, 3))
    recent = q[-n:]
    if not np.all(np.isfinite(recent)):
        return np.zeros((0, 3))
    return np.array([kin.fk(row).position for row in recent], dtype=float).reshape(-1, 3)
