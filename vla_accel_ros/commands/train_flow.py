"""``vla-accel train-flow``: the continuous action head (10-step teacher, 2-step student), one
action per sample or, with ``--horizon H``, a chunk of H. For a LeRobot flow policy (SmolVLA, π0,
π0.5) the policy is the teacher: only its 2-step sampler is fitted (``--method``, ``--distill-epochs``).
"""

from __future__ import annotations

import argparse

from vla_accel_ros.commands.training_options import add_run_arguments, config_defaults, config_from_args
from vla_accel_ros.training.configs import FlowTrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = config_defaults(FlowTrainConfig)
    parser.add_argument("--checkpoint", required=True, help="trained checkpoint directory (its target is frozen)")
    parser.add_argument("--data", required=True, help="demo directory with episode_*.npz")
    parser.add_argument("--out", default=None, help="write a copy of the checkpoint with the head here "
                        "(default: add the head to --checkpoint)")
    parser.add_argument("--epochs", type=int, default=d.epochs, help="teacher flow-matching epochs")
    parser.add_argument("--distill-epochs", type=int, default=d.distill_epochs,
                        help="student distillation epochs (a LeRobot policy: each runs its 10-step sampler on every "
                             "demo step; a few suffice)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--hidden", type=int, default=d.hidden, help="width of the velocity MLP")
    parser.add_argument("--layers", type=int, default=d.layers, help="hidden layers of the velocity MLP")
    parser.add_argument("--teacher-from", default=None,
                        help="reuse the teacher of this checkpoint's flow head (same target) and only distil a student")
    parser.add_argument("--student-hidden", type=int, default=d.student_hidden,
                        help="width of the 2-step student's MLP (0 = the teacher's; it then starts as the teacher)")
    parser.add_argument("--horizon", type=int, default=d.horizon,
                        help="actions per sample: H > 1 trains a chunked policy whose H actions feed the node's queue")
    parser.add_argument("--method", default=d.method, choices=("distilled", "two_anchor"),
                        help="a LeRobot policy (SmolVLA, pi0, pi05): fit its 2-step sampler as a distilled copy of its "
                             "flow-step modules, or as a small adapter over its own field at two anchors")
    parser.add_argument("--student-from", default=None,
                        help="a LeRobot policy: continue the 2-step sampler kept in this directory (same policy and "
                             "--method) instead of starting from 2 Euler steps")
    parser.add_argument("--cameras", type=int, default=d.cameras, choices=(1, 2),
                        help="image slots: 2 conditions the head on the demos' wrist images too "
                             "(vla-accel demos --wrist)")
    add_run_arguments(parser, d)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.training.flow import train_flow  # torch: only when it runs

    train_flow(config_from_args(FlowTrainConfig, args))
    return 0
