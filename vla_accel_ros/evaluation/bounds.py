"""How fast a pass can be on this device, and how fast it is: the physical bounds measured in the
run that times the passes, what one pass does (its FLOPs and the weight bytes it reads), and the
timer of a pass.

- The copy bandwidth: a large device-to-device tensor copy (1 GiB on a GPU, 128 MiB on the CPU),
  counted as the bytes read plus the bytes written per second.
- The matrix-product rate: a large square matmul (8192 on a GPU, 1024 on the CPU) in bfloat16,
  2 n^3 FLOPs per product; on a CPU without bfloat16 instructions (AVX512-BF16, AMX) in float32,
  which such a CPU runs faster (the ``matmul_dtype`` says which).
- A pass's work (:func:`pass_work`): its FLOPs as torch's ``FlopCounterMode`` counts them (matrix
  products and attention), and the bytes of the parameters its operators read (an embedding table
  counts as the rows it reads, not the whole table).
- A pass's bound: the larger of its weight bytes over the bandwidth (what a 1-token step is held to)
  and its FLOPs over the rate (what a prefill is held to), the roofline of the two.
- The timer (:func:`time_pass`): ``warmup`` runs, then ``repeats`` timed ones; on a GPU each between
  two CUDA events (device time), with the peak of ``torch.cuda.max_memory_allocated`` over them; on
  the CPU the process's CPU time (all its threads: with one torch thread, the pass's cost on one
  core, whatever else the machine runs), with the process's peak RSS after them.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

GPU_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 128 << 20
GPU_MATMUL_SIDE = 8192
CPU_MATMUL_SIDE = 1024
# CPU flags (/proc/cpuinfo) under which a bfloat16 matmul runs at least at float32's rate
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# operators whose weight argument is read by rows (the rows' bytes count, not the table's)
ROW_READS = {torch.ops.aten.embedding.default, torch.ops.aten.index_select.default, torch.ops.aten.index.Tensor}


@dataclass(frozen=True)
class Timing:
    """``repeats`` timed runs of a pass: their median, min and max in ms, and the peak memory (MiB)."""

    median_ms: float
    min_ms: float
    max_ms: float
    peak_memory_mb: float

    def scaled(self, fixed: Timing | None, factor: float) -> Timing:
        """This timing with its part beyond ``fixed`` (a sub-pass measured whole, its median taken
        from each of the median, min and max) times ``factor``."""
        base = fixed.median_ms if fixed is not None else 0.0
        return Timing(base + (self.median_ms - base) * factor, base + (self.min_ms - base) * factor,
                      base + (self.max_ms - base) * factor, self.peak_memory_mb)


@dataclass(frozen=True)
class Work:
    """What one pass does: FLOPs, and the bytes of the weights it reads."""

    flops: float
    weight_bytes: float

    def scaled(self, fixed: Work | None, factor: float) -> Work:
        flops = fixed.flops if fixed is not None else 0.0
        weights = fixed.weight_bytes if fixed is not None else 0.0
        return Work(flops + (self.flops - flops) * factor, weights + (self.weight_bytes - weights) * factor)


@dataclass(frozen=True)
class Bounds:
    """The device's measured copy bandwidth (GB/s, read + written) and matmul rate (TFLOP/s)."""

    copy_gb_s: float
    matmul_tflop_s: float
    matmul_dtype: str

    def bound_ms(self, work: Work) -> tuple[float, str]:
        """The pass's bound in ms and which term sets it ("bandwidth" or "compute")."""
        bandwidth = work.weight_bytes / (self.copy_gb_s * 1e9) * 1e3
        compute = work.flops / (self.matmul_tflop_s * 1e12) * 1e3
        return (bandwidth, "bandwidth") if bandwidth >= compute else (compute, "compute")


def cpu_has_fast_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bfloat16 matrix instructions (AVX512-BF16 or AMX)."""
    try:
        flags = cpuinfo.read_text().split()
    except OSError:
        return False
    return any(flag in flags for flag in CPU_BF16_FLAGS)


def peak_memory_mb(device: torch.device) -> float:
    """Peak device memory so far: CUDA's max allocated since the last reset, or the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def time_pass(run: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> Timing:
    """``run`` timed as the module docstring says."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for _ in range(warmup):
        run()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            begin = time.process_time()
            run()
            times.append((time.process_time() - begin) * 1e3)
    return Timing(statistics.median(times), min(times), max(times), peak_memory_mb(device))


class _WeightReads(TorchDispatchMode):
    """Sums the bytes of the weights the operators read (each storage once per pass; rows for an
    embedding-style lookup)."""

    def __init__(self, weights: dict[int, int]) -> None:
        super().__init__()
        self.weights = weights  # storage address -> its bytes
        self.seen: set[int] = set()
        self.bytes = 0.0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves, _ = tree_flatten((args, kwargs))
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor) or leaf.device.type == "meta":
                continue
            address = leaf.untyped_storage().data_ptr()
            if address not in self.weights:
                continue
            if func in ROW_READS and index == 0 and isinstance(out, torch.Tensor):  # a table: the rows read
                self.bytes += out.numel() * leaf.element_size()
            elif address not in self.seen:
                self.seen.add(address)
                self.bytes += self.weights[address]
        return out


def pass_work(run: Callable[[], Any], modules: list[torch.nn.Module]) -> Work:
    """One run of ``run`` counted: its FLOPs and the bytes it reads of ``modules``' parameters and buffers."""
    weights: dict[int, int] = {}
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            storage = tensor.untyped_storage()
            weights[storage.data_ptr()] = storage.nbytes()
    counter = FlopCounterMode(display=False)
    reads = _WeightReads(weights)
    with counter, reads:
        run()
    return Work(float(counter.get_total_flops()), reads.bytes)


def measure_bounds(device: torch.device, repeats: int) -> Bounds:
    """The copy bandwidth and the matmul rate of ``device`` (module docstring), each from the fastest
    of ``repeats`` runs (at least 3) after a warm-up, on the same clock as the passes: a bound is
    what the device can do, which a run slowed by other work on the machine does not show."""
    runs = max(3, repeats)
    gpu = device.type == "cuda"
    n_bytes = GPU_COPY_BYTES if gpu else CPU_COPY_BYTES
    source = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    copy = time_pass(lambda: target.copy_(source), device, runs)
    dtype = torch.bfloat16 if gpu or cpu_has_fast_bf16() else torch.float32
    side = GPU_MATMUL_SIDE if gpu else CPU_MATMUL_SIDE
    a = torch.randn(side, side, device=device, dtype=dtype)
    b = torch.randn(side, side, device=device, dtype=dtype)
    product = time_pass(lambda: torch.mm(a, b), device, runs)
    return Bounds(copy_gb_s=2 * n_bytes / (copy.min_ms * 1e-3) / 1e9,
                  matmul_tflop_s=2 * side**3 / (product.min_ms * 1e-3) / 1e12,
                  matmul_dtype=str(dtype).removeprefix("torch."))
