"""``vla-accel cost``: a family's passes at its published shape (random weights made on the device),
timed on this device, each beside its physical bound measured in the same run.

Per pass: the median and the spread (min-max) of the timed runs after warm-up (CUDA events on a GPU,
the process's CPU time on the CPU), the peak device memory (CUDA's max allocated; on the CPU the
process's peak RSS), and x bound: the median over the pass's bound, the larger of its weight bytes
over the measured copy bandwidth (a 1-token step) and its FLOPs over the measured matmul rate (a
prefill). With --layers N the text part of each pass is scaled from N layers to the real depth.
--passes-from reads the target passes per action that vla-accel eval measured for a decoder (its
summary.json; repeat the flag for several decoders) and gives the time per action they imply here.
For the flow families (smolvla, pi0, pi05) the table also holds the guided (real-time chunking)
sampler and bucketed incremental vision's partial prefix per bucket beside the full prefix, and on a
GPU their CUDA graph replays (:mod:`vla_accel_ros.evaluation.cost_passes`).
--json prints one JSON object (the table, the bounds, the device's name, torch's and CUDA's
versions and the command) and the table on stderr; OUT/cost.json holds the same object.
--checkpoint times a token VLA checkpoint's passes at its own shape; with --incremental also its
full against its incremental prefill (reused keys/values of unchanged image tokens) frame by frame
over a scripted pick in the sim: the mean and median ms per frame, the speed-up, the share of the
image tokens recomputed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from vla_accel_ros.commands.vision_options import add_vision_reuse_arguments, vision_config
from vla_accel_ros.evaluation.cost import DTYPES, FAMILIES, CostOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = CostOptions()
    parser.add_argument("--family", choices=FAMILIES, default=d.family, help="the model family, at its published shape")
    parser.add_argument("--device", default=d.device, help="where the passes run: cpu, cuda or cuda:N")
    parser.add_argument("--layers", type=int, default=d.layers,
                        help="text layers to build; their time and work are scaled to the real depth (0: the real "
                             "depth)")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="the text model's dtype (default: bfloat16 on a GPU, float32 on the CPU)")
    parser.add_argument("--repeats", type=int, default=d.repeats, help="timed runs per pass (median, min-max)")
    parser.add_argument("--warmup", type=int, default=d.warmup, help="untimed runs before a pass's timed ones")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads (CPU time counts them all)")
    parser.add_argument("--passes-from", action="append", default=[], metavar="SUMMARY.json",
                        help="a vla-accel eval (or bench) summary.json: its decoder's measured target passes per "
                             "action, priced here (repeatable)")
    parser.add_argument("--out", default=d.out, help="output directory (cost.json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the table on stderr)")
    parser.add_argument("--checkpoint", default=d.checkpoint,
                        help="a checkpoint of the family (hf:DIR, an OpenVLA or OFT directory): time its model at "
                             "its own shape instead of the published one")
    parser.add_argument("--incremental", action="store_true",
                        help="also time the full and the incremental prefill (reused keys/values of unchanged image "
                             "tokens) frame by frame over a scripted pick in the sim (needs MuJoCo rendering)")
    parser.add_argument("--frames", type=int, default=d.frames, help="--incremental: sim frames (the pick's first N)")
    add_vision_reuse_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.evaluation.cost import cost
    from vla_accel_ros.models.load import is_device_name
    from vla_accel_ros.sim.gl import check_rendering

    if not is_device_name(args.device):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    opts = CostOptions(family=args.family, device=args.device, layers=args.layers, dtype=args.dtype or "",
                       repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                       passes_from=tuple(args.passes_from), out=args.out, checkpoint=args.checkpoint,
                       incremental=args.incremental, frames=args.frames, vision=vision_config(args, reuse_kv=True))
    if args.incremental and not check_rendering("cost"):  # no GL: one line saying what to set, before any work
        return 2
    summary = cost(opts)
    if args.json:
        print(json.dumps(summary))
    print_table(summary, sys.stderr if args.json else sys.stdout)
    return 0


def print_table(summary: dict[str, Any], stream: TextIO) -> None:
    b = summary["bounds"]
    layers = f"{summary['text_layers_built']} of {summary['text_layers_real']} text layers built, scaled"
    print(f"{summary['family']} on {summary['device']} ({summary['device_name']}), {summary['dtype']}, {layers}; "
          f"torch {summary['torch']}, CUDA {summary['cuda'] or 'none'}; {summary['clock']}", file=stream)
    why = (": this CPU has no bfloat16 matrix instructions" if summary["device"] == "cpu"
           and b["matmul_dtype"] == "float32" else "")
    print(f"bounds: copy {b['copy_gb_s']:.1f} GB/s (read + written), matmul {b['matmul_tflop_s']:.3f} TFLOP/s "
          f"({b['matmul_dtype']}{why})", file=stream)
    print("| pass | median ms | min-max ms | GFLOP | weights MB | bound ms | x bound | peak memory MB |", file=stream)
    print("|---|---|---|---|---|---|---|---|", file=stream)
    for name, r in summary["table"].items():
        term = r.get("bound", "sum")
        print(f"| {name} | {r['median_ms']:.2f} | {r['min_ms']:.2f}-{r['max_ms']:.2f} | {r['flops'] / 1e9:.1f} | "
              f"{r['weight_bytes'] / 1e6:.0f} | {r['bound_ms']:.2f} ({term}) | {r['x_bound']:.2f} | "
              f"{r['peak_memory_mb']:.0f} |", file=stream)
    if "buckets" in summary:
        print(f"bucketed incremental vision: buckets of {', '.join(map(str, summary['buckets']))} of "
              f"{summary['image_tokens']} image rows (prefix_bucket_<rows> beside prefix)", file=stream)
    for row in summary.get("decoders", []):
        speedup = row["implied_speedup_vs_ar"]
        print(f"{row['decoder']}: {row['target_passes_per_action']:.2f} target passes per action measured "
              f"({row['source']}) -> {row['implied_ms_per_action']:.1f} ms per action ({row['implied_hz']:.2f} Hz)"
              + ("" if speedup is None else f", {speedup:.2f}x ar"), file=stream)
    if "incremental" in summary:
        i = summary["incremental"]
        print(f"incremental prefill over {i['frames']} sim frames: full {i['prefill_full_ms_mean']:.1f} ms, "
              f"incremental {i['prefill_incremental_ms_mean']:.1f} ms per frame (mean; p50 "
              f"{i['prefill_full_ms_p50']:.1f} vs {i['prefill_incremental_ms_p50']:.1f}): "
              f"{i['incremental_prefill_speedup']:.2f}x (p50 {i['incremental_prefill_speedup_p50']:.2f}x), "
              f"{i['recomputed_fraction_mean']:.0%} of the image tokens recomputed "
              f"({i['tower_recomputed_fraction_mean']:.0%} by the tower), {i['refreshes']} full refreshes",
              file=stream)
    for error in summary["graph_errors"]:
        print(f"a CUDA graph ran eagerly: {error}", file=stream)
    print(f"cost -> {summary['options']['out']} (cost.json)", file=stream)
