"""``vla-accel lerobot-cost``: SmolVLA's, π0's or π0.5's prefix, one flow step and a whole chunk at the real
shape, in CPU time (or GPU wall time with ``--device cuda``), with and without the accelerators
(2 steps, incremental vision)."""

from __future__ import annotations

import argparse
import json

from vla_accel_ros.models.lerobot.config import SUPPORTED_TYPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--type", choices=SUPPORTED_TYPES, default="smolvla", help="the policy type")
    parser.add_argument("--layers", type=int, default=0,
                        help="text layers to build (VLM and expert); their time is scaled to the real depth "
                             "(0: the real depth)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="the backbones' dtype")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per pass (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU time counts them all)")
    parser.add_argument("--out", default="outputs/lerobot_cost", help="output directory (summary.json)")
    parser.add_argument("--device", default="cpu", help="where the passes run: cpu, cuda, cuda:1, ... (on a GPU, "
                        "times are wall times until the GPU finished)")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.evaluation.lerobot_cost import LeRobotCostOptions, lerobot_cost
    from vla_accel_ros.models.load import is_device_name

    if args.layers < 0 or args.repeats < 1:
        raise ValueError("--layers must be >= 0 and --repeats >= 1")
    if not is_device_name(args.device):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    opts = LeRobotCostOptions(type=args.type, layers=args.layers, dtype=args.dtype, repeats=args.repeats,
                              threads=args.threads, out=args.out, device=args.device)
    summary = lerobot_cost(opts)
    print(json.dumps(summary["table"], indent=1))
    return 0
