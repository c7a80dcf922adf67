"""A LeRobot policy's prefix and flow sampler on a GPU, each replayed as one CUDA graph.

On a GPU a flow step is bound by kernel launches, not arithmetic: the expert runs a few hundred
small kernels over 50 action tokens (an eager step of SmolVLA or π0 took 14-27 ms on an H200,
``vla-accel cost --device cuda``). A CUDA graph records the kernels of a whole sampler
(every Euler step, or a fitted student's two) once per input shape and replays them with one
launch. Each call copies its prefix's keys and values, the state and the noise into the graph's
static inputs, replays, and returns a copy of the graph's output. The full prefix (towers and VLM
over a new frame) is recorded the same way, from the pixels, the state and the tokens; so are
real-time chunking's guided sampler (in its static-shape form, per steps and student) and bucketed
incremental vision's towers and rows passes (:mod:`.buckets`: the changed rows padded to a few
fixed sizes, one graph per bucket).

A recorded pass must launch the same kernels whatever the values: it creates no tensor from host
data while it runs (the flow times and the block marks are device fills) and reads no value back.
Its inputs are flat tensors: the sampler rebuilds its prefix from them on every run, since π0's
key/value cache appends a step's keys and values and crops them again.
The recorder is :class:`vla_accel_ros.models.cuda_graph.CudaGraphs` (re-exported here); a pass that
cannot be recorded runs eagerly from then on, and its ``error`` says why.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from vla_accel_ros.models.cuda_graph import CudaGraphs

__all__ = ["CudaGraphs", "clone_prefix", "prefix_tensors", "with_tensors"]


def prefix_tensors(prefix: Any) -> list[torch.Tensor]:
    """What a flow step reads of a SmolVLA, π0 or π0.5 prefix: every layer's keys and values, the
    validity mask and the count of valid tokens."""
    if hasattr(prefix, "keys"):  # SmolVLA's PrefixKV
        layers = [*prefix.keys, *prefix.values]
    else:  # π0's and π0.5's PrefixCache (a transformers DynamicCache)
        layers = [t for layer in prefix.cache.layers for t in (layer.keys, layer.values)]
    return [*layers, prefix.pad_masks, prefix.n_valid]


def with_tensors(prefix: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """A prefix shaped like ``prefix`` holding ``tensors`` (in :func:`prefix_tensors`' order)."""
    *layers, pad_masks, n_valid = tensors
    if hasattr(prefix, "keys"):
        half = len(layers) // 2
        return replace(prefix, keys=tuple(layers[:half]), values=tuple(layers[half:]), pad_masks=pad_masks,
                       n_valid=n_valid, last_input=None)
    cache = copy.copy(prefix.cache)
    cache.layers = []
    for index, layer in enumerate(prefix.cache.layers):
        twin = copy.copy(layer)
        twin.keys, twin.values = layers[2 * index], layers[2 * index + 1]
        cache.layers.append(twin)
    return replace(prefix, cache=cache, pad_masks=pad_masks, n_valid=n_valid)


def clone_prefix(prefix: Any) -> Any:
    """A SmolVLA, π0 or π0.5 prefix whose tensors are copies."""
    return with_tensors(prefix, [t.clone() for t in prefix_tensors(prefix)])
