"""Command-line options shared by the closed-loop commands (eval, bench, vision-fidelity): episodes and
seeds, incremental vision, sampling, and the decoder's extra inputs (HeiSD's retrieval store).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vla_accel_ros.decoding import capabilities_of
from vla_accel_ros.decoding.retrieval import resolve_store, store_mismatch
from vla_accel_ros.models import Policy
from vla_accel_ros.models.incremental_vision import VisionReuseConfig
from vla_accel_ros.models.sampling import DEFAULT_TEMPERATURE, SamplingConfig
from vla_accel_ros.sim.env import EVAL_SEED_START


def add_episode_arguments(parser: argparse.ArgumentParser, episodes: int = 50,
                          episodes_help: str = "number of episodes") -> None:
    """What every closed-loop command takes: episodes, first seed, output, checkpoint, step limit, threads."""
    parser.add_argument("--episodes", type=int, default=episodes, help=episodes_help)
    parser.add_argument("--seed", type=int, default=EVAL_SEED_START, help=f"first seed (held out: >= {EVAL_SEED_START})")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory, or hf:DIR for a Hugging "
                        "Face VLA with OpenVLA's action tokens (default: the shipped one)")
    parser.add_argument("--unnorm-key", default="", help="hf:DIR only: the dataset of its dataset_statistics.json "
                        "(default: the file's only one)")
    parser.add_argument("--max-steps", type=int, default=120, help="episode step limit (20 Hz)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


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
                        help="incremental prefill of a Hugging Face VLA: run its vision tower, too, only on the patches "
                             "whose pixels moved (--vision-tower-threshold), the others keeping their keys, values and "
                             "features in every tower layer")
    parser.add_argument("--vision-tower-threshold", type=float, default=d.tower_threshold,
                        help="--vision-reuse-tower: mean |pixel change| (0..255) that makes the tower recompute a patch")
    parser.add_argument("--vision-tower-refresh", type=int, default=d.tower_refresh_steps,
                        help="--vision-reuse-tower: run the tower on every patch at least every N frames")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                        help=f"action-token sampling temperature, 0 = greedy (default {DEFAULT_TEMPERATURE}: the shipped "
                             "policy's setting); the noise follows each episode's seed, and the draft heads share it")


def sampling_config(args: argparse.Namespace) -> SamplingConfig:
    try:
        return SamplingConfig(args.temperature)
    except ValueError as err:
        raise SystemExit(f"--temperature: {err}") from err


def vision_config(args: argparse.Namespace, reuse_kv: bool | None = None) -> VisionReuseConfig:
    """The reuse settings of the flags; ``reuse_kv`` None: as ``--vision`` says."""
    kv = args.vision == "incremental_kv" if reuse_kv is None else reuse_kv
    return VisionReuseConfig(args.vision_threshold, args.vision_refresh, args.vision_max_drift, reuse_kv=kv,
                             feature_threshold=args.vision_feature_threshold, reuse_tower=args.vision_reuse_tower,
                             tower_threshold=args.vision_tower_threshold,
                             tower_refresh_steps=args.vision_tower_refresh)


def decoder_options(name: str, store: Path | None, base_checkpoint: Path, policy: Policy, checkpoint: Path) -> dict[str, Any]:
    """What a decoder needs besides its defaults: for one with ``retrieval_store`` (heisd), the store
    (``store``, else BASE_CHECKPOINT/retrieval_store), checked against the policy; exits with how to
    build one."""
    if not capabilities_of(name).retrieval_store:
        return {}
    try:
        loaded = resolve_store(store, base_checkpoint, expect_dim=policy.config.d_model)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"--decoder {name}: {err}") from err
    warning = store_mismatch(loaded, checkpoint)
    if warning:
        print(f"warning: {warning}")
    return {"store": loaded}
