"""Settings of the models layer that other layers read without loading a model: the incremental-vision
settings, the sampling temperature's bound, and how a checkpoint runs unless told otherwise
(:class:`RunDefaults`: its family's, then the keys of its ``vla_spec.json``).

Importable without torch: ``ros/parameters.py`` builds the node's parameters from these before any
model is loaded (in ``inference_mode: process`` the node never loads one at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vla_accel_ros.core.settings import setting
from vla_accel_ros.models.files import read_json_object

DEFAULT_TEMPERATURE = 0.5  # the package's own policies' setting, chosen on closed-loop success (README)
MAX_TEMPERATURE = 2.0
RUN_SPEC_FILE = "vla_spec.json"
# vla_spec.json keys that set how a checkpoint runs unless the user sets it (RunDefaults' fields)
RUN_DEFAULT_KEYS = ("temperature", "kinematic_r_bounds", "kf_fill_check")


@dataclass(frozen=True)
class RunDefaults:
    """How a checkpoint runs unless the user sets it: ``temperature``, its action-token sampling
    temperature (0 = greedy); ``kinematic_r_bounds``, the (r_min, r_max) of ``kerv`` and
    ``world_aware``'s kinematic acceptance threshold, in token bins (None: the decoder's own,
    5:15); ``kf_fill_check``, whether those decoders check their Kalman fill against the target's
    picks. The defaults are those of a model the package did not train: greedy, as a published
    model's own ``predict_action``, and the bounds and checked fill that keep the success of a model
    whose tokens the Kalman filter predicts poorly (docs/your_own_vla.md, "Defaults per model")."""

    temperature: float = 0.0
    kinematic_r_bounds: tuple[int, int] | None = (2, 6)
    kf_fill_check: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not (
                math.isfinite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be a number in [0, {MAX_TEMPERATURE}], got {self.temperature!r}")
        object.__setattr__(self, "temperature", float(self.temperature))
        if self.kinematic_r_bounds is not None:
            bounds = self.kinematic_r_bounds
            if not (isinstance(bounds, (list, tuple)) and len(bounds) == 2
                    and all(isinstance(r, int) and not isinstance(r, bool) for r in bounds)
                    and 0 <= bounds[0] <= bounds[1] <= 255):
                raise ValueError(f"kinematic_r_bounds must be [r_min, r_max], integers with 0 <= r_min <= r_max "
                                 f"<= 255, got {bounds!r}")
            object.__setattr__(self, "kinematic_r_bounds", (bounds[0], bounds[1]))
        if not isinstance(self.kf_fill_check, bool):
            raise ValueError(f"kf_fill_check must be true or false, got {self.kf_fill_check!r}")  # noqa: TRY004

    def to_json(self) -> dict[str, Any]:
        """The ``vla_spec.json`` keys that declare these defaults."""
        bounds = None if self.kinematic_r_bounds is None else list(self.kinematic_r_bounds)
        return {"temperature": self.temperature, "kinematic_r_bounds": bounds, "kf_fill_check": self.kf_fill_check}


# The package's own policies (checkpoints/default and what its trainers make of it): tuned here.
TRAINED_HERE = RunDefaults(temperature=DEFAULT_TEMPERATURE, kinematic_r_bounds=None, kf_fill_check=False)


def declared_run_defaults(family_defaults: RunDefaults, directory: Path) -> RunDefaults:
    """``family_defaults`` with what the ``vla_spec.json`` in ``directory`` sets of them
    (``RUN_DEFAULT_KEYS``); ValueError naming the file and key for a bad value."""
    path = directory / RUN_SPEC_FILE
    if not path.is_file():
        return family_defaults
    stored: dict[str, Any] = read_json_object(path)
    declared = {key: stored[key] for key in RUN_DEFAULT_KEYS if key in stored}
    try:
        return replace(family_defaults, **declared)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


@dataclass(frozen=True)
class VisionReuseConfig:
    """How a policy's incremental prefill (:class:`~vla_accel_ros.models.api.IncrementalPrefill`) reuses
    the encodings of unchanged image patches.

    ``enabled`` says whether a runner uses the incremental encoder at all (the encoder itself does not
    read it). It is keyword-only: the positional order is ``(threshold, refresh_steps, max_drift,
    reuse_kv, feature_threshold, reuse_tower, tower_threshold, tower_refresh_steps)``. The metadata
    documents each field as one of the node's ROS parameters (``vision_*``); its ranges are those of
    the node's interface, enforced where a settings class nests this one
    (:func:`~vla_accel_ros.core.settings.check_fields`). On its own the class refuses only values the
    encoder cannot work with.
    """

    enabled: bool = setting(True, "Re-encode only the image patches that changed since the frame that produced "
                            "their cached encoding (incremental vision); false = encode every patch of every frame",
                            kw_only=True)
    # 8 (0..255): at 4 closed-loop success fell by 6 points (README, "Incremental vision")
    threshold: float = setting(8.0, "Incremental vision: mean |pixel change| (0..255) that makes a patch dynamic",
                               range=(0.0, 255.0))
    refresh_steps: int = setting(20, "Incremental vision: re-encode every patch at least every N frames",
                                 range=(1, 100000))
    max_drift: float = setting(2.0, "Incremental vision: mean sub-threshold change of the cached patches that "
                               "forces a full refresh", range=(0.0, 255.0))
    reuse_kv: bool = setting(False, "Incremental vision also reuses the global-layer and decoder keys/values of "
                             "unchanged prefix tokens (faster prefill, approximate; needs vision_reuse)")
    # A Hugging Face VLA's tower is bidirectional: a token's features move with patches elsewhere in
    # the image, which the pixel rule cannot see; 0.15 keeps hf_small's success (docs/your_own_vla.md,
    # "Incremental prefill"). The package policy's patch encoder is local: it judges by pixels.
    feature_threshold: float = setting(0.15, "Incremental prefill of a Hugging Face VLA: relative change of an image "
                                       "token's features (|f - f_ref| / |f_ref|) from those behind its cached "
                                       "keys/values that makes it dynamic; 0 = judge by pixels (vision_threshold)",
                                       range=(0.0, 10.0))
    # A small tower is a sizeable share of the prefill (a quarter of hf_small's): the reuse of the
    # language model's rows alone cannot remove it (docs/your_own_vla.md, "Incremental prefill").
    reuse_tower: bool = setting(False, "Incremental prefill of a Hugging Face VLA: run its vision tower, too, "
                                "only on the patches whose pixels moved by more than vision_tower_threshold, the "
                                "others keeping their keys, values and features in every tower layer; needs "
                                "vision_reuse_kv and the direct forward")
    tower_threshold: float = setting(2.0, "vision_reuse_tower: mean |pixel change| (0..255) that makes the tower "
                                     "recompute a patch", range=(0.0, 255.0))
    # An unmoved patch's features also move with what its attention sees of the moving arm, which the
    # cache misses until the next full pass; every 3 frames hf_small keeps its success (docs/your_own_vla.md).
    tower_refresh_steps: int = setting(3, "vision_reuse_tower: run the tower on every patch at least every N frames",
                                       range=(1, 100000))

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"VisionReuseConfig.threshold must be >= 0, got {self.threshold}")
        if self.refresh_steps < 1:
            raise ValueError(f"VisionReuseConfig.refresh_steps must be >= 1, got {self.refresh_steps}")
        if not (math.isfinite(self.max_drift) and self.max_drift >= 0):
            raise ValueError(f"VisionReuseConfig.max_drift must be >= 0, got {self.max_drift}")
        if not (math.isfinite(self.tower_threshold) and self.tower_threshold >= 0):
            raise ValueError(f"VisionReuseConfig.tower_threshold must be >= 0, got {self.tower_threshold}")
        if self.tower_refresh_steps < 1:
            raise ValueError(f"VisionReuseConfig.tower_refresh_steps must be >= 1, got {self.tower_refresh_steps}")
        if not (math.isfinite(self.feature_threshold) and self.feature_threshold >= 0):
            raise ValueError(f"VisionReuseConfig.feature_threshold must be >= 0, got {self.feature_threshold}")

    def refresh_reason(self, *, cached: bool, instruction_changed: bool, since_refresh: int) -> str:
        """Why an incremental prefill must recompute a frame in full ('' when its cache may serve
        it): nothing ``cached`` yet, an ``instruction_changed`` since the cache was made, or
        ``refresh_steps`` frames ``since_refresh`` (the last full one). Every family's incremental
        prefill asks this; its own drift rules come after."""
        if not cached:
            return "first frame"
        if instruction_changed:
            return "instruction changed"
        if since_refresh >= self.refresh_steps:
            return "timer"
        return ""
