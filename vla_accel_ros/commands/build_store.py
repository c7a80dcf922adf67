"""``vla-accel build-store``: the HeiSD retrieval store (the demonstrated trajectories, keyed by the
policy's prefix features, that the ``heisd`` decoder drafts from in free motion) and its boundary
calibration (where near a task boundary it hands over to the draft head).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vla_accel_ros.commands.training_options import config_defaults
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.training.configs import DEFAULT_DATA, BuildStoreConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = config_defaults(BuildStoreConfig)
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory (default: the shipped one)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help=f"demo directory with episode_*.npz (default: {DEFAULT_DATA})")
    parser.add_argument("--out", type=Path, default=None, help="store directory (default: CHECKPOINT/retrieval_store)")
    parser.add_argument("--max-episodes", type=int, default=None, help="use only the first N episode files")
    parser.add_argument("--stride", type=int, default=d.stride, help="store every S-th step of each episode")
    parser.add_argument("--holdout-episodes", type=int, default=d.holdout_episodes,
                        help="last N episodes are not stored but query the index (latency, recall, action distance)")
    parser.add_argument("--horizon", type=int, default=d.horizon, help="actions per entry (current + following)")
    parser.add_argument("--index", choices=("auto", "flat", "hnsw"), default=d.index,
                        help="faiss index; auto measures exact and HNSW and picks by latency and recall")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads for the prefill")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    cfg = BuildStoreConfig(
        checkpoint=str(args.checkpoint or default_checkpoint()), data=str(args.data),
        out=None if args.out is None else str(args.out), max_episodes=args.max_episodes, stride=args.stride,
        holdout_episodes=args.holdout_episodes, horizon=args.horizon, index=args.index, threads=args.threads,
        progress=args.progress,
    )
    from vla_accel_ros.training.store import build  # torch: only when it runs

    store, out = build(cfg, command="vla-accel " + " ".join(sys.argv[1:]))
    bench, cal = store.meta["index_benchmark"], store.meta["calibration"]
    print(f"build-store: {len(store)} entries (dim {store.dim}, horizon {store.horizon}) "
          f"in {store.meta['provenance']['build_s']:.0f} s -> {out}")
    for kind in ("flat", "hnsw"):
        f = bench[kind]
        print(f"  {kind:5s} query p50 {f['query_ms_p50']:.3f} ms, p99 {f['query_ms_p99']:.3f} ms (cold caches; "
              f"warm p50 {f['warm_query_ms_p50']:.3f} ms), recall@1 {f['recall_at_1']:.3f}"
              f"{'  <- chosen' if kind == store.index_kind else ''}")
    print(f"  boundary (calibrated): R in ({cal['r_lo']:.3g}, {cal['r_hi']:.3g}) m, D in ({cal['d_lo']:.3g}, "
          f"{cal['d_hi']:.3g}) m, threshold {cal['threshold']:.4f} -> retrieval on {cal['retrieval_share']:.0%} "
          f"of demo windows (published preset: {cal['published_retrieval_share']:.0%})")
    held = store.meta.get("held_out_retrieval")
    if held:
        print(f"  held-out retrieval: mean |token diff| {held['mean_token_distance']:.2f} bins, "
              f"{held['share_within_r_seq_4']:.0%} within r_seq=4")
    return 0
