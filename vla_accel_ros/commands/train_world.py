"""``vla-accel train-world``: the world-aware prefill (frame autoencoder, next-frame bias, fine-tune).
"""

from __future__ import annotations

import argparse

from vla_accel_ros.commands.training_options import add_run_arguments, config_defaults, config_from_args
from vla_accel_ros.training.configs import WorldTrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = config_defaults(WorldTrainConfig)
    parser.add_argument("--checkpoint", required=True, help="base checkpoint directory (read only)")
    parser.add_argument("--data", required=True, help="demo directory with episode_*.npz")
    parser.add_argument("--out", required=True, help="directory of the new checkpoint (model.* + world.*)")
    parser.add_argument("--ae-epochs", type=int, default=d.ae_epochs, help="autoencoder epochs (phase a)")
    parser.add_argument("--bias-epochs", type=int, default=d.bias_epochs, help="world-bias epochs (phase b)")
    parser.add_argument("--finetune-epochs", type=int, default=d.finetune_epochs,
                        help="target epochs on the biased embeddings (phase c)")
    parser.add_argument("--draft-epochs", type=int, default=d.draft_epochs,
                        help="draft + contact head epochs after the target (phase c)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr, help="peak learning rate of the autoencoder and bias")
    parser.add_argument("--finetune-lr", type=float, default=d.finetune_lr,
                        help="peak learning rate of the target and heads in phase (c)")
    parser.add_argument("--latent-channels", type=int, default=d.latent_channels,
                        help="channels of the autoencoder's latent map (one cell per patch)")
    parser.add_argument("--width", type=int, default=d.width, help="autoencoder width")
    parser.add_argument("--hidden", type=int, default=d.hidden, help="width of the bias module")
    parser.add_argument("--head-hidden", type=int, default=d.head_hidden, help="width of the next-frame head")
    parser.add_argument("--latent-l2", type=float, default=d.latent_l2,
                        help="penalty on the autoencoder latent's mean square")
    parser.add_argument("--bias-l2", type=float, default=d.bias_l2, help="penalty on the bias's mean square")
    parser.add_argument("--scene-weight", type=float, default=d.scene_weight,
                        help="weight of a scene probe's loss on the bias: near contact, and where the named cube "
                             "and the TCP are, read from the bias alone (0 = next-frame prediction only)")
    add_run_arguments(parser, d)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.training.world import train_world  # torch: only when it runs

    train_world(config_from_args(WorldTrainConfig, args))
    return 0
