"""``vla-accel train-hf``: a small Hugging Face VLA (Llava: SigLIP/CLIP + Llama) in OpenVLA's layout, from
demonstrations.
"""

from __future__ import annotations

import argparse

from vla_accel_ros.commands.training_options import add_run_arguments, config_defaults, config_from_args
from vla_accel_ros.training.configs import AUTOCAST_DTYPES, PROMPT_LAYOUTS, VISIONS, HFTrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = config_defaults(HFTrainConfig)
    parser.add_argument("--data", required=True, help="demo directory with episode_*.npz (docs/data_layout.md)")
    parser.add_argument("--out", required=True, help="output directory (save_pretrained layout, hf:OUT)")
    parser.add_argument("--init", default=None, help="hf:DIR to fine-tune (its architecture and statistics) instead "
                                                     "of a fresh model")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay)
    parser.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    parser.add_argument("--grad-clip", type=float, default=d.grad_clip)
    parser.add_argument("--augment-shift", type=int, default=d.augment_shift, help="max random image shift, px")
    parser.add_argument("--aux-weight", type=float, default=d.aux_weight,
                        help="weight of the auxiliary cube/TCP position regression (a training-only probe)")
    parser.add_argument("--keypoint-weight", type=float, default=d.keypoint_weight,
                        help="weight of the image tokens' keypoint loss: where the camera sees the named cube "
                             "and the TCP (a training-only head; 0 = off)")
    parser.add_argument("--include-failures", action="store_true", help="also train on failed episodes")
    parser.add_argument("--vision", choices=VISIONS, default=d.vision, help="vision tower")
    parser.add_argument("--prompt-layout", choices=tuple(PROMPT_LAYOUTS), default=d.prompt_layout,
                        help="image_first: OpenVLA's prompt; instruction_first: the image tokens after the "
                             "instruction, so each attends to it; instruction_first+proprio: and the joints and "
                             "gripper as binned tokens after the image (written to vla_spec.json)")
    parser.add_argument("--patch-size", type=int, default=d.patch_size)
    parser.add_argument("--vision-hidden", type=int, default=d.vision_hidden)
    parser.add_argument("--vision-layers", type=int, default=d.vision_layers)
    parser.add_argument("--vision-heads", type=int, default=d.vision_heads)
    parser.add_argument("--hidden-size", type=int, default=d.hidden_size, help="Llama width")
    parser.add_argument("--layers", type=int, default=d.layers, help="Llama layers")
    parser.add_argument("--heads", type=int, default=d.heads)
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads)
    parser.add_argument("--intermediate-size", type=int, default=d.intermediate_size)
    parser.add_argument("--text-vocab", type=int, default=d.text_vocab,
                        help="text vocabulary below the added tokens; its top 256 ids are the action ids")
    parser.add_argument("--dagger-rounds", type=int, default=d.dagger_rounds,
                        help="rounds of policy-in-the-loop episodes labelled by the expert, each followed by "
                             "fine-tuning")
    parser.add_argument("--dagger-episodes", type=int, default=d.dagger_episodes, help="episodes per DAgger round")
    parser.add_argument("--dagger-share", type=float, default=d.dagger_share, help="share of steps the model drives")
    parser.add_argument("--dagger-seed", type=int, default=d.dagger_seed, help="seed of the first DAgger episode")
    parser.add_argument("--dagger-epochs", type=int, default=d.dagger_epochs, help="fine-tuning epochs per round")
    parser.add_argument("--dagger-lr", type=float, default=d.dagger_lr)
    parser.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size)
    parser.add_argument("--save-dtype", choices=("float32", "bfloat16", "float16"), default=d.save_dtype)
    parser.add_argument("--autocast", choices=AUTOCAST_DTYPES, default=d.autocast,
                        help="precision of the training forward's matmuls (bfloat16: faster on CPUs with "
                             "AVX512-BF16 or AMX; the weights stay float32)")
    add_run_arguments(parser, d)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.training.hf_vla import train_hf_vla  # torch: only when it runs

    train_hf_vla(config_from_args(HFTrainConfig, args))
    return 0
