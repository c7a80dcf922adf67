"""Incremental prefill of a Hugging Face VLA (:class:`~vla_accel_ros.models.token_vla.policy.HFTokenVLA`), in the
style of VLA-Cache: between frames, the keys and values of the image tokens whose patches did not
change are reused in every layer of the language model.

Per frame the vision tower and projector run on the whole image (beside the language model they
cost little at a real VLA's shape), unless ``reuse_tower`` (below). Which image tokens are *dynamic*:

- the feature rule (``feature_threshold`` > 0, the default): those whose features moved by more
  than ``feature_threshold`` (relative, ``|f - f_ref| / |f_ref|``) from the features behind their
  cached keys and values. The tower's attention spreads a moving gripper's appearance over patches
  that did not change (the trained ``checkpoints/hf_small`` moves them 3-13% per frame), which this
  rule sees. It needs no drift rule: the threshold bounds each reused token's own change. A full
  prefill under it feeds the features it computed, so the tower runs once per frame either way.
- the pixel rule (``feature_threshold`` 0): those whose patch's pixels moved by a mean absolute
  difference (0..255 scale) from the reference pixels behind their cached keys and values of more
  than ``threshold``, with a full prefill when the mean sub-threshold change of the cached patches
  exceeds ``max_drift``.

Either way a full prefill also comes on the first frame, when the instruction changes and every
``refresh_steps`` frames (incremental vision's rules, :mod:`vla_accel_ros.models.own.incremental`).

The language model then runs only on the dynamic image tokens, the text after the image and, for
``prefill_batch`` with tokens, the action tokens, each at its true position (RoPE), over a cache pre-filled
with every layer's keys and values of the other prefix tokens (BOS and the static image tokens,
whose keys carry their positions already). A 4D additive mask makes each recomputed token attend
by true position: to the cached and the recomputed tokens at or before its own. The cache then
holds the whole prefix, its rows ordered otherwise than the positions, which attention over rotated
keys does not see: ``HFTokenVLA.score`` appends action tokens after the prefix and crops them off as
after a full prefill.

A static token's keys and values are those of the frame that last computed them. In truth they
move a little when an earlier token changes, and as the tower is bidirectional every image feature
moves with any patch; the rules above bound that error, and a static token's final hidden state
(in ``pooled``) is likewise kept from its last computation. When every image token is dynamic the
result is the full prefill's up to float rounding, and so it is under the pixel rule with
``threshold`` 0: then any change recomputes every image token, since only an identical image gives
identical features. An identical image recomputes only the text.

With ``reuse_tower`` (a small model's tower is a sizeable share of its prefill) the tower works the
same way, through the direct forward (:meth:`~vla_accel_ros.models.hf.direct.DirectLlavaForward.tower_pass`):
it runs only on the patches whose pixels moved by more than ``tower_threshold`` from those behind
its cache, attending in every layer to the cached keys and values of the others, which keep their
features. An unmoved patch's features also move with what its attention sees of the moving arm;
the cache misses that until the tower's next full pass, on the prefill's full frames and every
``tower_refresh_steps`` frames. The feature rule then compares these features as it would the
full pass's.

Reusing the keys and values of the language model is required (``VisionReuseConfig.reuse_kv``):
reusing the tower's outputs alone, as the package policy's ``reuse_kv=False`` mode does with its
per-patch encoder, would leave the language model's cost, which dominates at a real VLA's shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.api import Prefix, ReuseStats, ScoreOutput
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.token_vla.cache import CacheSlot, TowerCache
from vla_accel_ros.models.token_vla.static import StaticKVCache

if TYPE_CHECKING:
    from vla_accel_ros.models.token_vla.passes import HFPasses

# The attention implementations that take the 4D additive mask as given (flash attention takes none).
MASKED_ATTENTION = ("eager", "sdpa")


@dataclass(frozen=True, eq=False)
class _PrefixState:
    """What a frame leaves for the next: ``layers``, every layer's keys and values whose first L rows
    hold the prefix's (later rows are action tokens that ``score`` appended),
    ``row_positions`` (L,) the true position of each of those rows, ``hidden`` (1, L, d) the
    prefix's final hidden states by position, and under the feature rule ``features``
    (1, n_image_tokens, d) the image features behind each image token's cached keys and values."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    row_positions: torch.Tensor
    hidden: torch.Tensor
    features: torch.Tensor | None = None

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        """The cache rows that hold ``positions``."""
        row_of_position = torch.empty_like(self.row_positions)
        row_of_position[self.row_positions] = torch.arange(len(self.row_positions), device=self.row_positions.device)
        return row_of_position[positions]


class HFIncrementalPrefill:
    """``prefill_batch`` of one Hugging Face VLA (its :class:`HFPasses`) over a stream of frames (batch 1),
    recomputing only the tokens that the image's changes reach (module docstring).

    ``last`` is the last frame's :class:`ReuseStats` (image tokens recomputed of ``n_image_tokens``);
    :attr:`recomputed_tokens` says which. ValueError at construction when ``config.reuse_kv`` is
    false, or when the model is not one this prefill can run: one image token per patch of the
    tower's grid, every text layer full attention, an attention implementation that takes a 4D mask.
    """

    def __init__(self, policy: HFPasses, config: VisionReuseConfig) -> None:
        if not config.reuse_kv:
            raise ValueError(f"{policy.source}: a Hugging Face VLA runs incremental vision only with reused "
                             "keys/values (reuse_kv, --vision incremental_kv, bench --reuse-kv): its vision tower is "
                             "bidirectional, so reusing the tower's outputs per patch is not exact, and the tower is "
                             "not where the prefill's time goes")
        text_config = policy.modules.text_config
        patch = policy.modules.patch_size
        size, n_tokens = policy.config.image_size, policy.config.n_image_tokens
        if patch <= 0 or size % patch or (size // patch) ** 2 != n_tokens:
            raise ValueError(f"{policy.source}: incremental prefill maps each image token to one patch, but the model "
                             f"makes {n_tokens} image tokens from a {size} px image with {patch} px patches")
        attention = text_config._attn_implementation
        if attention not in MASKED_ATTENTION:
            raise ValueError(f"{policy.source}: incremental prefill needs {' or '.join(MASKED_ATTENTION)} attention "
                             f"(it passes its own 4D mask), the model uses {attention!r}")
        layer_types = getattr(text_config, "layer_types", None) or ()
        if getattr(text_config, "sliding_window", None) is not None or any(t != "full_attention" for t in layer_types):
            raise ValueError(f"{policy.source}: incremental prefill needs full attention in every text layer")
        if config.reuse_tower and policy.direct is None:
            raise ValueError(f"{policy.source}: reusing the vision tower's keys and values (reuse_tower) needs the "
                             f"direct forward, which this model does not run ({policy.info['forward']})")
        self.policy = policy
        self.config = config
        self.patch_size = patch
        self.grid = size // patch  # patches per side, row-major as the tower's patch embedding flattens them
        self.reset()

    def reset(self) -> None:
        """Forget the cache: the next frame is a full prefill."""
        self._reference: torch.Tensor | None = None  # (1, 3, S, S): the pixels behind each cached token
        self._instruction: str | None = None
        self._state: _PrefixState | None = None
        self._image_positions = torch.zeros(0, dtype=torch.long)  # prompt positions of the image tokens
        self._text_positions = torch.zeros(0, dtype=torch.long)  # non-image positions from the first image token on
        self._dynamic = torch.zeros(0, dtype=torch.long)
        self._since_refresh = 0
        self.last: ReuseStats | None = None
        self._tower: TowerCache | None = None  # reuse_tower: the tower's keys, values and features
        self._tower_reference: torch.Tensor | None = None  # reuse_tower: the pixels behind them
        self._tower_since_refresh = 0
        self.last_tower: ReuseStats | None = None  # reuse_tower: the patches the tower ran on in the last frame

    @property
    def recomputed_tokens(self) -> torch.Tensor:
        """Indices among the image tokens (row-major patches) of those the last frame recomputed."""
        return self._dynamic

    def prefill(self, obs: Observation) -> Prefix:
        """``HFTokenVLA.prefill`` of one observation, reusing what the previous frames computed."""
        return self.prefill_batch([obs]).prefix

    def prefill_batch(self, observations: Sequence[Observation], tokens: torch.Tensor | None = None) -> ScoreOutput:
        """``HFTokenVLA.prefill_batch`` of one observation: the action tokens (1, k), if any, ride along
        with the recomputed ones."""
        if len(observations) != 1:
            raise ValueError(f"incremental prefill takes one frame at a time, got {len(observations)}")
        with torch.inference_mode():
            checked = None if tokens is None else self.policy.check_tokens(tokens)
            slot, action_hidden = self._frame(observations[0], checked)
            prefix = self._prefix(slot, action_hidden, checked)
            return ScoreOutput(self.policy.action_logits(prefix.action_hidden), prefix)

    # --- one frame ----------------------------------------------------------------------------
    def _frame(self, obs: Observation, tokens: torch.Tensor | None) -> tuple[CacheSlot, torch.Tensor]:
        """This frame's pass: the shared cache and the action tokens' final hidden states (1, k, d)."""
        policy = self.policy
        ids = policy.prompt_ids(obs.instruction, obs.proprio)
        resized = policy.resized_image(obs.image).contiguous()  # viewed patch by patch below
        features = None
        if self.config.reuse_tower:
            features = self._tower_features(resized, obs.instruction)
        elif self.config.feature_threshold > 0:  # the feature rule reads this frame's features first
            features = policy.image_features(policy.normalised_pixels(resized))
        if features is not None and self.config.feature_threshold > 0:
            dynamic = self._dynamic_by_features(features, obs.instruction)
        else:
            dynamic = self._dynamic_tokens(resized, obs.instruction)
        if dynamic is None:
            return self._full(obs, ids, tokens, features)
        return self._recompute(ids, resized, dynamic.to(policy.device), tokens, features)

    def _full(self, obs: Observation, ids: torch.Tensor, tokens: torch.Tensor | None,
              features: torch.Tensor | None = None) -> tuple[CacheSlot, torch.Tensor]:
        """The full prefill, kept as the state later frames reuse."""
        device, length = self.policy.device, ids.shape[1]
        hidden, slot = self.policy.prompt_pass(obs, tokens, features)
        is_image = ids[0] == self.policy.image_token_id
        positions = torch.arange(length, device=device)
        self._image_positions = positions[is_image]
        self._text_positions = positions[~is_image & (positions >= self._image_positions[0])]
        # the fast path's pooled cache is claimed again by later prefills: its prompt rows are copied
        layers = (slot.cache.held_layers() if isinstance(slot.cache, StaticKVCache)
                  else [(layer.keys, layer.values) for layer in slot.cache.layers])
        self._state = _PrefixState(layers=layers, row_positions=positions, hidden=hidden[:, :length],
                                   features=features)
        return slot, hidden[:, length:]

    def _recompute(self, ids: torch.Tensor, resized: torch.Tensor, dynamic: torch.Tensor,
                   tokens: torch.Tensor | None, features: torch.Tensor | None = None) -> tuple[CacheSlot, torch.Tensor]:
        """The text model over the dynamic image tokens, the text after the image and the action
        tokens, attending to the cached keys and values of the others. ``features``: this frame's
        image features when the caller has them already."""
        policy, state = self.policy, self._state
        assert state is not None
        device, length = policy.device, ids.shape[1]
        recomputed = torch.cat([self._image_positions[dynamic], self._text_positions])
        inputs = [policy.embed_ids(ids[:, self._text_positions])]
        if len(dynamic):
            if features is None:
                features = policy.image_features(policy.normalised_pixels(resized))
            inputs.insert(0, features[:, dynamic].to(inputs[0].dtype))
        positions = recomputed
        if tokens is not None and tokens.shape[1]:
            inputs.append(policy.embed_ids(policy.hf_action_ids(tokens)))
            positions = torch.cat([recomputed, torch.arange(length, length + tokens.shape[1], device=device)])
        reused = torch.ones(length, dtype=torch.bool, device=device)
        reused[recomputed] = False
        static = torch.nonzero(reused).squeeze(1)
        cache = policy.new_cache()
        rows = state.rows_of(static)
        for index, (keys, values) in enumerate(state.layers):
            cache.update(keys.index_select(-2, rows), values.index_select(-2, rows), index)
        # Each recomputed token sees every key at or before its true position, cached or recomputed.
        key_positions = torch.cat([static, positions])
        blocked = key_positions[None, :] > positions[:, None]
        mask = torch.zeros(blocked.shape, dtype=policy.dtype, device=device).masked_fill_(
            blocked, torch.finfo(policy.dtype).min)
        hidden = policy.forward_embeddings(torch.cat(inputs, dim=1), cache, positions[None], mask[None, None])
        n_prefix = len(recomputed)
        reference = state.features
        if reference is not None and features is not None and len(dynamic):
            reference = reference.index_copy(1, dynamic, features[:, dynamic])
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        self._state = _PrefixState(layers=layers, row_positions=torch.cat([static, recomputed]),
                                   hidden=state.hidden.index_copy(1, recomputed, hidden[:, :n_prefix]),
                                   features=reference)
        return CacheSlot(cache, [] if tokens is None else tokens[0].tolist()), hidden[:, n_prefix:]

    def _prefix(self, slot: CacheSlot, action_hidden: torch.Tensor, tokens: torch.Tensor | None) -> Prefix:
        """The prefix this frame made: the prompt's last hidden state, then the action tokens' (1, k, d)."""
        assert self._state is not None
        hidden = self._state.hidden
        if tokens is None:
            tokens = torch.empty(1, 0, dtype=torch.long, device=self.policy.device)
        return Prefix(cache=slot, action_hidden=torch.cat([hidden[:, -1:], action_hidden], dim=1), tokens=tokens,
                        pooled=hidden.float().mean(dim=1), prefix_len=hidden.shape[1])

    # --- which tokens changed -----------------------------------------------------------------
    def _dynamic_tokens(self, resized: torch.Tensor, instruction: str) -> torch.Tensor | None:
        """The image tokens (row-major patches) this frame recomputes; None for a full prefill.
        Updates the reference pixels and ``last``."""
        n_tokens = self.policy.config.n_image_tokens
        reason = self._refresh_reason(instruction)
        if not reason:
            assert self._reference is not None
            change = self._patch_change(resized, self._reference)
            n_values = resized.numel() // n_tokens
            # thresholds scaled to sums rather than sums divided down to means
            is_dynamic = change > self.config.threshold * n_values
            if self.config.threshold == 0 and bool(is_dynamic.any()):
                is_dynamic[:] = True  # exact: with a bidirectional tower any change moves every feature
            dynamic = torch.nonzero(is_dynamic).squeeze(1)
            n_static = n_tokens - len(dynamic)
            static_change = float(change.masked_fill(is_dynamic, 0).sum())
            if n_static and static_change > self.config.max_drift * n_values * n_static:
                reason = "drift"
        if reason:
            self._reference = resized
            return self._record(None, instruction, reason)
        if len(dynamic):  # the dynamic patches' pixels become their reference
            self._reference = self._with_patches(self._reference, resized, is_dynamic)
        return self._record(dynamic, instruction)

    def _tower_features(self, resized: torch.Tensor, instruction: str) -> torch.Tensor:
        """reuse_tower: this frame's image features (1, P, d). The tower runs on every patch when
        the prefill is full and every ``tower_refresh_steps`` frames, else only on the patches whose
        pixels moved by more than ``tower_threshold`` from those behind their cached keys and values.
        Updates ``last_tower``."""
        direct, n_tokens = self.policy.direct, self.policy.config.n_image_tokens
        assert direct is not None  # checked at construction
        reason = self._refresh_reason(instruction)
        if not reason and self._tower_since_refresh >= self.config.tower_refresh_steps:
            reason = "tower timer"
        if reason or self._tower is None or self._tower_reference is None:
            self._tower = direct.tower_pass(self.policy.normalised_pixels(resized))
            self._tower_reference, self._tower_since_refresh = resized, 1
            self.last_tower = ReuseStats(n_tokens, n_tokens, True, reason or "first frame")
            return self._tower.features
        n_values = resized.numel() // n_tokens
        moved = self._patch_change(resized, self._tower_reference) > self.config.tower_threshold * n_values
        rows = torch.nonzero(moved).squeeze(1)
        if len(rows):
            self._tower = direct.tower_pass(self.policy.normalised_pixels(resized), rows.to(self.policy.device),
                                            self._tower)
            self._tower_reference = self._with_patches(self._tower_reference, resized, moved)
        self._tower_since_refresh += 1
        self.last_tower = ReuseStats(len(rows), n_tokens, False)
        return self._tower.features

    def _dynamic_by_features(self, features: torch.Tensor, instruction: str) -> torch.Tensor | None:
        """The feature rule: the image tokens whose features (1, P, d) moved by more than
        ``feature_threshold`` (relative) from those behind their cached keys and values; None for a
        full prefill. No drift rule: the threshold bounds every reused token's own change. Updates
        ``last``."""
        reason = self._refresh_reason(instruction)
        if reason:
            return self._record(None, instruction, reason)
        state = self._state
        assert state is not None and state.features is not None  # a full prefill under this rule keeps them
        reference = state.features.float()
        change = (features.float() - reference).norm(dim=-1)[0]  # (P,)
        is_dynamic = change > self.config.feature_threshold * reference.norm(dim=-1)[0]
        return self._record(torch.nonzero(is_dynamic).squeeze(1), instruction)

    def _record(self, dynamic: torch.Tensor | None, instruction: str, reason: str = "") -> torch.Tensor | None:
        """Keep what this frame recomputes (``dynamic``; None for a full prefill, for ``reason``) in
        ``last`` and the refresh count; returns ``dynamic``."""
        n_tokens = self.policy.config.n_image_tokens
        if dynamic is None:
            self._instruction = instruction
            self._dynamic = torch.arange(n_tokens)
            self._since_refresh = 1
            self.last = ReuseStats(n_tokens, n_tokens, True, reason)
        else:
            self._dynamic = dynamic
            self._since_refresh += 1
            self.last = ReuseStats(len(dynamic), n_tokens, False)
        return dynamic

    def _patch_change(self, resized: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """(P,) the sum of the absolute pixel differences in each patch."""
        return self._per_patch(resized - reference).abs_().sum(dim=(0, 2, 4)).flatten()

    def _with_patches(self, reference: torch.Tensor, resized: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """``reference`` (1, 3, S, S) with the pixels of the ``chosen`` patches (P,) bool from ``resized``."""
        grid = chosen.view(1, self.grid, 1, self.grid, 1)
        return torch.where(grid, self._per_patch(resized), self._per_patch(reference)).view_as(resized)

    def _per_patch(self, pixels: torch.Tensor) -> torch.Tensor:
        """(1, 3, S, S) -> a view (channel, patch row, row in patch, patch column, column in patch)."""
        g, p = self.grid, self.patch_size
        return pixels.view(3, g, p, g, p)

    def _refresh_reason(self, instruction: str) -> str:
        """Why this frame must be a full prefill ('' when the cache may serve it)."""
        return self.config.refresh_reason(cached=self._state is not None,
                                          instruction_changed=instruction != self._instruction,
                                          since_refresh=self._since_refresh)
