"""``vla-accel replay``: a rosbag2 through the node, its commands compared with the recorded ones.

Prints a one-line verdict (IDENTICAL, MATCH or DIVERGED at the tolerance it names: 1e-6 rad for a
deterministic recording, which replays bit-identically; for a live one, whose commands depend on
thread timing, two control periods of motion at the slowest joint's velocity limit), then the
kinds of input the node rejected, and writes ``summary.json``, the per-step ``replay_steps.csv``
and the ``replay.png`` plot into the report directory (``--summary``; default
outputs/replay/BAG_NAME).

Exit status: 0 done (with ``--check``: and reproduced), 1 ``--check`` failed, 2 the bag or the
options are bad, the arm is not the one the checkpoint was made for (another DOF always; the same
DOF unless ``--allow-unmatched-robot``), or the replay produced no command (the message says the
likely reason).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vla_accel_ros.rosbag.compare import DEFAULT_TOLERANCE, LIVE_TOLERANCE_PERIODS
from vla_accel_ros.rosbag.io import STORAGES
from vla_accel_ros.rosbag.replay_settings import MODES, ReplayOptions

REPORTS = Path("outputs") / "replay"  # the report directory without --summary: REPORTS/BAG_NAME


# --- command line ----------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", help="input rosbag2 directory (mcap or sqlite3)")
    parser.add_argument("--out", default="", help="write the produced commands into this new bag")
    parser.add_argument("--mode", default="deterministic", choices=MODES,
                        help="deterministic: the node's core in lock-step in bag order; realtime: the node "
                             "process over DDS following the bag's clock")
    parser.add_argument("--remap", nargs="*", default=[], metavar="FROM:=TO", help="rename bag topics on input")
    parser.add_argument("--summary", default="", metavar="DIR",
                        help=f"the report directory: summary.json, replay_steps.csv, replay.png (default: "
                             f"{REPORTS}/BAG_NAME)")
    parser.add_argument("--checkpoint", default="", help="policy checkpoint (default: the recording's, "
                        "else the package's)")
    parser.add_argument("--decoder", default="", help="decoder (default: the recording's, else kerv)")
    parser.add_argument("--control-rate", type=float, default=0.0, help="control rate in Hz (default: the "
                        "recording's, else 20)")
    parser.add_argument("--instruction", default="", help="task instruction when the bag has none")
    parser.add_argument("--storage", default="mcap", choices=STORAGES, help="storage of --out")
    parser.add_argument("--tolerance", type=float, default=None,
                        help=f"max |diff| (rad) that still counts as reproduced (default: {DEFAULT_TOLERANCE:g} for a "
                             f"deterministic recording; for a live one, {LIVE_TOLERANCE_PERIODS} control periods of "
                             "motion at the slowest joint's velocity limit)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the commands reproduce the "
                        "recorded ones within --tolerance")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long")
    parser.add_argument("--rate", type=float, default=1.0, help="realtime playback speed factor")
    parser.add_argument("--domain-id", type=int, default=0, help="ROS_DOMAIN_ID for realtime (0 = private)")
    parser.add_argument("--params-file", default="", metavar="YAML", help="the node's ROS 2 parameter file "
                        "(its vla_accel_node or /** section): over the recording's settings, under the flags")
    parser.add_argument("--urdf", default="", metavar="FILE", help="URDF of the arm (default: the params file's, "
                        "else the bag's /robot_description, else the package's)")
    parser.add_argument("--tcp-frame", default="", metavar="FRAME", help="URDF frame the policy's end-effector "
                        "deltas refer to (default: the params file's, else tcp)")
    parser.add_argument("--controller-joints", nargs="+", default=[], metavar="JOINT",
                        help="joint order of the arm controller's commands, recorded and written (default: the "
                             "params file's, else the URDF's arm order); names or one comma-separated list")
    parser.add_argument("--allow-unmatched-robot", action="store_true", help="replay on an arm of the checkpoint's "
                        "DOF that is not the robot it was made for (with a warning); another DOF never replays")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.rosbag.compare import no_command_cause, verdict  # the node's core: only when it runs
    from vla_accel_ros.rosbag.replayer import replay

    policy = {name: value for name, value in {"decoder": args.decoder, "checkpoint": args.checkpoint}.items()
              if value}  # given: over the recording's
    report = args.summary or str(REPORTS / (Path(args.bag).resolve().name or "bag"))
    opts = ReplayOptions(bag=args.bag, out=args.out, mode=args.mode, remap=tuple(args.remap),
                         summary=report, policy=policy, control_rate_hz=args.control_rate,
                         instruction=args.instruction, storage=args.storage,
                         tolerance=args.tolerance, timeout_s=args.timeout_s, rate=args.rate,
                         domain_id=args.domain_id, params_file=args.params_file, urdf=args.urdf,
                         tcp_frame=args.tcp_frame, allow_unmatched_robot=args.allow_unmatched_robot,
                         controller_joints=tuple(name.strip() for item in args.controller_joints
                                                 for name in item.split(",") if name.strip()))
    summary = replay(opts)  # a bad bag or setting, a timeout: one line (vla_accel_ros.cli)
    if summary.get("robot_warning"):
        print(f"replay: warning: {summary['robot_warning']}", file=sys.stderr, flush=True)
    print(verdict(summary), flush=True)
    if summary["errors"]:
        print(f"replay: the node rejected input of {len(summary['errors'])} kind(s):", flush=True)
        for line in summary["errors"]:
            print(f"  - {line}", flush=True)
    files = ", ".join(Path(summary[key]).name for key in ("steps_csv", "plot") if summary.get(key))
    print(f"replay -> {report} (summary.json{', ' + files if files else ''})", flush=True)
    if not summary["commands"]:  # nothing to diff: a replay that verifies nothing is not a success
        print(f"replay: error: no command produced: {no_command_cause(summary)}", file=sys.stderr, flush=True)
        return 2
    if args.check and not summary["within_tolerance"]:
        return 1
    return 0
