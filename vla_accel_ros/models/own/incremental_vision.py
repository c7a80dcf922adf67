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

A policy that declares its own incremental prefill (``own_incremental_prefill`` among its
capabilities, served by ``policy.incremental_prefill(config)``: a Hugging Face VLA,
:mod:`vla_accel_ros.models.hf.hf_incremental`) serves the frames through it instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.layers import KeysValues
from vla_accel_ros.models.own.policy import Policy, Prefix, ScoreOutput

if TYPE_CHECKING:
    from vla_accel_ros.models.hf.hf_incremental import HFIncrementalPrefill
    from vla_accel_ros.models.hf.hf_vla import HFPrefix, HFScoreOutput


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
    """Local vision encodings of a stream of frames (batch 1), reusing unchanged patches, and the
    policy's prefixes built from them."""

    def __init__(self, policy: Policy, config: VisionReuseConfig | None = None) -> None:
        self.policy = policy
        self.config = config or VisionReuseConfig()
        own = policy.capabilities().own_incremental_prefill
        self._own: HFIncrementalPrefill | None = policy.incremental_prefill(self.config) if own else None
        self.reset()

    def reset(self) -> None:
        """Forget the cache: the next frame is encoded in full."""
        if self._own is not None:
            self._own.reset()
        self._reference: torch.Tensor | None = None  # (H, W, 3) float: the pixels behind each cached patch
        self._local: torch.Tensor | None = None  # (1, P, W) cached local encodings
        self._text: torch.Tensor | None = None
        self._film: tuple[torch.Tensor, torch.Tensor] | None = None  # the patch encoder's FiLM of ``_text``
        self._dynamic = torch.zeros(0, dtype=torch.long)  # patches the last frame recomputed
        self._prefix_cache: _PrefixCache | None = None
        self._since_refresh = 0
        self.last: ReuseStats | None = None

    def prefill(self, obs: Observation) -> Prefix | HFPrefix:
        """The policy's prefix for one observation, reusing what the previous frames computed."""
        if self._own is not None:
            prefix = self._own.prefill(obs)
            self.last = self._own.last
            return prefix
        policy = self.policy
        images, text, proprio = policy.observation_tensors(obs)
        with torch.inference_mode():
            local = self._encode(images, text)
            if not self.config.reuse_kv:
                return policy.prefill_batch(images, text, proprio, local)
            return self._reuse_kv(local, text, proprio, None).prefix

    def prefill_scored(self, obs: Observation, tokens: torch.Tensor) -> ScoreOutput | HFScoreOutput:
        """``Policy.prefill_scored`` of one observation: action tokens (1, k) verified in the same
        pass, here the incremental one (with ``reuse_kv``, they ride along with the recomputed
        tokens)."""
        if self._own is not None:
            scored = self._own.prefill_scored(obs, tokens)
            self.last = self._own.last
            return scored
        policy = self.policy
        images, text, proprio = policy.observation_tensors(obs)
        with torch.inference_mode():
            local = self._encode(images, text)
            if not self.config.reuse_kv:
                return policy.prefill_batch_scored(images, text, proprio, tokens, local)
            policy.check_action_tokens(tokens, 1)
            return self._reuse_kv(local, text, proprio, tokens)

    def _reuse_kv(self, local: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor,
                  tokens: torch.Tensor | None) -> ScoreOutput:
        """The prefix (extended by ``tokens``, if any) from the cached keys and values, which it
        then updates; the logits are those of the action positions (empty without tokens). In
        inference mode."""
        policy = self.policy
        if policy.world is not None:
            raise ValueError("vision reuse_kv does not support a world-aware prefill; use reuse_kv=False")
        assert self.last is not None
        if self.last.refreshed or self._prefix_cache is None:
            self._prefix_cache, scored = _PrefixCache.full(policy, local, text, proprio, tokens)
        else:
            self._prefix_cache, scored = self._prefix_cache.update(policy, local, proprio, self._dynamic, tokens)
        return scored

    def encode(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """uint8 images (1, H, W, 3), instruction ids (1, T) -> local encodings (1, P, W)."""
        with torch.inference_mode():
            return self._encode(images, text)

    def _encode(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """:meth:`encode`, in inference mode."""
        if images.shape[0] != 1:
            raise ValueError(f"incremental vision encodes one frame at a time, got a batch of {images.shape[0]}")
        policy = self.policy
        target = policy.target
        # Change detection on the image's own layout, in float: the per-patch sums of |change|
        # are integers below 2**24, so exact, and float has the fastest kernels for them.
        pixels = images[0].to(torch.float32, copy=True)  # (H, W, 3) on 0..255; it becomes the reference
        reason = self._refresh_reason(text)
        if not reason:
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
                self._film = policy.instruction_film(text)
            self._local = target.encode_images(images, self._film)
            self._reference, self._text = pixels, text.clone()
            self._dynamic = torch.arange(n_patches)
            self._since_refresh = 1
            self.last = ReuseStats(n_patches, n_patches, True, reason)
            return self._local
        if len(dynamic):
            # the dynamic patches' pixels in the encoder's order: they become the reference, then its input
            offsets = target.cell_offsets(dynamic)
            values = pixels.view(-1).index_select(0, offsets)
            self._reference.view(-1).index_copy_(0, offsets, values)
            cells = target.patch_pixels(values).view(1, len(dynamic), *target.patch_cell_shape)
            fresh = target.patch_encoder.encode_cells(cells, film=self._film)
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
        if self._local is None:
            return "first frame"
        if self._text is None or not torch.equal(text, self._text):
            return "instruction changed"
        if self._since_refresh >= self.config.refresh_steps:
            return "timer"
        return ""


# --- reuse of keys and values ---------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _PrefixCache:
    """What a prefill computed, per prefix position, for the next frame to reuse.

    vision_kv / decoder_kv: per layer the keys and values (2, 1, H, P or L, hd); vision: (1, P, d)
    patch tokens after the global layers; hidden: (1, L, d) final-norm decoder states of the
    prefix; trailing_positions: the positions of the tokens an image change always recomputes
    (the keypoint token, if any, proprioception, BOS).
    """

    vision_kv: tuple[KeysValues, ...]
    vision: torch.Tensor
    decoder_kv: tuple[KeysValues, ...]
    hidden: torch.Tensor
    trailing_positions: torch.Tensor

    @classmethod
    def full(cls, policy: Policy, local: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor,
             tokens: torch.Tensor | None = None) -> tuple[_PrefixCache, ScoreOutput]:
        """Every token computed (what ``Policy.prefill`` computes, or ``prefill_scored`` with action
        ``tokens``), caches kept."""
        target = policy.target
        vision, vision_kv = target.vision_transformer(local)
        keypoint = [target.keypoint_token(local)] if target.config.keypoints else []
        x = target.embed_prefix(torch.cat([vision, *keypoint], dim=1), text, policy.normalise_proprio(proprio))
        length = x.shape[1]
        if tokens is not None:
            x = torch.cat([x, target.embed_actions(tokens, length)], dim=1)
        hidden, decoder_kv = target.decode(x)
        positions = torch.arange(length, device=x.device)
        trailing = torch.cat([positions[vision.shape[1] : vision.shape[1] + len(keypoint)], positions[-2:]])
        cache = cls(tuple(torch.stack(kv) for kv in vision_kv), vision,
                    tuple(torch.stack(kv)[..., :length, :] for kv in decoder_kv), hidden[:, :length], trailing)
        return cache, cache._scored(policy, decoder_kv, hidden[:, length:], tokens)

    def update(self, policy: Policy, local: torch.Tensor, proprio: torch.Tensor, dynamic: torch.Tensor,
               tokens: torch.Tensor | None = None) -> tuple[_PrefixCache, ScoreOutput]:
        """Recompute the dynamic patches' tokens, the keypoint token, proprioception and BOS (and
        run the action ``tokens``, if any, after them in the same pass)."""
        target = policy.target
        length = self.hidden.shape[1]
        tail = target.prefix_tail_tokens(policy.normalise_proprio(proprio))  # proprioception, BOS
        if len(dynamic) == 0:
            # An unchanged image: the vision tokens, the keypoint token (a function of the patches
            # alone) and everything the decoder computed for them stand as they are, exactly.
            vision_kv, vision, recomputed = self.vision_kv, self.vision, [*tail]
            positions = self.trailing_positions[-2:]
            n_trailing = 2
        else:
            changed, vision_kv = target.vision_transformer(local, dynamic, self.vision_kv)
            vision = self.vision.index_copy(1, dynamic, changed)
            # Only the recomputed tokens are embedded: the changed patches, the keypoint token, then
            # the prefix tail (proprioception, BOS), each at its position.
            keypoint = [target.keypoint_token(local)] if target.config.keypoints else []
            n_trailing = len(keypoint) + 2
            positions = torch.cat([dynamic, self.trailing_positions])
            recomputed = [changed, *keypoint, *tail]
        x = target.embed_at(torch.cat(recomputed, dim=1), positions)
        n_actions = 0 if tokens is None else tokens.shape[1]
        if n_actions:  # the action tokens come after the prefix: they see all of it, the prefix none of them
            x = torch.cat([x, target.embed_actions(tokens, length)], dim=1)
        # In the last layer the patch tokens give only keys and values (for the action tokens): their
        # outputs would feed nothing but the pooled feature, which keeps them from their last full
        # computation. The trailing tokens (keypoint, proprioception, BOS) are computed in full.
        out, decoder_kv = target.decode(x, self.decoder_kv, positions, n_outputs=n_trailing + n_actions)
        hidden = self.hidden.index_copy(1, self.trailing_positions if len(dynamic) else positions, out[:, :n_trailing])
        prefix_kv = decoder_kv if not n_actions else [kv[..., :length, :] for kv in decoder_kv]
        cache = _PrefixCache(tuple(vision_kv), vision, tuple(prefix_kv), hidden, self.trailing_positions)
        return cache, cache._scored(policy, tuple((kv[0], kv[1]) for kv in decoder_kv), out[:, n_trailing:], tokens)

    def _scored(self, policy: Policy, decoder_kv: tuple[tuple[torch.Tensor, torch.Tensor], ...],
                action_hidden: torch.Tensor, tokens: torch.Tensor | None) -> ScoreOutput:
        """The prefix this frame's pass made (``decoder_kv``, per layer (keys, values), runs on over
        the action ``tokens``, whose hidden states are ``action_hidden``) and the target's logits at
        the action positions."""
        scored = tokens is not None and tokens.shape[1] > 0
        prefix = Prefix(
            kv=decoder_kv,
            action_hidden=torch.cat([self.hidden[:, -1:], action_hidden], dim=1) if scored else self.hidden[:, -1:],
            tokens=tokens if tokens is not None else torch.empty(1, 0, dtype=torch.long),
            pooled=self.hidden.mean(dim=1),
            prefix_len=self.hidden.shape[1],
        )
        return ScoreOutput(policy.target.lm_head(prefix.action_hidden) if scored else torch.empty(0), prefix)
