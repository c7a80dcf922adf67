"""Incremental vision for SmolVLA: the prefix's keys and values of image tokens whose pixels did
not change are reused from the frame that computed them; the changed (dynamic) image tokens, the
language and the state are recomputed, attending to the cached keys and values of the rest.

The rules are the package's incremental prefill's (:class:`~vla_accel_ros.models.configuration.VisionReuseConfig`,
the node's ``vision_reuse*`` parameters): an image token is dynamic when the mean |change| (0..255)
of the pixels it covers, against the pixels behind its cached keys and values, exceeds
``threshold``; every token is recomputed on the first frame, when the instruction changes, every
``refresh_steps`` frames, and when the mean sub-threshold change of the cached tokens exceeds
``max_drift``. A camera with a dynamic token runs its vision tower (which attends over the whole
image) again; one without keeps its tokens. Reusing a static token's keys and values is an
approximation (they would move a little with what they attend to); the refresh rules bound how
long that error lives. With every token dynamic the pass is the full prefix, exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from vla_accel_ros.models.api import ReuseStats
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.lerobot.smolvla import PrefixKV


class IncrementalPrefix:
    """A SmolVLA policy's prefixes over a stream of frames (batch 1), reusing unchanged image tokens
    (the module docstring); ``last`` says what the latest frame recomputed."""

    def __init__(self, policy: Any, config: VisionReuseConfig | None = None) -> None:
        if policy.config.type != "smolvla":
            raise ValueError(f"{policy.config.path}: incremental vision is implemented for SmolVLA, not "
                             f"{policy.config.type}")
        self.policy = policy
        self.config = config or VisionReuseConfig()
        self.reset()

    def reset(self) -> None:
        """Forget the cache: the next frame is a full prefix."""
        self._reference: list[torch.Tensor] | None = None  # per camera, pixels (0..255) behind the cache
        self._lang: torch.Tensor | None = None
        self._prefix: PrefixKV | None = None
        self._since_refresh = 0
        self.last: ReuseStats | None = None

    def prefix(self, inputs: Any) -> PrefixKV:
        """The prefix of one observation's model inputs (``policy.inputs``), reusing what it can."""
        model = self.policy.model
        pixels = [(image[0] + 1.0) * 127.5 for image in inputs.images]  # (3, S, S) on 0..255
        side, cell = model.token_grid()
        n_tokens = side * side * len(pixels)
        reason = self._refresh_reason(inputs.lang_tokens)
        changes: list[torch.Tensor] = []
        if not reason:
            assert self._reference is not None
            for now, before in zip(pixels, self._reference, strict=True):
                change = (now - before).abs().view(3, side, cell, side, cell).mean(dim=(0, 2, 4)).flatten()
                changes.append(change)
            change_all = torch.cat(changes)
            static = change_all <= self.config.threshold
            if static.any() and float(change_all[static].mean()) > self.config.max_drift:
                reason = "drift"
        masks = [torch.ones(1, dtype=torch.bool) for _ in pixels]
        if reason:
            tokens = model.embed_images(inputs.images)
            emb, pad, att = model.embed_prefix(tokens, masks, inputs.lang_tokens, inputs.lang_masks, inputs.state)
            self._prefix = model.run_prefix(emb, pad, att)
            self._reference = pixels
            self._lang = inputs.lang_tokens.clone()
            self._since_refresh = 1
            self.last = ReuseStats(n_tokens, n_tokens, True, reason)
            return self._prefix
        assert self._prefix is not None and self._reference is not None
        per_camera = side * side
        tokens, dynamic_rows = [], []
        for camera, (image, change) in enumerate(zip(inputs.images, changes, strict=True)):
            dynamic = torch.nonzero(change > self.config.threshold).squeeze(1)
            if len(dynamic):
                tokens.append(model.embed_images([image])[0])
                dynamic_rows.append(dynamic + camera * per_camera)
                self._reference[camera] = self._reference[camera].clone()
                self._patch_reference(camera, dynamic, pixels[camera], side, cell)
            else:  # no token of this camera moved: its embeddings never reach the recomputed rows
                tokens.append(torch.zeros(1, per_camera, model.vlm.text_model.config.hidden_size,
                                          dtype=inputs.state.dtype))
        emb, pad, att = model.embed_prefix(tokens, masks, inputs.lang_tokens, inputs.lang_masks, inputs.state)
        rest = torch.arange(n_tokens, emb.shape[1])  # the language and the state: always recomputed
        rows = torch.cat([*dynamic_rows, rest])
        self._prefix = model.run_prefix_rows(rows, emb[:, rows], pad, att, self._prefix)
        self._since_refresh += 1
        n_dynamic = int(sum(len(r) for r in dynamic_rows))
        self.last = ReuseStats(n_dynamic, n_tokens, False)
        return self._prefix

    def _patch_reference(self, camera: int, dynamic: torch.Tensor, now: torch.Tensor, side: int, cell: int) -> None:
        """The dynamic tokens' pixels become their reference."""
        reference = self._reference
        assert reference is not None
        for token in dynamic.tolist():
            r, c = divmod(token, side)
            block = (slice(None), slice(r * cell, (r + 1) * cell), slice(c * cell, (c + 1) * cell))
            reference[camera][block] = now[block]

    def _refresh_reason(self, lang_tokens: torch.Tensor) -> str:
        if self._prefix is None:
            return "first frame"
        if self._lang is None or not torch.equal(lang_tokens, self._lang):
            return "instruction changed"
        if self._since_refresh >= self.config.refresh_steps:
            return "timer"
        return ""
