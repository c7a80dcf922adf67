"""``vla-accel train``: behaviour cloning of the target VLA, then its draft and contact heads.
"""

from __future__ import annotations

import argparse

from vla_accel_ros.commands.training_options import add_run_arguments, config_defaults, config_from_args
from vla_accel_ros.training.configs import TrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = config_defaults(TrainConfig)
    parser.add_argument("--data", required=True, help="demo directory with episode_*.npz")
    parser.add_argument("--out", required=True, help="checkpoint directory to write")
    parser.add_argument("--epochs", type=int, default=d.epochs, help="target behaviour-cloning epochs")
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr, help="peak learning rate of the target")
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay)
    parser.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    parser.add_argument("--grad-clip", type=float, default=d.grad_clip)
    parser.add_argument("--augment-shift", type=int, default=d.augment_shift, help="max random image shift (px)")
    parser.add_argument("--draft-epochs", type=int, default=d.draft_epochs, help="draft + contact head epochs")
    parser.add_argument("--draft-lr", type=float, default=d.draft_lr)
    parser.add_argument("--feature-weight", type=float, default=d.feature_weight)
    parser.add_argument("--aux-weight", type=float, default=d.aux_weight,
                        help="weight of the auxiliary cube/TCP position loss (needs tcp_pos/target_pos in the demos)")
    parser.add_argument("--init", default=None,
                        help="fine-tune this checkpoint (its architecture, tokenizer and proprio statistics)")
    parser.add_argument("--include-failures", action="store_true", help="also train on failed episodes")
    parser.add_argument("--d-model", type=int, default=d.d_model)
    parser.add_argument("--n-layers", type=int, default=d.n_layers, help="decoder layers")
    parser.add_argument("--n-heads", type=int, default=d.n_heads)
    parser.add_argument("--vision-layers", type=int, default=d.vision_layers)
    parser.add_argument("--max-text-len", type=int, default=d.max_text_len)
    parser.add_argument("--patch-size", type=int, default=d.patch_size)
    parser.add_argument("--local-channels", type=int, default=d.local_channels)
    parser.add_argument("--text-layers", type=int, default=d.text_layers,
                        help="transformer layers over the instruction before it conditions the patches (FiLM)")
    parser.add_argument("--keypoint-weight", type=float, default=d.keypoint_weight,
                        help="weight of the loss putting keypoint 0 on the named cube and 1 on the TCP in the image")
    parser.add_argument("--keypoints", type=int, default=d.keypoints,
                        help="spatial-softmax keypoints over the patch stem (0 = none)")
    parser.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size)
    parser.add_argument("--save-dtype", choices=("float32", "float16", "bfloat16"), default=d.save_dtype)
    parser.add_argument("--device", default=d.device)
    add_run_arguments(parser, d)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.training.target import train  # torch: only when it runs

    train(config_from_args(TrainConfig, args))
    return 0
