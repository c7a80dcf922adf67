"""The flags shared by the closed-loop commands (eval, bench, vision-fidelity): episodes and seeds,
sampling, and the robot check; the incremental-vision flags are :mod:`.vision_options`'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vla_accel_ros.core.seeds import EVAL_SEED_START
from vla_accel_ros.models.sampling import DEFAULT_TEMPERATURE, SamplingConfig


def add_episode_arguments(parser: argparse.ArgumentParser, episodes: int = 50,
                          episodes_help: str = "number of episodes") -> None:
    """What every closed-loop command takes: episodes, first seed, output, checkpoint, step limit, threads."""
    parser.add_argument("--episodes", type=int, default=episodes, help=episodes_help)
    parser.add_argument("--seed", type=int, default=EVAL_SEED_START,
                        help=f"first seed (held out: >= {EVAL_SEED_START})")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory, or hf:DIR for a Hugging "
                        "Face VLA with OpenVLA's action tokens (default: the shipped one)")
    parser.add_argument("--unnorm-key", default="", help="hf:DIR only: the dataset of its dataset_statistics.json "
                        "(default: the file's only one)")
    parser.add_argument("--max-steps", type=int, default=120, help="episode step limit (20 Hz)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                        help=f"action-token sampling temperature, 0 = greedy (default {DEFAULT_TEMPERATURE}: the "
                             "shipped policy's setting); the noise follows each episode's seed, and the draft heads "
                             "share it")


def sampling_config(args: argparse.Namespace) -> SamplingConfig:
    """The sampling of ``--temperature``; ValueError naming the flag when it is out of range."""
    try:
        return SamplingConfig(args.temperature)
    except ValueError as err:
        raise ValueError(f"--temperature: {err}") from err


def add_robot_arguments(parser: argparse.ArgumentParser) -> None:
    """``--allow-unmatched-robot``, for :func:`~vla_accel_ros.evaluation.robot_check.checkpoints_fit_robot`."""
    parser.add_argument("--allow-unmatched-robot", action="store_true",
                        help="run a checkpoint made for another arm with the same DOF (other joint names, TCP "
                             "frame, policy rate or image size), with a warning; a different DOF never runs")
