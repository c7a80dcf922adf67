"""Incremental vision encoding: re-encode only the image patches that changed since last time.

Between consecutive camera frames of a robot most of the image is the same: the table, the
background and the objects the arm is not touching. The target's per-patch local encoder is its
most expensive vision stage and sees one patch at a time, so a patch whose pixels did not change
gives the same local encoding: it is served from a cache, and only the dynamic patches are
recomputed. The global vision layer and the decoder still run over every token.

A patch is *dynamic* when the mean absolute difference of its pixels (0..255 scale) from the
pixels that produced its cached encoding exceeds ``threshold``. Comparing against those reference
pixels, not against the previous frame, bounds the error: slow drift accumulates until the patch
is recomputed. On top, everything is refreshed every ``refresh_steps`` frames, when the mean drift
of the cached patches exceeds ``max_drift``, and whenever the instruction changes (the encoder is
FiLM-conditioned on it). With ``threshold`` 0 every changed patch is recomputed, which equals full
encoding exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class VisionReuseConfig:
    threshold: float = 4.0  # mean |pixel change| (0..255) above which a patch is re-encoded
    refresh_steps: int = 20  # re-encode everything at least this often (frames)
    max_drift: float = 2.0  # mean |pixel change| over the cached patches that forces a refresh

    def __post_init__(self) -> None:
        if not (np.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"VisionReuseConfig.threshold must be >= 0, got {self.threshold}")
        if self.refresh_steps < 1:
            raise ValueError(f"VisionReuseConfig.refresh_steps must be >= 1, got {self.refresh_steps}")
        if not (np.isfinite(self.max_drift) and self.max_drift >= 0):
            raise ValueError(f"VisionReuseConfig.max_drift must be >= 0, got {self.max_drift}")


@dataclass(frozen=True)
class ReuseStats:
    """What one frame cost: patches recomputed (of ``n_patches``) and whether it was a full refresh."""

    recomputed: int
    n_patches: int
    refreshed: bool
    reason: str = ""

    @property
    def fraction(self) -> float:
        return self.recomputed / self.n_patches


class IncrementalVisionEncoder:
    """Local vision encodings of a stream of frames (batch 1), reusing unchanged patches.

    ``policy`` needs ``target.patchify``, ``target.encode_patches`` and ``config.patch_size``
    (:class:`vla_accel_ros.models.Policy`).
    """

    def __init__(self, policy, config: VisionReuseConfig | None = None) -> None:
        self.policy = policy
        self.config = config or VisionReuseConfig()
        self.reset()

    def reset(self) -> None:
        """Forget the cache: the next frame is encoded in full."""
        self._reference: torch.Tensor | None = None  # (P, 3*ps*ps) float pixels behind each cached entry
        self._local: torch.Tensor | None = None  # (1, P, W) cached local encodings
        self._text: torch.Tensor | None = None
        self._since_refresh = 0
        self.last: ReuseStats | None = None

    def encode(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """uint8 images (1, H, W, 3), instruction ids (1, T) -> local encodings (1, P, W)."""
        if images.shape[0] != 1:
            raise ValueError(f"incremental vision encodes one frame at a time, got a batch of {images.shape[0]}")
        target = self.policy.target
        with torch.inference_mode():
            patches = target.patchify(images)  # (1, P, 3, ps, ps) in [-1, 1]
            pixels = patches[0].flatten(1) * 127.5  # (P, 3*ps*ps), 0..255 scale differences
            reason = self._refresh_reason(text)
            if not reason:
                change = (pixels - self._reference).abs().mean(dim=1)  # (P,)
                is_dynamic = change > self.config.threshold
                static_change = change[~is_dynamic]
                if len(static_change) and float(static_change.mean()) > self.config.max_drift:
                    reason = "drift"
            if reason:
                self._local = target.encode_patches(patches, text)
                self._reference, self._text = pixels.clone(), text.clone()
                self._since_refresh = 1
                self.last = ReuseStats(pixels.shape[0], pixels.shape[0], True, reason)
                return self._local
            dynamic = torch.nonzero(is_dynamic).squeeze(1)
            if len(dynamic):
                self._local = self._local.clone()  # callers may still hold the previous tensor
                self._local[:, dynamic] = target.encode_patches(patches[:, dynamic], text)
                self._reference[dynamic] = pixels[dynamic]
            self._since_refresh += 1
            self.last = ReuseStats(int(len(dynamic)), pixels.shape[0], False)
            return self._local

    def _refresh_reason(self, text: torch.Tensor) -> str:
        """Why this frame must be encoded in full ('' when the cache may serve it)."""
        if self._local is None:
            return "first frame"
        if self._text is None or not torch.equal(text, self._text):
            return "instruction changed"
        if self._since_refresh >= self.config.refresh_steps:
            return "timer"
        return ""
