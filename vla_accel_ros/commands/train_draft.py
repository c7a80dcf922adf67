"""``vla-accel train-draft``: an EAGLE-style draft head on a token VLA's hidden states, saved beside the model
or, with ``--out``, in a directory of its own (with a ``vla_spec.json`` that points at the model).
"""

from __future__ import annotations

import argparse

from vla_accel_ros.commands.training_options import (
    add_draft_optimiser_arguments,
    add_run_arguments,
    config_defaults,
    config_from_args,
)
from vla_accel_ros.models.token_vla.spec import DTYPES
from vla_accel_ros.training.configs import TEACHERS, HFDraftTrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = config_defaults(HFDraftTrainConfig)
    parser.add_argument("--checkpoint", required=True,
                        help="DIR, a Hugging Face or OpenVLA model (frozen); the head is written into DIR "
                             "unless --out is given")
    parser.add_argument("--out", default=d.out,
                        help="write the head here instead (for a read-only model directory), with a vla_spec.json "
                             "that points at the model; the node then takes it as draft_head: OUT")
    parser.add_argument("--data", required=True, help="demo directory with episode_*.npz (docs/data_layout.md)")
    parser.add_argument("--device", default=d.device, help="where the model and the head run: cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", choices=DTYPES, default=d.dtype,
                        help="the model's weights (default: vla_spec.json's)")
    parser.add_argument("--unnorm-key", default=d.unnorm_key, help="dataset of the action statistics")
    parser.add_argument("--teacher", choices=TEACHERS, default=d.teacher,
                        help="tokens the target consumes while its hidden states are collected: the demo's "
                             "(one pass a step) or its own greedy rollout (7 passes a step, for a target that "
                             "often disagrees with the demos)")
    add_draft_optimiser_arguments(parser, d, "hidden-state")
    parser.add_argument("--width", type=int, default=d.width,
                        help="the head's inner width (default: the model's hidden size, at most 1024)")
    parser.add_argument("--blocks", type=int, default=d.blocks, help="residual MLP blocks of the head")
    parser.add_argument("--include-failures", action="store_true", help="also train on failed episodes")
    add_run_arguments(parser, d)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.training.hf_draft import train_hf_draft  # torch: only when it runs

    train_hf_draft(config_from_args(HFDraftTrainConfig, args))
    return 0
