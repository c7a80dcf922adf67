"""The ``vla-accel`` command: every run the ros2 CLI would do, for machines without it.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their subcommand runs, and they import torch,
MuJoCo and rclpy only inside ``run``, so ``--help`` answers at once.

Errors: a problem the user can fix or has to know about (a bad flag value; a checkpoint, bag, data
set or parameter file that is missing, truncated or of the wrong kind; a node that refuses to start
or a run that could not finish) is one ``<command>: error: ...`` line on stderr and exit status 2.
Those are the exceptions in :data:`~vla_accel_ros.core.errors.USER_ERRORS` (ValueError, OSError and
RunFailed). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from vla_accel_ros.core.errors import USER_ERRORS, SettingError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("vla_accel_ros.commands.sim", "run the MuJoCo sim bridge and the VLA node over DDS for N episodes"),
    "record": ("vla_accel_ros.commands.record", "record sim episodes with the node into a rosbag2 (mcap or sqlite3)"),
    "replay": ("vla_accel_ros.commands.replay",
               "replay a rosbag2 through the node and compare with its recorded commands"),
    "eval": ("vla_accel_ros.commands.eval", "closed-loop episodes of the policy in the sim with one decoder"),
    "bench": ("vla_accel_ros.commands.bench", "every decoder on the same seeded episodes, side by side, with plots"),
    "fleet-bench": ("vla_accel_ros.commands.fleet_bench",
                    "fleet benchmark: N robots on one batched inference process vs N processes"),
    "demos": ("vla_accel_ros.commands.demos", "record scripted-expert demonstrations in the MuJoCo sim"),
    "train": ("vla_accel_ros.commands.train",
              "train the built-in VLA (target, draft head, contact head) on demonstrations"),
    "train-flow": ("vla_accel_ros.commands.train_flow",
                   "train the continuous action head (10-step teacher, 2-step student)"),
    "train-parallel-draft": ("vla_accel_ros.commands.train_parallel_draft",
                             "train a parallel draft head (all draft tokens in one light call)"),
    "train-world": ("vla_accel_ros.commands.train_world",
                    "world-aware prefill: frame autoencoder + next-frame bias, then fine-tune"),
    "train-hf": ("vla_accel_ros.commands.train_hf",
                 "train a small Hugging Face VLA (Llava: SigLIP + Llama) in OpenVLA's layout"),
    "train-smolvla": ("vla_accel_ros.commands.train_smolvla",
                      "train a small SmolVLA-structured policy (LeRobot's layout) on demonstrations"),
    "train-draft": ("vla_accel_ros.commands.train_draft",
                    "train an EAGLE-style draft head on a Hugging Face VLA (hf:DIR) or an OpenVLA model"),
    "build-store": ("vla_accel_ros.commands.build_store",
                    "build HeiSD's store: demonstrated trajectories the heisd decoder drafts from"),
    "convert": ("vla_accel_ros.commands.convert",
                "an OpenVLA-OFT directory's .pt components as safetensors, once"),
    "serve-openpi": ("vla_accel_ros.commands.serve_openpi",
                     "serve a policy and its decoder over openpi's websocket policy-server protocol"),
    "predict": ("vla_accel_ros.commands.predict", "one observation in, its action and timings out, any checkpoint"),
    "vision-fidelity": ("vla_accel_ros.commands.vision_fidelity",
                        "incremental vision (re-encode changed patches only) against the full prefill"),
    "cost": ("vla_accel_ros.commands.cost",
             "a family's passes at its published shape, each against the device's measured bound"),
    "soak": ("vla_accel_ros.commands.soak", "the node for a long run at a control rate: is its memory flat?"),
    "sim-speed": ("vla_accel_ros.commands.sim_speed", "measure sim steps/s with and without rendering"),
}

# How ``vla-accel --help`` lists them: what each group is for, and its commands in order.
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "run": ("the node and the sim, bags, a policy server", ("sim", "record", "replay", "soak", "serve-openpi")),
    "evaluate": ("success rate and speed over seeded episodes", ("eval", "bench", "fleet-bench")),
    "train": ("demonstrations, models and their heads", ("demos", "train", "train-flow", "train-parallel-draft",
                                                         "train-world", "train-hf", "train-smolvla", "train-draft",
                                                         "build-store")),
    "inspect": ("one part up close", ("predict", "vision-fidelity", "cost", "sim-speed")),
    "models": ("published checkpoints", ("convert",)),
}

DESCRIPTION = ("Run, evaluate, train and inspect the VLA policy and its accelerated decoders,\n"
               "with or without a ROS 2 installation.")


def grouped_commands() -> str:
    """The commands under their groups, one line each (every command listed once)."""
    width = max(len(name) for name in COMMANDS) + 2
    listed = [name for _, names in GROUPS.values() for name in names]
    groups = dict(GROUPS)
    others = tuple(name for name in COMMANDS if name not in listed)
    if others:
        groups["other"] = ("", others)
    lines = []
    for group, (purpose, names) in groups.items():
        lines.append(f"{group}{': ' + purpose if purpose else ''}")
        lines += [f"  {name:<{width}}{COMMANDS[name][1]}" for name in names if name in COMMANDS]
    return "\n".join(lines)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option that takes a value and has a default says it in its help, unless the help
    already does."""
    for action in parser._actions:
        if (not action.option_strings or action.nargs == 0 or action.default in (None, "", [], ())
                or action.default is argparse.SUPPRESS or action.help is argparse.SUPPRESS):
            continue
        if action.help is None:
            action.help = "default: %(default)s"
        elif "default" not in action.help.lower():
            action.help += " (default: %(default)s)"


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla-accel", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"commands:\n{grouped_commands()}\n\n"
                                            "vla-accel COMMAND --help: its flags and their defaults")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="one of the commands below")
    for name, (module_name, help_text) in COMMANDS.items():
        if name != selected:
            sub.add_parser(name, description=help_text)  # no help=: listed by the epilog only
            continue
        module = importlib.import_module(module_name)
        sub_parser = sub.add_parser(name, description=command_description(module.__doc__, help_text),
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub_parser)
        show_defaults(sub_parser)
    return parser


def command_description(doc: str | None, help_text: str) -> str:
    """A command's ``--help`` text: its one line, then what its module's docstring says after its
    first paragraph (the terms its output uses), without the reST markup."""
    paragraphs = (doc or "").strip().split("\n\n")[1:]
    rest = re.sub(r":\w+:`~?([^`]+)`", r"\1", "\n\n".join(paragraphs)).replace("``", "")
    return f"{help_text}\n\n{rest}" if rest.strip() else help_text


# A node parameter whose command flag is not the parameter's name in dashes (``unnorm_key`` -> ``--unnorm-key``).
COMMAND_FLAGS = {"image_topics": "--cameras", "allow_stand_in_images": "--stand-in-images",
                 "kinematic_r_min": "--kinematic-r-bounds", "kinematic_r_max": "--kinematic-r-bounds"}


def command_flag(setting: str) -> str:
    """The flag a command takes for the node parameter ``setting``."""
    return COMMAND_FLAGS.get(setting, "--" + setting.replace("_", "-"))


def one_line(error: BaseException) -> str:
    """``error`` in one line, each setting a :class:`SettingError` in its chain names (raised here or
    wrapped by a caller) written as the command's flag."""
    text = str(error)
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, SettingError):
            for setting in seen.settings:
                text = re.sub(rf"(?<![\w-]){re.escape(setting)}(?![\w-])", command_flag(setting), text)
        seen = seen.__cause__ or seen.__context__
    return " ".join(text.split()) or type(error).__name__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    selected = next((a for a in argv if not a.startswith("-")), None)
    if selected is not None and selected not in COMMANDS:
        build_parser().error(f"unknown command '{selected}' (choose from {', '.join(COMMANDS)})")
    args = build_parser(selected).parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 2
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except USER_ERRORS as error:
        print(f"{args.command}: error: {one_line(error)}", file=sys.stderr, flush=True)
        return 2
    except SystemExit as done:  # raise SystemExit("reason") from a command: the same one line
        if not isinstance(done.code, str):
            raise
        print(f"{args.command}: error: {one_line(done)}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
