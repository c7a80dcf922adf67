"""A pass replayed as a CUDA graph, recorded once per input shape (:class:`CudaGraphs`).

On a GPU a pass of a small batch is bound by kernel launches or by reading the weights, not by
arithmetic: a graph records the kernels of a whole pass once and replays them with one launch.
Each call copies its inputs into the graph's static inputs, replays, and hands back what
``copy_out`` makes of the graph's output (which the next replay overwrites). Tensors the pass
mutates in place (a preallocated KV cache) keep their addresses, so the graph writes to them.

A recorded pass must launch the same kernels whatever the values: it creates no tensor from host
data while it runs and reads no value back. A pass that cannot be recorded (a library op that
reads a value back) runs eagerly from then on, and ``error`` says why. The LeRobot family
(:mod:`vla_accel_ros.models.lerobot.cuda_graph`) and the token VLAs
(:mod:`vla_accel_ros.models.token_vla.static`) record their passes with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

WARMUP_RUNS = 2  # before capture, on a side stream: kernel selection and the allocator settle


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # the static tensors each call copies its inputs into
    output: Any


class CudaGraphs:
    """``run(*tensors)`` replayed as a CUDA graph, one per input shape; ``copy_out`` copies the
    output, which the next replay overwrites. The first pass that cannot be recorded runs eagerly,
    and so does every later call; ``error`` says why."""

    def __init__(self, run: Callable[..., Any], copy_out: Callable[[Any], Any]) -> None:
        self._run = run
        self._copy_out = copy_out
        self._graphs: dict[tuple[Any, ...], _Graph] = {}
        self.error = ""  # why the pass runs eagerly ('' = it replays)

    def __len__(self) -> int:
        return len(self._graphs)

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.error:
            return self._run(*inputs)
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        graph = self._graphs.get(key)
        if graph is None:
            try:
                graph = self._graphs[key] = self._record([t.clone() for t in inputs])
            except RuntimeError as error:
                self.error = (str(error).strip().splitlines() or [type(error).__name__])[0]
                return self._run(*inputs)
        for static, tensor in zip(graph.inputs, inputs, strict=True):
            static.copy_(tensor)
        graph.graph.replay()
        return self._copy_out(graph.output)

    def _record(self, inputs: list[torch.Tensor]) -> _Graph:
        """The pass over ``inputs`` (static copies) recorded after warm-up runs on a side stream."""
        device = inputs[-1].device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._run(*inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self._run(*inputs)
        return _Graph(graph, inputs, output)
