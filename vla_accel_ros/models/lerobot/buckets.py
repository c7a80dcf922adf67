"""Bucketed incremental vision for SmolVLA, π0 and π0.5: the partial prefix at a few fixed shapes.

Incremental vision (:mod:`.incremental`) recomputes the changed image tokens, the language (and
SmolVLA's state token) over the cached keys and values of the rest. The number of changed tokens
differs from frame to frame, and so does the shape of that pass: on a GPU it cannot replay as a
CUDA graph, and eagerly it costs more than the full prefix replayed. Here the changed image rows
are padded up to the smallest of a few bucket sizes (:func:`bucket_sizes`: 0 and fractions of all
image tokens, by default 1/8, 1/4, 1/2 and all), so the pass has one shape per bucket:

- the towers of the cameras with a changed token run as one batch (one shape per camera count);
- the rows pass takes the bucket's image rows (the changed ones, then padding) and the language
  rows. A padding row is written to one extra key/value slot after the prefix, which is masked for
  every query and cut off afterwards; its own query attends to nothing valid and its output is
  discarded. The real rows' keys, values and attention are those of the unpadded pass.

On a GPU each tower batch and each bucket's rows pass is recorded once as a CUDA graph
(:class:`~vla_accel_ros.models.cuda_graph.CudaGraphs`) and replayed; on the CPU the same code runs
eagerly. Per frame, :func:`choose_prefix_pass` picks the bucketed partial pass or the full prefix
from a :class:`PrefixCosts` table of measured costs: the partial pass when its towers and rows pass
cost less than the full prefix, the full prefix when they do not, or when the changed tokens exceed
the largest bucket. Without a table the partial pass is taken whenever a bucket fits (the CPU's
case: eager rows are far cheaper than the full prefix there). On a GPU the table is measured on the
first frame, which records the graphs too (:meth:`BucketedIncrementalPrefix.measure_costs`). A frame
made in full is a refresh: its pixels become the reference, as on any refresh.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.cuda_graph import CudaGraphs
from vla_accel_ros.models.lerobot.cuda_graph import clone_prefix, prefix_tensors, with_tensors
from vla_accel_ros.models.lerobot.incremental import IncrementalPrefix
from vla_accel_ros.models.lerobot.smolvla import PrefixKV

DEFAULT_BUCKETS = (0.125, 0.25, 0.5, 1.0)  # fractions of all image tokens; 0 (an unchanged frame) is always one
COST_REPEATS = 3  # timed runs per pass when a GPU measures its table on the first frame


def bucket_sizes(n_image_tokens: int, fractions: Sequence[float] = DEFAULT_BUCKETS) -> tuple[int, ...]:
    """The bucket sizes (image rows) for ``n_image_tokens`` image tokens in all: 0 and each fraction's
    share, rounded up, ascending; ValueError for a fraction outside (0, 1]."""
    bad = [f for f in fractions if not 0.0 < f <= 1.0]
    if bad:
        raise ValueError(f"bucket fractions must lie in (0, 1], got {bad}")
    return tuple(sorted({0, *(math.ceil(f * n_image_tokens) for f in fractions)}))


@dataclass(frozen=True)
class PrefixCosts:
    """Measured costs (ms) of the prefix's passes: the full prefix, the towers of k cameras
    (``tower_ms[k]``) and each bucket's rows pass (``rows_ms[bucket]``)."""

    full_ms: float
    tower_ms: dict[int, float]
    rows_ms: dict[int, float]

    def partial_ms(self, bucket: int, cameras: int) -> float | None:
        """The partial pass's cost for ``bucket`` rows and ``cameras`` towers (None: not measured)."""
        rows = self.rows_ms.get(bucket)
        tower = 0.0 if cameras == 0 else self.tower_ms.get(cameras)
        return None if rows is None or tower is None else rows + tower


@dataclass(frozen=True)
class PrefixChoice:
    """How one frame's prefix is made: ``bucket`` rows in the partial pass, or None for the full
    prefix; ``reason`` says why."""

    bucket: int | None
    reason: str


def choose_prefix_pass(n_dynamic: int, cameras: int, sizes: Sequence[int], costs: PrefixCosts | None) -> PrefixChoice:
    """The pass for a frame with ``n_dynamic`` changed image tokens over ``cameras`` cameras: the
    smallest bucket of ``sizes`` that holds them, unless none does or ``costs`` prices that partial
    pass at or above the full prefix (then None: the full prefix). A partial pass the table does
    not price is taken, as without a table."""
    bucket = next((size for size in sorted(sizes) if size >= n_dynamic), None)
    if bucket is None:
        return PrefixChoice(None, f"{n_dynamic} changed tokens exceed the largest bucket ({max(sizes)})")
    partial = None if costs is None else costs.partial_ms(bucket, cameras)
    if costs is None or partial is None:
        return PrefixChoice(bucket, "no measured cost" if costs is not None else "no cost table")
    if partial >= costs.full_ms:
        return PrefixChoice(None, f"bucket {bucket}: {partial:.3g} ms >= full {costs.full_ms:.3g} ms")
    return PrefixChoice(bucket, f"bucket {bucket}: {partial:.3g} ms < full {costs.full_ms:.3g} ms")


def token_axis(prefix: Any) -> int:
    """The token axis of a prefix's keys and values: SmolVLA's (B, P, H, D), π0's (B, H, P, D)."""
    return 1 if isinstance(prefix, PrefixKV) else 2


def with_extra_slot(prefix: Any) -> Any:
    """``prefix`` with one more key/value slot after its tokens, zero and masked (pad False)."""
    *layers, pad_masks, n_valid = prefix_tensors(prefix)
    axis = token_axis(prefix)
    extended = [torch.cat([t, torch.zeros_like(t.narrow(axis, 0, 1))], dim=axis) for t in layers]
    pad = torch.cat([pad_masks, torch.zeros_like(pad_masks[:, :1])], dim=1)
    return with_tensors(prefix, [*extended, pad, n_valid])


def without_extra_slot(prefix: Any, length: int) -> Any:
    """``prefix`` cut back to its first ``length`` tokens (what :func:`with_extra_slot` added, gone)."""
    *layers, pad_masks, n_valid = prefix_tensors(prefix)
    axis = token_axis(prefix)
    return with_tensors(prefix, [*(t.narrow(axis, 0, length) for t in layers), pad_masks[:, :length], n_valid])


def bucket_rows(dynamic: Sequence[torch.Tensor], bucket: int, per_camera: int, length: int) -> torch.Tensor:
    """The prefix rows of a bucket's pass: the ``dynamic`` image tokens (per camera, indices into
    its ``per_camera`` tokens), then padding up to ``bucket`` image rows (the extra slot, row
    ``length``), then every row after the image tokens (the language, SmolVLA's state)."""
    device = dynamic[0].device
    padding = bucket - int(sum(len(rows) for rows in dynamic))
    if padding < 0:
        raise ValueError(f"{bucket - padding} changed image tokens do not fit a bucket of {bucket}")
    return torch.cat([*(rows + camera * per_camera for camera, rows in enumerate(dynamic)),
                      torch.full((padding,), length, dtype=torch.long, device=device),
                      torch.arange(len(dynamic) * per_camera, length, device=device)])


def first_rows(bucket: int, n_cameras: int, per_camera: int, device: torch.device) -> list[torch.Tensor]:
    """A bucket's worth of changed tokens, the first image rows in order (per camera, indices into
    its tokens): what a cost table times a bucket's pass on."""
    first = torch.arange(bucket, device=device)
    return [first[(first >= c * per_camera) & (first < (c + 1) * per_camera)] - c * per_camera
            for c in range(n_cameras)]


def padded_rows_pass(model: Any, n_cameras: int, shape: Any, image_rows: torch.Tensor, rows: torch.Tensor,
                     lang_tokens: torch.Tensor, lang_masks: torch.Tensor, state: torch.Tensor,
                     *cached: torch.Tensor) -> Any:
    """A bucket's rows pass from flat tensors (a CUDA graph records it once per bucket): the
    bucket's image rows' embeddings (1, bucket, width), the prefix rows they and the language take
    (:func:`bucket_rows`), the prompt and state, and the cached prefix's ``prefix_tensors`` (a prefix
    structured as ``shape``); the new prefix, the extra slot of the padding cut off."""
    prefix = with_tensors(shape, cached)
    length = prefix.length
    side, _ = model.token_grid()
    n_image = side * side * n_cameras
    ones = torch.ones(1, dtype=torch.bool, device=state.device)
    blank = torch.zeros(1, side * side, model.image_token_width, dtype=model.image_token_dtype, device=state.device)
    # the image rows come from image_rows: the embeddings' image part is never read
    emb, *masks = model.embed_inputs([blank] * n_cameras, [ones] * n_cameras, lang_tokens, lang_masks, state)
    emb_rows = torch.cat([image_rows.to(emb.dtype), emb[:, n_image:]], dim=1)
    extended = [torch.cat([m, torch.zeros_like(m[:, :1])], dim=1) for m in masks]
    out = model.run_prefix_rows(rows, emb_rows, *extended, with_extra_slot(prefix))
    return without_extra_slot(out, length)


def median_ms(run: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """The median ms of ``repeats`` runs after one untimed run (CUDA events on a GPU, wall time on the CPU)."""
    run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            begin = time.perf_counter()
            run()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


class BucketedIncrementalPrefix(IncrementalPrefix):
    """:class:`~.incremental.IncrementalPrefix` whose partial pass is padded to a bucket and chosen
    against the full prefix per frame (the module docstring). ``costs``: the table the choice reads
    (None: measured on the first frame on a GPU, none on the CPU); ``last_choice``: the latest
    frame's :class:`PrefixChoice` (None after a refresh the rules asked for)."""

    def __init__(self, policy: Any, config: VisionReuseConfig | None = None,
                 fractions: Sequence[float] = DEFAULT_BUCKETS, costs: PrefixCosts | None = None) -> None:
        self.fractions = tuple(fractions)
        bucket_sizes(1, self.fractions)  # a bad fraction refused before any frame
        self.costs = costs
        self.measure_on_first_frame = costs is None and policy.device.type == "cuda"
        graphs = policy.cuda_graphs
        self._towers = CudaGraphs(self._tower_pass, torch.Tensor.clone) if graphs else None
        self._rows = CudaGraphs(self._rows_pass, clone_prefix) if graphs else None
        self._shape: Any = None  # the first prefix: the structure the rows pass rebuilds from flat tensors
        self.last_choice: PrefixChoice | None = None
        super().__init__(policy, config)

    @property
    def graph_errors(self) -> list[str]:
        """Why a bucketed pass runs eagerly on a GPU (empty: none does)."""
        every = [("towers", self._towers), ("rows", self._rows)]
        return [f"bucketed {name}: {graphs.error}" for name, graphs in every if graphs is not None and graphs.error]

    @property
    def graph_shapes(self) -> int:
        """How many CUDA graphs the bucketed passes recorded (per camera count and per bucket)."""
        return sum(len(graphs) for graphs in (self._towers, self._rows) if graphs is not None)

    def sizes(self, n_image_tokens: int) -> tuple[int, ...]:
        return bucket_sizes(n_image_tokens, self.fractions)

    def prefix(self, inputs: Any) -> Any:
        self.last_choice = None
        prefix = super().prefix(inputs)
        if self.measure_on_first_frame:
            self.measure_on_first_frame = False
            self.costs = self.measure_costs(inputs)
        return prefix

    def _partial(self, inputs: Any, dynamic: list[torch.Tensor], masks: list[torch.Tensor], n_tokens: int) -> Any:
        cameras = [camera for camera, rows in enumerate(dynamic) if len(rows)]
        n_dynamic = int(sum(len(rows) for rows in dynamic))
        choice = choose_prefix_pass(n_dynamic, len(cameras), self.sizes(n_tokens), self.costs)
        self.last_choice = choice
        if choice.bucket is None:
            return None
        return self.bucket_pass(inputs, dynamic, choice.bucket)

    def bucket_pass(self, inputs: Any, dynamic: list[torch.Tensor], bucket: int) -> Any:
        """The partial prefix over the cached one with the ``dynamic`` image tokens (per camera)
        padded to ``bucket`` rows (module docstring)."""
        n_dynamic = int(sum(len(rows) for rows in dynamic))
        if n_dynamic > bucket:
            raise ValueError(f"{n_dynamic} changed image tokens do not fit a bucket of {bucket}")
        device = inputs.state.device
        per_camera = self.n_image_tokens(inputs) // len(inputs.images)
        cameras = [camera for camera, rows in enumerate(dynamic) if len(rows)]
        if cameras:
            pixels = torch.cat([inputs.images[camera] for camera in cameras])
            tokens = self._towers(pixels) if self._towers is not None else self._tower_pass(pixels)
            # each changed token's row in the towers' output, then padding rows reading the first
            source = torch.cat([dynamic[camera] + slot * per_camera for slot, camera in enumerate(cameras)]
                               + [torch.zeros(bucket - n_dynamic, dtype=torch.long, device=device)])
            image_rows = tokens.reshape(1, -1, tokens.shape[-1])[:, source]
        else:
            image_rows = self._blank_rows(bucket, device)
        return self.rows_pass(inputs, dynamic, image_rows)

    def rows_pass(self, inputs: Any, dynamic: list[torch.Tensor], image_rows: torch.Tensor) -> Any:
        """The rows pass of one bucket (a graph on a GPU): ``image_rows`` (1, bucket, width) the
        embeddings of the ``dynamic`` tokens' rows then of the padding."""
        cached = self._prefix
        assert cached is not None
        if self._shape is None:
            self._shape = cached
        rows = bucket_rows(dynamic, image_rows.shape[1], self.n_image_tokens(inputs) // len(inputs.images),
                           cached.length)
        flat = (image_rows, rows, inputs.lang_tokens, inputs.lang_masks, inputs.state, *prefix_tensors(cached))
        return self._rows(*flat) if self._rows is not None else self._rows_pass(*flat)

    def _blank_rows(self, bucket: int, device: torch.device) -> torch.Tensor:
        model = self.policy.model
        return torch.zeros(1, bucket, model.image_token_width, dtype=model.image_token_dtype, device=device)

    def n_image_tokens(self, inputs: Any) -> int:
        side, _ = self.policy.model.token_grid()
        return int(side * side * len(inputs.images))

    def _tower_pass(self, pixels: torch.Tensor) -> torch.Tensor:
        """The image tokens (k, N, width) of k cameras' pixels (k, 3, S, S), as one batch."""
        return self.policy.model.embed_images([pixels])[0]

    def _rows_pass(self, *flat: torch.Tensor) -> Any:
        return padded_rows_pass(self.policy.model, len(self.policy.config.camera_names), self._shape, *flat)

    def measure_costs(self, inputs: Any, repeats: int = COST_REPEATS) -> PrefixCosts:
        """The table of this policy's passes on ``inputs`` (a frame whose prefix is cached): the
        full prefix, the towers of 1..all cameras and each bucket's rows pass (its first rows
        taken as the changed ones), each the median of ``repeats`` runs after an untimed one; on a
        GPU each run a graph replay (the untimed run records it)."""
        policy = self.policy
        device = inputs.state.device
        n_cameras = len(inputs.images)
        n_image = self.n_image_tokens(inputs)
        per_camera = n_image // n_cameras
        towers = self._towers if self._towers is not None else self._tower_pass
        with torch.inference_mode():
            full = median_ms(lambda: policy.prefix(inputs), device, repeats)
            batches = {k: torch.cat(inputs.images[:k]) for k in range(1, n_cameras + 1)}
            tower = {k: median_ms(partial(towers, pixels), device, repeats) for k, pixels in batches.items()}
            rows = {}
            for bucket in self.sizes(n_image):
                dynamic = first_rows(bucket, n_cameras, per_camera, device)
                blank = self._blank_rows(bucket, device)
                rows[bucket] = median_ms(partial(self.rows_pass, inputs, dynamic, blank), device, repeats)
        return PrefixCosts(full, tower, rows)
