"""``vla-accel demos``: scripted-expert demonstrations in the MuJoCo sim.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, required=True, help="number of episodes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode (episode i uses seed+i)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--image-size", type=int, default=128, help="camera image side in pixels")
    parser.add_argument("--max-steps", type=int, default=120, help="episode step limit at 20 Hz")
    parser.add_argument("--wrist", action="store_true",
                        help="record the wrist camera too (wrist_images): data for a two-camera policy")
    parser.add_argument("--only-successes", action="store_true", help="keep only successful episodes on disk")
    parser.add_argument(
        "--action-noise", type=float, default=0.0,
        help="execute expert actions perturbed by this fraction of the step limits, record the clean ones",
    )
    parser.add_argument(
        "--policy", default=None,
        help="checkpoint directory ('default' = shipped) whose greedy actions (a LeRobot flow policy: its chunk's "
             "first action) drive --policy-share of the steps while the expert's actions are recorded (DAgger)",
    )
    parser.add_argument("--policy-share", type=float, default=0.5, help="share of steps the --policy drives")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.sim.demos import greedy_policy_action, record_demos  # MuJoCo: only when it runs
    from vla_accel_ros.sim.env import SimConfig
    from vla_accel_ros.sim.gl import check_rendering

    if not check_rendering("demos"):  # no GL: one line saying what to set, before any work
        return 2
    config = SimConfig(image_size=args.image_size, max_steps=args.max_steps, wrist_image=args.wrist)
    policy_action = greedy_policy_action(args.policy) if args.policy else None
    summary = record_demos(
        args.out, args.episodes, args.seed, config, args.only_successes, action_noise=args.action_noise,
        policy_action=policy_action, policy_share=args.policy_share if policy_action else 0.0,
    )
    print(
        f"{'expert' if policy_action is None else 'mixed policy/expert'}: {summary['success_rate']:.1%} success "
        f"over {summary['episodes']} episodes "
        f"(seeds {args.seed}..{args.seed + args.episodes - 1}), {summary['steps_total']} steps -> {args.out}"
    )
    return 0
