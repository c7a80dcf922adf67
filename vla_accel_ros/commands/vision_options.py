"""The incremental-vision flags of the commands (eval, bench, cost, vision-fidelity, sim) and the
:class:`~vla_accel_ros.models.configuration.VisionReuseConfig` they give. Importable without torch:
``vla-accel sim`` hands the settings to the node as its ``vision_*`` parameters.
"""

from __future__ import annotations

import argparse

from vla_accel_ros.models.configuration import VisionReuseConfig


def add_vision_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vision", choices=("full", "incremental", "incremental_kv"), default="full",
                        help="encode every patch of every frame; only the patches that changed; or that and reuse "
                             "the cached keys/values of unchanged tokens in the global layer and decoder (approximate)")
    add_vision_reuse_arguments(parser)


def add_vision_reuse_arguments(parser: argparse.ArgumentParser) -> None:
    """The incremental encoder's settings (``vision_config`` reads them)."""
    d = VisionReuseConfig()
    parser.add_argument("--vision-threshold", type=float, default=d.threshold,
                        help="incremental: mean |pixel change| (0..255) that makes a patch dynamic")
    parser.add_argument("--vision-refresh", type=int, default=d.refresh_steps,
                        help="incremental: re-encode every patch at least every N frames")
    parser.add_argument("--vision-max-drift", type=float, default=d.max_drift,
                        help="incremental: mean sub-threshold change of cached patches that forces a refresh")
    parser.add_argument("--vision-feature-threshold", type=float, default=d.feature_threshold,
                        help="incremental prefill of a Hugging Face VLA: relative change of an image token's features "
                             "that makes it dynamic (0 = judge by pixels, --vision-threshold)")
    parser.add_argument("--vision-reuse-tower", action="store_true",
                        help="incremental prefill of a Hugging Face VLA: run its vision tower, too, only on the "
                             "patches whose pixels moved (--vision-tower-threshold), the others keeping their keys, "
                             "values and features in every tower layer")
    parser.add_argument("--vision-tower-threshold", type=float, default=d.tower_threshold,
                        help="--vision-reuse-tower: mean |pixel change| (0..255) that makes the tower recompute a "
                             "patch")
    parser.add_argument("--vision-tower-refresh", type=int, default=d.tower_refresh_steps,
                        help="--vision-reuse-tower: run the tower on every patch at least every N frames")


def vision_config(args: argparse.Namespace, reuse_kv: bool | None = None) -> VisionReuseConfig:
    """The reuse settings of the flags; ``reuse_kv`` None: as ``--vision`` says."""
    kv = args.vision == "incremental_kv" if reuse_kv is None else reuse_kv
    return VisionReuseConfig(args.vision_threshold, args.vision_refresh, args.vision_max_drift, reuse_kv=kv,
                             feature_threshold=args.vision_feature_threshold, reuse_tower=args.vision_reuse_tower,
                             tower_threshold=args.vision_tower_threshold,
                             tower_refresh_steps=args.vision_tower_refresh)
