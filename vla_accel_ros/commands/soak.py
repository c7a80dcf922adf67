"""``vla-accel soak``: the node at a control rate for a long run, its memory and its children's
sampled; exit 1 when a resident set grows faster than ``--max-slope`` MB/min after the warm-up.
A benchmark, not a test: ``vla-accel soak --minutes 30 --rate 50 --out outputs/soak``; with a chunked
policy, ``--checkpoint DIR --decoder flow10 --chunk-execution async``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tqdm import tqdm

from vla_accel_ros.core.chunks import CHUNK_EXECUTIONS
from vla_accel_ros.decoding.specs import DEFAULT
from vla_accel_ros.ros.soak import PROCESSES, SoakOptions, run_soak


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the node runs (default 30)")
    parser.add_argument("--rate", type=float, default=50.0, help="control_rate_hz (default 50)")
    parser.add_argument("--warmup-min", type=float, default=5.0, help="samples before this are not in the slope")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("--max-slope", type=float, default=0.05, help="MB/min the slopes must stay under")
    parser.add_argument("--decoder", default=DEFAULT)
    parser.add_argument("--checkpoint", default="", help="empty: the shipped policy")
    parser.add_argument("--chunk-execution", default=SoakOptions.chunk_execution, choices=CHUNK_EXECUTIONS,
                        help="a chunked policy: the node's chunk_execution (default: the node's, "
                             f"{SoakOptions.chunk_execution})")
    parser.add_argument("--domain-id", type=int, default=97, help="ROS_DOMAIN_ID of the node and the robot")
    parser.add_argument("--out", type=Path, default=Path("outputs/soak"), help="node.log and summary.json go here")


def run(args: argparse.Namespace) -> int:
    for name in ("minutes", "rate", "sample_s"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    opts = SoakOptions(minutes=args.minutes, rate_hz=args.rate, warmup_min=args.warmup_min, sample_s=args.sample_s,
                       decoder=args.decoder, checkpoint=args.checkpoint, chunk_execution=args.chunk_execution,
                       domain_id=args.domain_id)
    with tqdm(total=math.ceil(args.minutes * 60.0), desc="soak", unit="s") as bar:
        def show(sample: dict) -> None:
            bar.update(int(sample["t_s"]) - bar.n)
            bar.set_postfix({p: f"{sample[f'{p}_rss_mb']:.1f} MB" for p in PROCESSES})

        summary, samples = run_soak(opts, args.out, show)
    (args.out / "summary.json").write_text(json.dumps({**summary, "rss_samples": samples}, indent=1))
    flat = all(summary[p]["slope_mb_per_min"] < args.max_slope for p in PROCESSES)
    slopes = ", ".join(f"{p} {summary[p]['rss_start_mb']:.1f} -> {summary[p]['rss_end_mb']:.1f} MB "
                       f"({summary[p]['slope_mb_per_min']:+.3f} MB/min)" for p in PROCESSES)
    print(f"soak: {'flat' if flat else 'growing'} after {args.warmup_min:g} min of warm-up (limit {args.max_slope} "
          f"MB/min): {slopes}; {summary['ticks_published']}/{summary['ticks']} ticks published, "
          f"{summary['chunks_planned']} chunks planned; "
          f"{args.out / 'summary.json'}")
    return 0 if flat else 1
