"""A token VLA's action statistics and the action tokenizer made of them.

- ``dataset_statistics.json`` beside the weights, ``{key: {"action": {"q01", "q99", "mask"}, ...}}``
  (or ``norm_stats`` in ``config.json``), one key picked by ``unnorm_key``
  (:func:`load_action_statistics`);
- :class:`OpenVLAActionTokenizer` decodes a token as OpenVLA's ``predict_action`` does: masked-out
  dimensions (mask false, usually the gripper) are returned normalised, not unnormalised, then the
  gripper goes through the spec's convention into ours.

Torch-free: nothing here needs more than numpy.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.errors import SettingError
from vla_accel_ros.models.files import CONFIG_FILE, read_json_object
from vla_accel_ros.models.token_vla.spec import (
    GRIPPER_CONVENTIONS,
    GRIPPER_INDEX,
    PROPRIO_FIELD,
    VLASpec,
    parsed_config,
)
from vla_accel_ros.models.tokenizer import ACTION_DIM, BIN_EDGES, N_BINS, N_CENTRES, ActionTokenizer, digitise


# --- action statistics ------------------------------------------------------------------------
@dataclass(frozen=True)
class ActionStatistics:
    """The action statistics of one dataset: q01/q99/mask (7,), where they came from, and the
    proprioception's q01/q99 (n,) when the file has them (None otherwise)."""

    key: str
    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray
    source: Path
    proprio_q01: np.ndarray | None = None
    proprio_q99: np.ndarray | None = None

    def proprio_bins(self, proprio: np.ndarray) -> np.ndarray:
        """Our bins (n,) int64 of one proprioception vector (joints then gripper): normalised to
        [-1, 1] by these proprio q01/q99, clipped, and digitised as the actions are (what a prompt's
        ``{proprio}`` field holds). ValueError when there are none, or the vector is not finite or
        of their size."""
        if self.proprio_q01 is None or self.proprio_q99 is None:
            raise ValueError(f"{self.source}: dataset '{self.key}' has no proprio q01/q99, which the "
                             f"prompt's '{PROPRIO_FIELD}' field needs")
        values = np.asarray(proprio, dtype=np.float64).reshape(-1)
        low, high = self.proprio_q01, self.proprio_q99
        if values.shape != low.shape:
            raise ValueError(f"the policy reads {low.size} proprioception values (joints then gripper), "
                             f"got {values.size}")
        if not np.all(np.isfinite(values)):
            raise ValueError("the proprioception (joint positions, gripper) holds NaN or inf")
        span = high - low
        normalised = np.clip(2.0 * (values - low) / np.where(span > 0, span, 1.0) - 1.0, -1.0, 1.0)
        return digitise(np.where(span > 0, normalised, 0.0))


def dataset_statistics(directory: Path, file: str, unnorm_key: str | None,
                       config: dict[str, Any] | None = None) -> tuple[Path, str, Any]:
    """Where the statistics were read (``file`` in ``directory``, else ``config.json`` for its
    ``norm_stats``; ``config``: that file as parsed, None: read when needed), the dataset
    ``unnorm_key`` picks (None: the only one) and its entry; ValueError naming the file when there
    are none, or the key is missing or ambiguous."""
    path = directory / file
    norm_stats = None if path.is_file() else (parsed_config(directory, config) or {}).get("norm_stats")
    if path.is_file():
        table = read_json_object(path)
    elif isinstance(norm_stats, dict):
        path = directory / CONFIG_FILE
        table = norm_stats
    else:
        raise ValueError(f"{path}: no action statistics (and no norm_stats in {CONFIG_FILE}); the "
                         "policy's actions cannot be unnormalised without them")
    keys = sorted(table)
    if unnorm_key is None:
        if len(keys) != 1:
            raise SettingError(f"{path}: holds the statistics of {len(keys)} datasets {keys}; "
                               "pick one with unnorm_key", "unnorm_key")
        unnorm_key = keys[0]
    elif unnorm_key not in table:
        raise SettingError(f"{path}: no dataset '{unnorm_key}' (unnorm_key); it holds {keys}", "unnorm_key")
    return path, unnorm_key, table[unnorm_key]


def load_action_statistics(directory: Path | str, spec: VLASpec,
                           config: dict[str, Any] | None = None) -> ActionStatistics:
    """The action statistics of ``spec.unnorm_key`` from ``spec.statistics_file`` in ``directory``
    (or, without that file, the ``norm_stats`` of ``config.json``, ``config`` when parsed already).
    ValueError naming the file when it is missing, the key is missing or ambiguous, or the action
    is not 7-D."""
    path, key, dataset = dataset_statistics(Path(directory), spec.statistics_file, spec.unnorm_key, config)
    entry = dataset.get("action") if isinstance(dataset, dict) else None
    if not isinstance(entry, dict) or "q01" not in entry or "q99" not in entry:
        raise ValueError(f"{path}: dataset '{key}' has no action q01/q99")
    try:
        q01 = np.asarray(entry["q01"], dtype=np.float64)
        q99 = np.asarray(entry["q99"], dtype=np.float64)
        mask = np.asarray(entry.get("mask", [True] * q01.size), dtype=bool)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: dataset '{key}' has malformed action statistics ({error})") from None
    for name, value in (("q01", q01), ("q99", q99), ("mask", mask)):
        if value.shape != (ACTION_DIM,):
            raise ValueError(f"{path}: dataset '{key}' has action {name} of shape {value.shape}; "
                             f"this policy's actions are {ACTION_DIM}-D")
    proprio = _proprio_quantiles(dataset.get("proprio"), path, key)
    return ActionStatistics(key=key, q01=q01, q99=q99, mask=mask, source=path,
                            proprio_q01=None if proprio is None else proprio[0],
                            proprio_q99=None if proprio is None else proprio[1])


def _proprio_quantiles(entry: Any, path: Path, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The proprio q01/q99 of a dataset's entry (None without them); ValueError when malformed."""
    if not isinstance(entry, dict) or "q01" not in entry or "q99" not in entry:
        return None
    try:
        q01 = np.asarray(entry["q01"], dtype=np.float64)
        q99 = np.asarray(entry["q99"], dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: dataset '{key}' has malformed proprio statistics ({error})") from None
    if q01.ndim != 1 or q01.shape != q99.shape or not q01.size or not np.all(np.isfinite(q01) & np.isfinite(q99)):
        raise ValueError(f"{path}: dataset '{key}' has proprio q01/q99 of shapes {q01.shape} and {q99.shape}; "
                         "they must be finite vectors of one length")
    return q01, q99


# --- the action tokenizer ---------------------------------------------------------------------
# Each gripper convention (GRIPPER_CONVENTIONS) both ways: ours -> the policy's, and back (unclipped).
_TO_POLICY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "0_1_open_high": lambda g: g,
    "0_1_open_low": lambda g: 1.0 - g,
    "minus1_1_open_high": lambda g: 2.0 * g - 1.0,
    "minus1_1_open_low": lambda g: 1.0 - 2.0 * g,
}
_FROM_POLICY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "0_1_open_high": lambda g: g,
    "0_1_open_low": lambda g: 1.0 - g,
    "minus1_1_open_high": lambda g: (g + 1.0) / 2.0,
    "minus1_1_open_low": lambda g: (1.0 - g) / 2.0,
}


def gripper_to_ours(value: np.ndarray, convention: str) -> np.ndarray:
    """A policy's gripper values in ``convention`` (``GRIPPER_CONVENTIONS``) as ours (1 = open),
    clipped to [0, 1]."""
    return np.clip(_FROM_POLICY[convention](np.asarray(value, dtype=np.float64)), 0.0, 1.0)


class OpenVLAActionTokenizer(ActionTokenizer):
    """:class:`ActionTokenizer` with OpenVLA's mask and a gripper convention: a token (our bin,
    0..254; 255 decodes as 254) decodes to OpenVLA's ``predict_action`` value (bin centre,
    unnormalised with q01/q99 where the mask is true, the normalised centre as is where it is
    false), then the gripper dimension goes through ``gripper`` into our [0, 1] (1 = open).
    ``encode`` is the inverse up to the bin. Unlike the parent, q01 == q99 is allowed (an axis
    the data never moves decodes to q01, as in OpenVLA)."""

    def __init__(self, q01: np.ndarray, q99: np.ndarray, mask: np.ndarray | None = None,
                 gripper: str = "0_1_open_high") -> None:
        # No super().__init__: it refuses q99 <= q01, which OpenVLA's statistics may hold.
        q01 = np.asarray(q01, dtype=np.float64).reshape(-1)
        q99 = np.asarray(q99, dtype=np.float64).reshape(-1)
        mask = np.ones(ACTION_DIM, dtype=bool) if mask is None else np.asarray(mask, dtype=bool).reshape(-1)
        if q01.shape != (ACTION_DIM,) or q99.shape != (ACTION_DIM,) or mask.shape != (ACTION_DIM,):
            raise ValueError(f"q01, q99 and mask must have shape ({ACTION_DIM},), "
                             f"got {q01.shape}, {q99.shape} and {mask.shape}")
        if not (np.all(np.isfinite(q01)) and np.all(np.isfinite(q99))):
            raise ValueError("q01 and q99 must be finite")
        if np.any(mask & (q99 < q01)):
            bad = np.nonzero(mask & (q99 < q01))[0].tolist()
            raise ValueError(f"q99 must not be below q01 in an unnormalised dimension; it is in dims {bad}")
        if gripper not in GRIPPER_CONVENTIONS:
            raise ValueError(f"gripper must be one of {list(GRIPPER_CONVENTIONS)}, got {gripper!r}")
        self.q01, self.q99, self.mask, self.gripper = q01, q99, mask, gripper
        self.edges = BIN_EDGES
        self.centres = (self.edges[:-1] + self.edges[1:]) / 2.0
        self._token_values = self.denormalise(np.repeat(self.centres[:, None], ACTION_DIM, axis=1))
        self._dims = np.arange(ACTION_DIM)
        self._q01, self._q99, self._edges = q01.tolist(), q99.tolist(), self.edges.tolist()
        self._mask = mask.tolist()

    @property
    def bin_width(self) -> np.ndarray:
        """Width of one bin in our action units, per dimension."""
        width = np.where(self.mask, (self.q99 - self.q01) / N_CENTRES, 2.0 / N_CENTRES)
        if self.gripper.startswith("minus1_1"):  # our [0, 1] is half the policy's [-1, 1]
            width[GRIPPER_INDEX] /= 2.0
        return width

    def to_policy_gripper(self, ours: np.ndarray) -> np.ndarray:
        """Our gripper values (1 = open, [0, 1]) in the policy's convention."""
        return _TO_POLICY[self.gripper](np.asarray(ours, dtype=np.float64))

    def from_policy_gripper(self, value: np.ndarray) -> np.ndarray:
        """The policy's gripper values in ours (1 = open), clipped to [0, 1]."""
        return gripper_to_ours(value, self.gripper)

    def normalise(self, values: np.ndarray) -> np.ndarray:
        """Our actions (..., 7) -> the policy's normalised values in [-1, 1]."""
        values = np.array(values, dtype=np.float64)
        values[..., GRIPPER_INDEX] = self.to_policy_gripper(values[..., GRIPPER_INDEX])
        span = self.q99 - self.q01
        scaled = 2.0 * (values - self.q01) / np.where(span > 0, span, 1.0) - 1.0
        scaled = np.where(span > 0, scaled, 0.0)  # a constant axis: any bin decodes to q01
        return np.clip(np.where(self.mask, scaled, values), -1.0, 1.0)

    def unnormalise(self, normalised: np.ndarray) -> np.ndarray:
        """The policy's normalised values (..., 7) -> its own actions, as OpenVLA's ``predict_action``
        returns them: unnormalised where the mask is true, the value as is where it is false."""
        normalised = np.clip(np.asarray(normalised, dtype=np.float64), -1.0, 1.0)
        return np.where(self.mask, 0.5 * (normalised + 1.0) * (self.q99 - self.q01) + self.q01, normalised)

    def denormalise(self, normalised: np.ndarray) -> np.ndarray:
        """The policy's normalised values (..., 7) -> our actions: :meth:`unnormalise`, then the
        gripper convention."""
        actions = self.unnormalise(normalised)
        actions[..., GRIPPER_INDEX] = self.from_policy_gripper(actions[..., GRIPPER_INDEX])
        return actions

    def encode_one(self, action: np.ndarray) -> np.ndarray:
        """:meth:`encode` of one finite action (7,), by the same arithmetic on plain floats."""
        values = np.asarray(action, dtype=np.float64).tolist()
        values[GRIPPER_INDEX] = float(self.to_policy_gripper(np.float64(values[GRIPPER_INDEX])))
        tokens = []
        for value, low, high, masked in zip(values, self._q01, self._q99, self._mask):
            if masked:
                value = 2.0 * (value - low) / (high - low) - 1.0 if high > low else 0.0
            normalised = min(max(value, -1.0), 1.0)
            tokens.append(min(max(bisect.bisect_right(self._edges, normalised) - 1, 0), N_CENTRES - 1))
        return np.array(tokens, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "openvla_bins_masked", "n_bins": N_BINS, "q01": self.q01.tolist(),
                "q99": self.q99.tolist(), "mask": self.mask.tolist(), "gripper": self.gripper}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpenVLAActionTokenizer:
        for key in ("q01", "q99"):
            if key not in data:
                raise ValueError(f"tokenizer entry is missing '{key}'")
        if int(data.get("n_bins", N_BINS)) != N_BINS:
            raise ValueError(f"tokenizer has n_bins={data['n_bins']}, this version supports {N_BINS}")
        return cls(np.asarray(data["q01"]), np.asarray(data["q99"]), data.get("mask"),
                   data.get("gripper", "0_1_open_high"))

    @classmethod
    def from_statistics(cls, statistics: ActionStatistics, gripper: str) -> OpenVLAActionTokenizer:
        return cls(statistics.q01, statistics.q99, statistics.mask, gripper)

    def __repr__(self) -> str:
        return (f"OpenVLAActionTokenizer(q01={np.round(self.q01, 5).tolist()}, q99={np.round(self.q99, 5).tolist()}, "
                f"mask={self.mask.tolist()}, gripper={self.gripper!r})")
