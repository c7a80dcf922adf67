"""Command-line options shared by the closed-loop commands (eval, bench, vision-fidelity): episodes and
seeds, sampling, and the decoder's extra inputs (HeiSD's retrieval store). The incremental-vision
flags are :mod:`vla_accel_ros.evaluation.vision_options`'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vla_accel_ros.decoding.retrieval import resolve_store, store_mismatch
from vla_accel_ros.decoding.specs import spec_of
from vla_accel_ros.models import Policy
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


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                        help=f"action-token sampling temperature, 0 = greedy (default {DEFAULT_TEMPERATURE}: the shipped "
                             "policy's setting); the noise follows each episode's seed, and the draft heads share it")


def sampling_config(args: argparse.Namespace) -> SamplingConfig:
    try:
        return SamplingConfig(args.temperature)
    except ValueError as err:
        raise SystemExit(f"--temperature: {err}") from err


def decoder_options(name: str, store: Path | None, base_checkpoint: Path, policy: Policy, checkpoint: Path) -> dict[str, Any]:
    """What a decoder needs besides its defaults: for one with ``retrieval_store`` (heisd), the store
    (``store``, else BASE_CHECKPOINT/retrieval_store), checked against the policy; exits with how to
    build one."""
    if not spec_of(name).retrieval_store:
        return {}
    try:
        loaded = resolve_store(store, base_checkpoint, expect_dim=policy.config.d_model)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"--decoder {name}: {err}") from err
    warning = store_mismatch(loaded, checkpoint)
    if warning:
        print(f"warning: {warning}")
    return {"store": loaded}
