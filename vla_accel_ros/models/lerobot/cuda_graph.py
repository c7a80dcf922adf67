"""A LeRobot policy's flow sampler on a GPU, replayed as one CUDA graph.

On a GPU a flow step is bound by kernel launches, not arithmetic: the expert runs a few hundred
small kernels over 50 action tokens (SmolVLA's eager step took 26.5 ms on an H200, π0's 13.8 ms:
``vla-accel lerobot-cost --device cuda``). A CUDA graph records the kernels of a whole sampler
(every Euler step, or a fitted student's two) once per input shape and replays them with one
launch. Each call copies its prefix's keys and values, the state and the noise into the graph's
static inputs, replays, and returns a copy of the graph's output.

The sampler must launch the same kernels whatever the values: it creates no tensor from host
data while it runs (the flow times are device fills) and reads no value back. π0's key/value
cache appends a step's keys and values and crops them again, so after warm-up its layers point
elsewhere than before: the graph's inputs are the tensors the cache holds when capture begins.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

Sampler = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]  # (prefix, state, noise) -> sample
WARMUP_RUNS = 2  # before capture, on a side stream: kernel selection and the allocator settle


def prefix_tensors(prefix: Any) -> list[torch.Tensor]:
    """What a flow step reads of a SmolVLA or π0 prefix: every layer's keys and values, the
    validity mask and the count of valid tokens."""
    if hasattr(prefix, "keys"):  # SmolVLA's PrefixKV
        layers = [*prefix.keys, *prefix.values]
    else:  # π0's PrefixCache (a transformers DynamicCache)
        layers = [t for layer in prefix.cache.layers for t in (layer.keys, layer.values)]
    return [*layers, prefix.pad_masks, prefix.n_valid]


def clone_prefix(prefix: Any) -> Any:
    """A SmolVLA or π0 prefix whose tensors are copies (a graph's static inputs)."""
    if hasattr(prefix, "keys"):
        return replace(prefix, keys=tuple(k.clone() for k in prefix.keys),
                       values=tuple(v.clone() for v in prefix.values), pad_masks=prefix.pad_masks.clone(),
                       n_valid=prefix.n_valid.clone(), last_input=None)
    cache = copy.copy(prefix.cache)
    cache.layers = []
    for layer in prefix.cache.layers:
        twin = copy.copy(layer)
        twin.keys, twin.values = layer.keys.clone(), layer.values.clone()
        cache.layers.append(twin)
    return replace(prefix, cache=cache, pad_masks=prefix.pad_masks.clone(), n_valid=prefix.n_valid.clone())


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # prefix tensors, then the state and the noise
    output: torch.Tensor


class GraphedSampler:
    """``sampler(prefix, state, noise)`` replayed as a CUDA graph, one per input shape."""

    def __init__(self, sampler: Sampler) -> None:
        self._sampler = sampler
        self._graphs: dict[tuple[Any, ...], _Graph] = {}

    def __len__(self) -> int:
        return len(self._graphs)

    def __call__(self, prefix: Any, state: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        inputs = [*prefix_tensors(prefix), state, noise]
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._capture(prefix, state, noise)
        for static, tensor in zip(graph.inputs, inputs, strict=True):
            static.copy_(tensor)
        graph.graph.replay()
        return graph.output.clone()

    def _capture(self, prefix: Any, state: torch.Tensor, noise: torch.Tensor) -> _Graph:
        device = noise.device
        static_prefix, static_state, static_noise = clone_prefix(prefix), state.clone(), noise.clone()
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._sampler(static_prefix, static_state, static_noise)
        torch.cuda.current_stream(device).wait_stream(side)
        inputs = [*prefix_tensors(static_prefix), static_state, static_noise]  # what the capture reads
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self._sampler(static_prefix, static_state, static_noise)
        return _Graph(graph, inputs, output)
