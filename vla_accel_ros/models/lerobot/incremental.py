"""Incremental vision for SmolVLA, π0 and π0.5: the prefix's keys and values of image tokens whose
pixels did not change are reused from the frame that computed them; the changed (dynamic) image
tokens, the language (and SmolVLA's state token) are recomputed, attending to the cached keys and
values of the rest. π0.5's language carries the binned state and so changes with it: the language
rows are recomputed every frame anyway, and only a new instruction, not a new state, refreshes
the whole prefix.

The rules are the package's incremental prefill's (:class:`~vla_accel_ros.models.configuration.VisionReuseConfig`,
the node's ``vision_reuse*`` parameters): an image token is dynamic when the mean |change| (0..255)
of the pixels it covers, against the pixels behind its cached keys and values, exceeds
``threshold``; every token is recomputed on the first frame, when the instruction changes, every
``refresh_steps`` frames, and when the mean sub-threshold change of the cached tokens exceeds
``max_drift``. A camera with a dynamic token runs its vision tower (which attends over the whole
image) again; one without keeps its tokens. Reusing a static token's keys and values is an
approximation (they would move a little with what they attend to, π0.5's state among it); the
refresh rules bound how long that error lives. With every token dynamic the pass is the full
prefix, exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from vla_accel_ros.models.api import ReuseStats, ScoreOutput
from vla_accel_ros.models.configuration import VisionReuseConfig


class IncrementalPrefix:
    """A SmolVLA, π0 or π0.5 policy's prefixes over a stream of frames (batch 1), reusing
    unchanged image tokens (the module docstring); ``last`` says what the latest frame recomputed."""

    def __init__(self, policy: Any, config: VisionReuseConfig | None = None) -> None:
        self.policy = policy
        self.config = config or VisionReuseConfig()
        self.reset()

    def reset(self) -> None:
        """Forget the cache: the next frame is a full prefix."""
        self._reference: list[torch.Tensor] | None = None  # per camera, pixels (0..255) behind the cache
        self._instruction: str | None = None
        self._prefix: Any = None  # SmolVLA's PrefixKV, π0's and π0.5's PrefixCache
        self._since_refresh = 0
        self.last: ReuseStats | None = None

    def prefix(self, inputs: Any) -> Any:
        """The prefix of one observation's model inputs (``policy.inputs``), reusing what it can."""
        model = self.policy.model
        pixels = [(image[0] + 1.0) * 127.5 for image in inputs.images]  # (3, S, S) on 0..255
        side, cell = model.token_grid()
        n_tokens = side * side * len(pixels)
        reason = self._refresh_reason(inputs.instruction)
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
        device = inputs.state.device
        masks = [torch.ones(1, dtype=torch.bool, device=device) for _ in pixels]
        if reason:
            return self._full(inputs, pixels, n_tokens, reason)
        assert self._prefix is not None and self._reference is not None
        dynamic = [torch.nonzero(change > self.config.threshold).squeeze(1) for change in changes]
        self._prefix = self._partial(inputs, dynamic, masks, n_tokens)
        if self._prefix is None:  # the full prefix was cheaper: a refresh
            return self._full(inputs, pixels, n_tokens, self.cheaper_in_full)
        for camera, rows in enumerate(dynamic):
            if len(rows):
                self._reference[camera] = self._reference[camera].clone()
                self._patch_reference(camera, rows, pixels[camera], side, cell)
        self._since_refresh += 1
        self.last = ReuseStats(int(sum(len(rows) for rows in dynamic)), n_tokens, False)
        return self._prefix

    cheaper_in_full = "full prefix cheaper"  # the refresh reason when a cost table chose the full prefix

    def _full(self, inputs: Any, pixels: list[torch.Tensor], n_tokens: int, reason: str) -> Any:
        """Every token recomputed (the policy's full prefix: a CUDA graph on a GPU); the frame's
        pixels become the reference."""
        self._prefix = self.policy.prefix(inputs)
        self._reference = pixels
        self._instruction = inputs.instruction
        self._since_refresh = 1
        self.last = ReuseStats(n_tokens, n_tokens, True, reason)
        return self._prefix

    def _partial(self, inputs: Any, dynamic: list[torch.Tensor], masks: list[torch.Tensor], n_tokens: int) -> Any:
        """The prefix with the ``dynamic`` image tokens (per camera, indices into its tokens), the
        language and SmolVLA's state recomputed, every other row's keys and values reused (None:
        the full prefix is to be computed instead, which this pass never asks for)."""
        model = self.policy.model
        device = inputs.state.device
        per_camera = n_tokens // len(inputs.images)
        tokens, dynamic_rows = [], []
        for camera, (image, rows) in enumerate(zip(inputs.images, dynamic, strict=True)):
            if len(rows):
                tokens.append(model.embed_images([image])[0])
                dynamic_rows.append(rows + camera * per_camera)
            else:  # no token of this camera moved: its embeddings never reach the recomputed rows
                tokens.append(torch.zeros(1, per_camera, model.image_token_width, dtype=model.image_token_dtype,
                                          device=device))
        emb, *masks_of_prefix = model.embed_inputs(tokens, masks, inputs.lang_tokens, inputs.lang_masks, inputs.state)
        rest = torch.arange(n_tokens, emb.shape[1], device=device)  # the language (and the state): always recomputed
        rows = torch.cat([*dynamic_rows, rest])
        return model.run_prefix_rows(rows, emb[:, rows], *masks_of_prefix, self._prefix)

    def _patch_reference(self, camera: int, dynamic: torch.Tensor, now: torch.Tensor, side: int, cell: int) -> None:
        """The dynamic tokens' pixels become their reference."""
        reference = self._reference
        assert reference is not None
        for token in dynamic.tolist():
            r, c = divmod(token, side)
            block = (slice(None), slice(r * cell, (r + 1) * cell), slice(c * cell, (c + 1) * cell))
            reference[camera][block] = now[block]

    def _refresh_reason(self, instruction: str) -> str:
        return self.config.refresh_reason(cached=self._prefix is not None,
                                          instruction_changed=instruction != self._instruction,
                                          since_refresh=self._since_refresh)


class RuntimePrefill:
    """:class:`IncrementalPrefix` as the runtime's :class:`~vla_accel_ros.models.api.IncrementalPrefill`:
    ``prefill_batch`` of one observation gives the policy's flow prefix (no action tokens to score)."""

    def __init__(self, policy: Any, incremental: IncrementalPrefix) -> None:
        self.policy = policy
        self.incremental = incremental

    @property
    def last(self) -> ReuseStats | None:
        return self.incremental.last

    def reset(self) -> None:
        self.incremental.reset()

    def prefill_batch(self, observations: Any, tokens: torch.Tensor | None = None) -> ScoreOutput:
        if len(observations) != 1 or tokens is not None:
            raise ValueError("a flow policy's incremental prefill takes one observation and no action tokens")
        prefix = self.policy.prefill(observations[0], self.incremental)
        return ScoreOutput(torch.zeros(1, 0, 0), prefix)
