"""The ``vla-accel`` command: every run the ros2 CLI would do, for machines without it.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their subcommand runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demos": ("vla_accel_ros.commands.demos", "record scripted-expert demonstrations in the MuJoCo sim"),
    "sim": ("vla_accel_ros.commands.sim", "run the sim bridge and the VLA node over DDS for N episodes"),
    "hf-cost": ("vla_accel_ros.commands.hf_cost",
                "time a Hugging Face VLA's passes at OpenVLA's shape, and the speed-ups they imply"),
    "fleet-bench": ("vla_accel_ros.commands.fleet_bench",
                    "N robots on one batched inference process against N separate processes"),
    "train": ("vla_accel_ros.commands.train",
              "train the policy (target VLA, draft head, contact head) on demonstrations"),
    "train-flow": ("vla_accel_ros.commands.train_flow",
                   "train the continuous action head (10-step teacher, 2-step student)"),
    "train-parallel-draft": ("vla_accel_ros.commands.train_parallel_draft",
                             "train a parallel draft head (all draft tokens in one light call) on a checkpoint"),
    "train-hf": ("vla_accel_ros.commands.train_hf",
                 "train a small Hugging Face VLA (Llava: SigLIP + Llama) in OpenVLA's layout"),
    "train-draft": ("vla_accel_ros.commands.train_draft",
                    "train an EAGLE-style draft head on a Hugging Face VLA (hf:DIR)"),
    "train-world": ("vla_accel_ros.commands.train_world",
                    "world-aware prefill: frame autoencoder + next-frame bias, then fine-tune target and draft on it"),
    "build-store": ("vla_accel_ros.commands.build_store",
                    "build the HeiSD retrieval store and boundary calibration from demonstrations"),
    "predict": ("vla_accel_ros.commands.predict", "one observation in, its action and timings out, any checkpoint"),
    "eval": ("vla_accel_ros.commands.eval", "closed-loop episodes of the policy in the sim with one decoder"),
    "bench": ("vla_accel_ros.commands.bench", "every decoder on the same seeded episodes, side by side, with plots"),
    "vision-fidelity": ("vla_accel_ros.commands.vision_fidelity",
                        "what incremental vision's approximation costs against the full prefill, frame by frame"),
    "soak": ("vla_accel_ros.commands.soak", "the node for a long run at a control rate: is its memory flat?"),
    "sim-speed": ("vla_accel_ros.commands.sim_speed", "measure sim steps/s with and without rendering"),
    "record": ("vla_accel_ros.commands.record", "record sim episodes with the node into a rosbag2 (mcap or sqlite3)"),
    "replay": ("vla_accel_ros.commands.replay",
               "replay a rosbag2 through the node and diff its commands with the recorded ones"),
}


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla-accel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            importlib.import_module(module_name).add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    selected = next((a for a in argv if not a.startswith("-")), None)
    if selected is not None and selected not in COMMANDS:
        build_parser().error(f"unknown command '{selected}' (choose from {', '.join(COMMANDS)})")
    args = build_parser(selected).parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 2
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
