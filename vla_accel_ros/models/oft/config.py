"""What an OpenVLA-OFT checkpoint does not store, and how its actions and state are scaled.

OFT's own code picks the chunk size, the action and state sizes and the bounds style from the
command line (LIBERO 8 x 7 with q01/q99 bounds, ALOHA 25 x 14 with min/max, Bridge 5 x 7): no
file of the checkpoint holds them. Here they come from ``vla_spec.json`` (or the loader's
parameters, which win), and are checked against the weights: the action dimension is the head's
output, the state dimension the proprio projector's input. Where neither gives the chunk size (a
directory as published), it is the platform's that the statistics' dataset names, as OFT's
``prismatic/vla/constants.py`` picks it (the first of "libero", "aloha", "bridge" in the name,
ignoring case; the bounds style too unless given), and a warning says so; a dataset that names
none of them is refused.

- ``chunk_size``: actions per chunk (H);
- ``action_dim``: values per action (D; optional, the head's);
- ``bounds``: ``q01_q99`` (the statistics' 1st/99th percentiles, LIBERO and Bridge) or
  ``min_max`` (ALOHA);
- ``n_images``: the images the model takes, each 256 patches (optional: any number).

Scaling, as OFT's ``predict_action`` and ``normalize_proprio`` do it: an action value n in [-1, 1]
becomes ``0.5 (n + 1) (high - low + 1e-8) + low`` where the statistics' mask is set (n as it is
elsewhere, unclipped); a state value p becomes ``clip(2 (p - low) / (high - low + 1e-8) - 1, -1, 1)``.
Torch-free.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.models.token_vla.spec import STATISTICS_FILE
from vla_accel_ros.models.token_vla.statistics import dataset_statistics

BOUNDS_STYLES = {"q01_q99": ("q01", "q99"), "min_max": ("min", "max")}
DEFAULT_BOUNDS = "q01_q99"  # OFT's default platform (LIBERO)
RANGE_EPSILON = 1e-8  # OFT adds it to every range (OpenVLA's predict_action does not)
# what OFT's constants give per platform, for messages
PLATFORMS = "LIBERO 8 x 7 q01_q99, ALOHA 25 x 14 min_max, Bridge 5 x 7 q01_q99"
# OFT's prismatic/vla/constants.py: (the name it looks for, in this order; chunk size; bounds style)
PLATFORM_CHUNKS = (("libero", 8, "q01_q99"), ("aloha", 25, "min_max"), ("bridge", 5, "q01_q99"))
log = logging.getLogger(__name__)


def platform_chunk(dataset: str) -> tuple[str, int, str] | None:
    """(platform, chunk size, bounds style) of the first platform ``dataset`` names, as OFT's
    constants pick them; None when it names none."""
    lowered = dataset.lower()
    for platform, size, style in PLATFORM_CHUNKS:
        if platform in lowered:
            return platform, size, style
    return None


@dataclass(frozen=True)
class ChunkSpec:
    """The chunk an OFT model predicts: ``chunk_size`` actions of ``action_dim`` values, scaled by
    the statistics' ``bounds``; ``n_images`` the images it takes (None: any number)."""

    chunk_size: int
    action_dim: int
    bounds: str = DEFAULT_BOUNDS
    n_images: int | None = None

    @property
    def n_action_positions(self) -> int:
        """The empty action embeddings in the sequence: one per value of the chunk."""
        return self.chunk_size * self.action_dim


def chunk_spec(stored: dict[str, Any], source: Path, *, head_action_dim: int, chunk_size: int | None = None,
               action_dim: int | None = None, bounds: str | None = None,
               n_images: int | None = None, dataset: str = "") -> ChunkSpec:
    """The chunk of an OFT model: the parameters given, else ``stored`` (``vla_spec.json``, at
    ``source``), else the platform of ``dataset`` (the statistics' dataset; module docstring),
    checked against the head's action dimension; ValueError in one line naming the key at fault or
    the contradiction."""
    values = {"chunk_size": chunk_size, "action_dim": action_dim, "bounds": bounds, "n_images": n_images}
    for key, given in values.items():
        if given is None and key in stored:
            values[key] = stored[key]
    size = values["chunk_size"]
    platform = platform_chunk(dataset) if size is None else None
    if platform is not None:
        name, size, style = platform
        values["chunk_size"] = size
        values["bounds"] = style if values["bounds"] is None else values["bounds"]
        log.warning("%s: no chunk size stored; a chunk of %d actions (bounds %s), as OFT's constants give it for "
                    "dataset '%s' (%s); chunk_size in vla_spec.json or --chunk-size overrides it",
                    source.parent, size, values["bounds"], dataset, name.upper())
    if size is None:
        raise ValueError(f"{source}: an OFT checkpoint does not store its chunk size; give chunk_size in "
                         f"vla_spec.json, or --chunk-size to vla-accel predict ({PLATFORMS})")
    for key in ("chunk_size", "action_dim", "n_images"):
        value = values[key]
        if value is not None and not (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
                                      and value >= 1):
            raise ValueError(f"{source}: {key} must be a positive integer, got {value!r}")
    dim = head_action_dim if values["action_dim"] is None else int(values["action_dim"])
    if dim != head_action_dim:
        raise ValueError(f"{source}: action_dim {dim} contradicts the action head, whose fc2 gives "
                         f"{head_action_dim} values per action")
    style = DEFAULT_BOUNDS if values["bounds"] is None else values["bounds"]
    if style not in BOUNDS_STYLES:
        raise ValueError(f"{source}: bounds must be one of {sorted(BOUNDS_STYLES)}, got {style!r}")
    images = values["n_images"]
    return ChunkSpec(int(size), dim, str(style), None if images is None else int(images))


@dataclass(frozen=True)
class ChunkStatistics:
    """One dataset's bounds: the action's low/high/mask (D,), where they came from, and the
    state's low/high/mask (P,) when the model reads a state."""

    key: str
    low: np.ndarray
    high: np.ndarray
    mask: np.ndarray
    source: Path
    state_low: np.ndarray | None = None
    state_high: np.ndarray | None = None
    state_mask: np.ndarray | None = None

    def unnormalise(self, normalised: np.ndarray) -> np.ndarray:
        """(..., D) head outputs -> the actions OFT's ``predict_action`` returns (module docstring)."""
        n = np.asarray(normalised, dtype=np.float64)
        return np.where(self.mask, 0.5 * (n + 1.0) * (self.high - self.low + RANGE_EPSILON) + self.low, n)

    def normalise_state(self, state: np.ndarray) -> np.ndarray:
        """(P,) raw state -> the projector's input, as OFT's ``normalize_proprio``; ValueError when
        it is not finite or not of the statistics' size."""
        if self.state_low is None or self.state_high is None or self.state_mask is None:
            raise ValueError(f"{self.source}: dataset '{self.key}' has no proprio statistics")
        values = np.asarray(state, dtype=np.float64).reshape(-1)
        if values.shape != self.state_low.shape:
            raise ValueError(f"the model reads a state of {self.state_low.size} values, got {values.size}")
        if not np.all(np.isfinite(values)):
            raise ValueError("the state holds NaN or inf")
        scaled = 2.0 * (values - self.state_low) / (self.state_high - self.state_low + RANGE_EPSILON) - 1.0
        return np.clip(np.where(self.state_mask, scaled, values), -1.0, 1.0)


def load_chunk_statistics(directory: Path, unnorm_key: str | None, bounds: str, action_dim: int,
                          state_dim: int | None, config: dict[str, Any] | None = None) -> ChunkStatistics:
    """The statistics of ``unnorm_key`` (None: the only dataset) from ``dataset_statistics.json``
    (else ``norm_stats`` in ``config.json``; ``config``: that file as parsed, None: read when needed):
    the action's bounds of size ``action_dim`` and, with ``state_dim``, the state's; ValueError
    naming the file and key otherwise."""
    path, unnorm_key, dataset = dataset_statistics(directory, STATISTICS_FILE, unnorm_key, config)
    if not isinstance(dataset, dict):
        raise ValueError(f"{path}: dataset '{unnorm_key}' is not a JSON object")
    low, high, mask = _bounds(dataset.get("action"), path, f"{unnorm_key}.action", bounds, action_dim)
    state: tuple[np.ndarray | None, ...] = (None, None, None)
    if state_dim is not None:
        state = _bounds(dataset.get("proprio"), path, f"{unnorm_key}.proprio", bounds, state_dim)
    return ChunkStatistics(unnorm_key, low, high, mask, path, *state)


def _bounds(entry: Any, path: Path, where: str, bounds: str, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    low_key, high_key = BOUNDS_STYLES[bounds]
    if not isinstance(entry, dict) or low_key not in entry or high_key not in entry:
        raise ValueError(f"{path}: {where} has no {low_key}/{high_key} (bounds {bounds})")
    try:
        low = np.asarray(entry[low_key], dtype=np.float64)
        high = np.asarray(entry[high_key], dtype=np.float64)
        mask = np.asarray(entry.get("mask", [True] * size), dtype=bool)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {where} is malformed ({error})") from None
    for name, value in ((low_key, low), (high_key, high), ("mask", mask)):
        if value.shape != (size,):
            raise ValueError(f"{path}: {where}.{name} has shape {value.shape}; the model's is ({size},)")
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ValueError(f"{path}: {where} {low_key}/{high_key} are not finite")
    return low, high, mask
