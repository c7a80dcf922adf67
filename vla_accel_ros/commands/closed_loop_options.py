"""The flags shared by the closed-loop commands (eval, bench, vision-fidelity): episodes and seeds,
sampling, the cameras, and the robot check; the incremental-vision flags are :mod:`.vision_options`'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vla_accel_ros.core.cameras import sim_cameras, stand_in_slots
from vla_accel_ros.core.seeds import EVAL_SEED_START
from vla_accel_ros.models.sampling import DEFAULT_TEMPERATURE, SamplingConfig


def add_episode_arguments(parser: argparse.ArgumentParser, episodes: int = 50,
                          episodes_help: str = "number of episodes") -> None:
    """What every closed-loop command takes: episodes, first seed, output, checkpoint, step limit, threads."""
    parser.add_argument("--episodes", type=int, default=episodes, help=episodes_help)
    parser.add_argument("--seed", type=int, default=EVAL_SEED_START,
                        help=f"first seed (held out: >= {EVAL_SEED_START})")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory of any family, as "
                        "published (default: the shipped one)")
    parser.add_argument("--unnorm-key", default="", help="a token VLA with several datasets (OpenVLA, OpenVLA-OFT, "
                        "a Hugging Face VLA): the dataset of its statistics (default: the only one)")
    parser.add_argument("--max-steps", type=int, default=120, help="episode step limit (20 Hz)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"action-token sampling temperature, 0 = greedy (default: the model's: its "
                             f"vla_spec.json's temperature, else {DEFAULT_TEMPERATURE} for the package's policies and "
                             "0 for a model trained elsewhere); the noise follows each episode's seed, and the draft "
                             "heads share it")


def sampling_config(args: argparse.Namespace, model_temperature: float) -> SamplingConfig:
    """The sampling of ``--temperature``, else of the model's temperature (``model_temperature``,
    :class:`~vla_accel_ros.models.configuration.RunDefaults`); ValueError naming the flag when it
    is out of range."""
    try:
        return SamplingConfig(model_temperature if args.temperature is None else args.temperature)
    except ValueError as err:
        raise ValueError(f"--temperature: {err}") from err


def add_camera_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cameras`` and ``--stand-in-images``: the sim's cameras an observation holds."""
    parser.add_argument("--cameras", type=int, default=None, choices=(1, 2),
                        help="the sim's cameras in each observation: 1 (scene) or 2 (scene and wrist); default: as "
                             "many as the policy reads (its image slots)")
    parser.add_argument("--stand-in-images", action="store_true",
                        help="run a policy that reads more images than --cameras gives, each missing one a copy of "
                             "the scene camera's image (summary.json: stand_in_images)")


def stand_in_images(args: argparse.Namespace, image_slots: int) -> tuple[int, int]:
    """The sim's cameras for a policy with ``image_slots`` (0: any) and the image slots left to a
    stand-in; ValueError naming ``--cameras`` when it gives more images than the slots, or fewer
    without ``--stand-in-images``."""
    cameras = sim_cameras(args.cameras, image_slots)
    if image_slots and cameras > image_slots:
        raise ValueError(f"--cameras {cameras}: the checkpoint reads {image_slots} image(s) per observation")
    return cameras, stand_in_slots(cameras, image_slots, args.stand_in_images)


def add_robot_arguments(parser: argparse.ArgumentParser) -> None:
    """``--allow-unmatched-robot``, for :func:`~vla_accel_ros.evaluation.robot_check.checkpoints_fit_robot`."""
    parser.add_argument("--allow-unmatched-robot", action="store_true",
                        help="run a checkpoint made for another arm with the same DOF (other joint names, TCP "
                             "frame, policy rate or image size), with a warning; a different DOF never runs")
