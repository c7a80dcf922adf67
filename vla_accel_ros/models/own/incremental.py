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
encoding exactly. (``feature_threshold`` and the tower's settings are not read here: this encoder
sees one patch at a time, so a patch's encoding moves only with its own pixels, and it runs only on
the moved patches already.)

With ``reuse_kv`` the reuse goes past the local encoder, as an approximation: the global vision
layer and the causal decoder run only on the tokens that must change (the dynamic patches, the
keypoint token, proprioception and BOS), attending to the cached keys and values of every other
prefix token (the static patches and the instruction bytes) from the frame that last computed
them. A static token's keys would in truth move a little when a token it attends to changes; the
same refresh rules bound how long that error can live. In the last decoder layer the changed
patches contribute only their keys and values: their outputs there would feed nothing but the
pooled feature (contact head, retrieval key), which keeps them from the last full computation.
Proprioception and BOS come last in the prefix, so a new joint state with an unchanged image gives
exactly the full prefill.

This is the own family's :class:`~vla_accel_ros.models.api.IncrementalPrefill`
(``Policy.incremental_prefill(settings)``); the target's one pass over the prefix,
``VLATarget.forward_prefix``, runs either way, in full or on the recomputed tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.api import Prefix, ReuseStats, ScoreOutput
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.own.config import VLAConfig
from vla_accel_ros.models.own.modules import PrefixPass, PrefixState, VLATarget


class FramePolicy(Protocol):
    """What the encoder calls of the own family's policy (:class:`~vla_accel_ros.models.own.policy.Policy`)."""

    config: VLAConfig
    target: VLATarget

    @property
    def world(self) -> Any: ...

    def observation_tensors(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def check_action_tokens(self, tokens: torch.Tensor, batch_size: int) -> None: ...

    def prefill_tensors(self, images: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor,
                        tokens: torch.Tensor | None = None,
                        local_tokens: torch.Tensor | None = None) -> ScoreOutput: ...

    def normalise_proprio(self, proprio: torch.Tensor) -> torch.Tensor: ...

    def scored(self, result: PrefixPass, tokens: torch.Tensor | None) -> ScoreOutput: ...

    def instruction_film(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class IncrementalVisionEncoder:
    """Local vision encodings of a stream of frames (batch 1), reusing unchanged patches, and the
    policy's prefixes built from them (the module docstring)."""

    def __init__(self, policy: FramePolicy, config: VisionReuseConfig | None = None) -> None:
        self.policy = policy
        self.config = config or VisionReuseConfig()
        if self.config.reuse_kv and policy.world is not None:
            raise ValueError("vision reuse_kv does not support a world-aware prefill; use reuse_kv=False")
        self.reset()

    def reset(self) -> None:
        """Forget the cache: the next frame is encoded in full."""
        self._reference: torch.Tensor | None = None  # (H, W, 3) float: the pixels behind each cached patch
        self._local: torch.Tensor | None = None  # (1, P, W) cached local encodings
        self._text: torch.Tensor | None = None
        self._film: tuple[torch.Tensor, torch.Tensor] | None = None  # the patch encoder's FiLM of ``_text``
        self._dynamic = torch.zeros(0, dtype=torch.long)  # patches the last frame recomputed
        self._state: PrefixState | None = None  # reuse_kv: what the last pass left for the next
        self._since_refresh = 0
        self.last: ReuseStats | None = None

    def prefill(self, obs: Observation) -> Prefix:
        """The policy's prefix for one observation, reusing what the previous frames computed."""
        return self.prefill_batch([obs]).prefix

    def prefill_batch(self, observations: Sequence[Observation], tokens: torch.Tensor | None = None) -> ScoreOutput:
        """``Policy.prefill_batch`` of one observation, with the action ``tokens`` (1, k) after it, if
        any, in the same pass (with ``reuse_kv``, they ride along with the recomputed tokens)."""
        if len(observations) != 1:
            raise ValueError(f"incremental vision prefills one frame at a time, got {len(observations)}")
        policy = self.policy
        images, text, proprio = policy.observation_tensors(observations[0])
        with torch.inference_mode():
            if tokens is not None:
                policy.check_action_tokens(tokens, 1)
            local = self._encode(images, text)
            if not self.config.reuse_kv:
                return policy.prefill_tensors(images, text, proprio, tokens, local_tokens=local)
            assert self.last is not None
            past = None if self.last.refreshed else self._state
            result = policy.target.forward_prefix(local, text, policy.normalise_proprio(proprio), tokens, past=past,
                                                  dynamic=self._dynamic, keep_state=True)
            self._state = result.state
            return policy.scored(result, tokens)

    def encode(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """uint8 images (1, H, W, 3), instruction ids (1, T) -> local encodings (1, P, W)."""
        with torch.inference_mode():
            return self._encode(images, text)

    def _encode(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """:meth:`encode`, in inference mode."""
        if images.shape[0] != 1:
            raise ValueError(f"incremental vision encodes one frame at a time, got a batch of {images.shape[0]}")
        target = self.policy.target
        # Change detection on the image's own layout, in float: the per-patch sums of |change|
        # are integers below 2**24, so exact, and float has the fastest kernels for them.
        pixels = images[0].to(torch.float32, copy=True)  # (H, W, 3) on 0..255; it becomes the reference
        reason = self._refresh_reason(text)
        if not reason:
            assert self._reference is not None
            total = self._per_patch((pixels - self._reference).abs_()).sum(dim=(1, 3)).flatten()  # (P,)
            # compared with the thresholds scaled to sums rather than divided down to means
            n_values = pixels.numel() // total.shape[0]
            is_dynamic = total > self.config.threshold * n_values
            dynamic = torch.nonzero(is_dynamic).squeeze(1)
            n_static = total.shape[0] - len(dynamic)
            static_total = float(total.masked_fill(is_dynamic, 0).sum())
            if n_static and static_total > self.config.max_drift * n_values * n_static:
                reason = "drift"
        n_patches = target.config.n_patches
        if reason:
            if reason == "first frame" or reason == "instruction changed":
                self._film = self.policy.instruction_film(text)
            self._local = target.encode_images(images, self._film)
            self._reference, self._text = pixels, text.clone()
            self._dynamic = torch.arange(n_patches)
            self._since_refresh = 1
            self.last = ReuseStats(n_patches, n_patches, True, reason)
            return self._local
        assert self._local is not None and self._reference is not None
        if len(dynamic):
            # the dynamic patches' pixels become the reference, then the encoder's input
            fresh = target.encode_patches_of(pixels, dynamic, self._film, reference=self._reference)
            self._local = self._local.index_copy(1, dynamic, fresh)  # a new tensor: callers may hold the old
        self._dynamic = dynamic
        self._since_refresh += 1
        self.last = ReuseStats(int(len(dynamic)), n_patches, False)
        return self._local

    def _per_patch(self, pixels: torch.Tensor) -> torch.Tensor:
        """(H, W, 3) -> a view (patch row, row in patch, patch column, values in the patch's row)."""
        c = self.policy.config
        side = c.image_size // c.patch_size
        return pixels.view(side, c.patch_size, side, 3 * c.patch_size)

    def _refresh_reason(self, text: torch.Tensor) -> str:
        """Why this frame must be encoded in full ('' when the cache may serve it)."""
        cached = self._local is not None
        changed = cached and (self._text is None or not torch.equal(text, self._text))
        return self.config.refresh_reason(cached=cached, instruction_changed=changed,
                                          since_refresh=self._since_refresh)
