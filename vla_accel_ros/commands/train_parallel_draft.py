"""``vla-accel train-parallel-draft``: a parallel draft head (all draft tokens in one light call) on a checkpoint.
"""

from __future__ import annotations

import argparse

from vla_accel_ros.commands.training_options import (
    add_draft_optimiser_arguments,
    add_run_arguments,
    config_defaults,
    config_from_args,
)
from vla_accel_ros.training.configs import ParallelDraftTrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = config_defaults(ParallelDraftTrainConfig)
    parser.add_argument("--checkpoint", required=True, help="trained checkpoint (its target and draft head are frozen)")
    parser.add_argument("--data", required=True, help="demo directory with episode_*.npz")
    parser.add_argument("--out", default=None,
                        help="write a copy of the checkpoint with the parallel draft head here (required unless "
                             "--in-place)")
    parser.add_argument("--in-place", action="store_true", help="add the head to --checkpoint itself instead of --out")
    add_draft_optimiser_arguments(parser, d, "feature")
    parser.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size)
    add_run_arguments(parser, d)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.training.parallel_draft import train_parallel_draft  # torch: only when it runs

    train_parallel_draft(config_from_args(ParallelDraftTrainConfig, args))
    return 0
