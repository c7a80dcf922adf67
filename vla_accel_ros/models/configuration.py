"""Settings of the models layer that other layers read without loading a model: the incremental-vision
settings and the sampling temperature's default and bound.

Importable without torch: ``ros/parameters.py`` builds the node's parameters from these before any
model is loaded (in ``inference_mode: process`` the node never loads one at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vla_accel_ros.core.settings import setting

DEFAULT_TEMPERATURE = 0.5  # the shipped policy's setting, chosen on closed-loop success (README)
MAX_TEMPERATURE = 2.0


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
