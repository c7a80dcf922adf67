"""``vla-accel record``: sim episodes with the node, into a rosbag2 (mcap or sqlite3).
"""

from __future__ import annotations

import argparse

from vla_accel_ros.decoding.specs import DEFAULT
from vla_accel_ros.ros.parameters import MODEL_DEFAULT, PolicySettings
from vla_accel_ros.rosbag.io import STORAGES, TOPICS
from vla_accel_ros.rosbag.recorder import MODES, RecordOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=1, help="number of seeded episodes")
    parser.add_argument("--out", default="outputs/bags/sim", help="bag directory to create")
    parser.add_argument("--storage", default="mcap", choices=STORAGES, help="rosbag2 storage plugin")
    parser.add_argument("--mode", default="live", choices=MODES,
                        help="live: bridge + node processes over DDS; deterministic: in-process lock-step "
                             "(replay reproduces it exactly)")
    parser.add_argument("--decoder", default=DEFAULT, help="action decoder of the node")
    parser.add_argument("--temperature", type=float, default=float(MODEL_DEFAULT),
                        help="the node's action-token sampling temperature, 0 = greedy; -1 = the model's (its "
                             "vla_spec.json's, else 0.5 for the package's policies and 0 for a model trained "
                             "elsewhere); stored, so that a replay samples alike")
    parser.add_argument("--kf-fill-check", action="store_true",
                        help="kerv, world_aware: the node's kf_fill_check (stored, so that a replay decodes alike)")
    parser.add_argument("--control-rate", type=float, default=20.0, help="node control rate (Hz)")
    parser.add_argument("--seed", type=int, default=100_000, help="seed of the first episode (then +1 each)")
    parser.add_argument("--checkpoint", default="", help="policy checkpoint directory (default: the package's)")
    parser.add_argument("--duration-s", type=float, default=8.0, help="episode time limit (sim seconds)")
    parser.add_argument("--domain-id", type=int, default=0, help="ROS_DOMAIN_ID for live mode (0 = private)")
    parser.add_argument("--cameras", type=int, default=1, choices=(1, 2),
                        help="2: record the wrist camera too (/wrist_camera/image_raw), for a two-camera policy")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.rosbag.recorder import record  # the sim and the node: only when it runs

    policy = PolicySettings(checkpoint=args.checkpoint, decoder=args.decoder, temperature=args.temperature,
                            kf_fill_check=args.kf_fill_check)
    opts = RecordOptions(episodes=args.episodes, out=args.out, storage=args.storage, mode=args.mode,
                         policy=policy, control_rate_hz=args.control_rate, seed=args.seed,
                         duration_s=args.duration_s, domain_id=args.domain_id, cameras=args.cameras)
    s = record(opts)
    missing = [t for t in (TOPICS["camera"][0], TOPICS["joint_states"][0], TOPICS["commands"][0])
               if not s["messages"].get(t)]
    print(f"record ({s['mode']}, {s['storage']}): {s['episodes']} episodes, success {s['success_rate']:.0%}, "
          f"{s['policy_tick_share']:.1%} policy ticks, {s['frames']} frames, {s['commands']} commands, "
          f"{sum(s['messages'].values())} messages in "
          f"{s['wall_s']:.0f} s -> {s['bag']}" + (f"; WARNING: nothing on {', '.join(missing)}" if missing else ""),
          flush=True)
    if s["no_policy_tick"]:  # a bag of a policy that never drove the arm: the last line says why
        print(f"record: FAILED: {s['no_policy_tick']}", flush=True)
        return 1
    return 1 if missing else 0
