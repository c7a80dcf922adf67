"""``vla-accel train-smolvla``: a small SmolVLA-structured policy in LeRobot's layout, its VLM
taken from a Hugging Face VLA trained here (``--vlm-from``), trained by flow matching on demos."""

from __future__ import annotations

import argparse

from vla_accel_ros.commands.training_options import add_run_arguments, config_defaults, config_from_args
from vla_accel_ros.training.configs import SmolVLATrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = config_defaults(SmolVLATrainConfig)
    parser.add_argument("--data", required=True, help="demo directory with episode_*.npz recorded with --wrist")
    parser.add_argument("--out", required=True, help="the policy directory to write")
    parser.add_argument("--vlm-from", required=True,
                        help="a Hugging Face VLA in Llava's layout (vla-accel train-hf): its vision tower and first "
                             "text layers become the VLM")
    parser.add_argument("--vlm-layers", type=int, default=d.vlm_layers, help="text layers of the VLM kept")
    parser.add_argument("--scale-factor", type=int, default=d.scale_factor,
                        help="the connector's pixel shuffle (image tokens per camera shrink by its square)")
    parser.add_argument("--chunk-size", type=int, default=d.chunk_size, help="actions per chunk")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--noise-samples", type=int, default=d.noise_samples,
                        help="flow (noise, time) draws per prefix pass")
    parser.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (expert, connector, projections)")
    parser.add_argument("--vlm-lr-scale", type=float, default=d.vlm_lr_scale,
                        help="the text layers' learning rate as a share of --lr")
    parser.add_argument("--aux-weight", type=float, default=d.aux_weight,
                        help="weight of the auxiliary regression of where the named cube and the gripper are (from "
                             "the state token's last hidden state; a training aid, not saved)")
    parser.add_argument("--state-dropout", type=float, default=d.state_dropout,
                        help="share of training samples whose state is zeroed, so that the policy reads the scene "
                             "rather than continuing the arm's motion (a training aid)")
    parser.add_argument("--keypoint-weight", type=float, default=d.keypoint_weight,
                        help="weight of the keypoint loss: the front camera's image tokens place the named cube and "
                             "the gripper in that image (a training aid, not saved)")
    parser.add_argument("--init", default=None,
                        help="a policy directory written by train-smolvla to start from (its statistics are kept)")
    add_run_arguments(parser, d)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.training.smolvla import train_smolvla  # torch: only when it runs

    train_smolvla(config_from_args(SmolVLATrainConfig, args))
    return 0
