"""``vla-accel replay``: a rosbag2 through the node, its commands diffed against the recorded ones.

Exit status: 0 done (with ``--check``: and reproduced), 1 ``--check`` failed, 2 the bag or the
options are bad, or the replay produced no command (the message says the likely reason).
"""

from __future__ import annotations

import argparse
import sys

from vla_accel_ros.rosbag.io import STORAGES, BagError
from vla_accel_ros.rosbag.replayer import (
    DEFAULT_TOLERANCE,
    MODES,
    ReplayOptions,
    no_command_cause,
    replay,
    verdict,
)


# --- command line ----------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", help="input rosbag2 directory (mcap or sqlite3)")
    parser.add_argument("--out", default="", help="write the produced commands into this new bag")
    parser.add_argument("--mode", default="deterministic", choices=MODES,
                        help="deterministic: the node's core in lock-step in bag order; realtime: the node "
                             "process over DDS following the bag's clock")
    parser.add_argument("--remap", nargs="*", default=[], metavar="FROM:=TO", help="rename bag topics on input")
    parser.add_argument("--summary", default="", metavar="DIR", help="write DIR/summary.json")
    parser.add_argument("--checkpoint", default="", help="policy checkpoint (default: the recording's, "
                        "else the package's)")
    parser.add_argument("--decoder", default="", help="decoder (default: the recording's, else kerv)")
    parser.add_argument("--control-rate", type=float, default=0.0, help="control rate in Hz (default: the "
                        "recording's, else 20)")
    parser.add_argument("--instruction", default="", help="task instruction when the bag has none")
    parser.add_argument("--storage", default="mcap", choices=STORAGES, help="storage of --out")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="max |diff| (rad) that still counts as reproduced")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the commands reproduce the "
                        "recorded ones within --tolerance")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long")
    parser.add_argument("--rate", type=float, default=1.0, help="realtime playback speed factor")
    parser.add_argument("--domain-id", type=int, default=0, help="ROS_DOMAIN_ID for realtime (0 = private)")


def run(args: argparse.Namespace) -> int:
    try:
        opts = ReplayOptions(bag=args.bag, out=args.out, mode=args.mode, remap=tuple(args.remap),
                             summary=args.summary, checkpoint=args.checkpoint, decoder=args.decoder,
                             control_rate_hz=args.control_rate, instruction=args.instruction, storage=args.storage,
                             tolerance=args.tolerance, timeout_s=args.timeout_s, rate=args.rate,
                             domain_id=args.domain_id)
        summary = replay(opts)
    except (BagError, ValueError, OSError, RuntimeError) as err:  # ReplayTimeout is a RuntimeError
        print(f"replay: error: {err}", file=sys.stderr, flush=True)
        return 2
    print(verdict(summary), flush=True)
    if not summary["commands"]:  # nothing to diff: a replay that verifies nothing is not a success
        print(f"replay: error: no command produced: {no_command_cause(summary)}", file=sys.stderr, flush=True)
        return 2
    if args.check and not summary["within_tolerance"]:
        return 1
    return 0
