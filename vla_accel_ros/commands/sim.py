"""``vla-accel sim``: the MuJoCo bridge and the VLA node as two processes over DDS, for N episodes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vla_accel_ros.commands.vision_options import add_vision_arguments, vision_config
from vla_accel_ros.core.chunks import CHUNK_ANCHORS, CHUNK_BLENDS, CHUNK_EXECUTIONS, CHUNK_MODES, ChunkSettings
from vla_accel_ros.core.errors import SettingError
from vla_accel_ros.core.settings import ConfigError, parse_r_bounds
from vla_accel_ros.decoding.specs import DEFAULT
from vla_accel_ros.models.api import REMOTE_PREFIXES
from vla_accel_ros.ros.parameters import INFERENCE_MODES, MODEL_DEFAULT, OUTPUT_FORMATS, PolicySettings

if TYPE_CHECKING:
    from vla_accel_ros.ros.launcher import SimRunOptions

# The node parameters a flag of this command sets (vla_accel_ros/cli.py names the flag in an error).
NODE_SETTINGS_FLAGGED = ("image_topics", "allow_stand_in_images", "kf_fill_check", "kinematic_r_min",
                         "kinematic_r_max", "unnorm_key", "action_timeout_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=3, help="number of seeded episodes")
    parser.add_argument("--control-rate", type=float, default=20.0, help="node control rate (Hz)")
    parser.add_argument("--decoder", default=DEFAULT, help="action decoder of the node")
    parser.add_argument("--decoders", default="", help="comma-separated: run the node with each decoder on the same "
                        "seeds (OUT/DECODER) and compare their live inference latency with the first's "
                        "(OUT/decoders.json)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="the node's action-token sampling temperature, 0 = greedy (default: the model's: its "
                             "vla_spec.json's, else 0.5 for the package's policies and 0 for a model trained "
                             "elsewhere)")
    parser.add_argument("--kf-fill-check", action="store_true",
                        help="kerv, world_aware: check the Kalman filter's fill of a rejected suffix against the "
                             "target's own picks from the same verify pass (the node's kf_fill_check)")
    parser.add_argument("--kinematic-r-bounds", type=parse_r_bounds, default=None, metavar="R_MIN:R_MAX",
                        help="kerv, world_aware: the bounds of the kinematic acceptance threshold, in token bins "
                             "(the node's kinematic_r_min and kinematic_r_max; default: the model's, with its "
                             "kf_fill_check: its vla_spec.json's kinematic_r_bounds, else 5:15 for the package's "
                             "policies and 2:6 with the fill check for a model trained elsewhere)")
    parser.add_argument("--out", default="outputs/sim", help="output directory")
    parser.add_argument("--seed", type=int, default=100_000, help="seed of the first episode (then +1 each)")
    parser.add_argument("--checkpoint", default="", help="policy checkpoint directory of any family, as published "
                        "(default: the package's)")
    parser.add_argument("--policy-spec", type=Path, default=None, help="openpi://HOST:PORT only: the JSON file naming "
                        "the server's observation keys and action space (default: LIBERO's keys, our actions)")
    parser.add_argument("--unnorm-key", default="", help="a token VLA with several datasets (OpenVLA, OpenVLA-OFT, a "
                        "Hugging Face VLA): the dataset of its statistics (default: the only one)")
    parser.add_argument("--device", default="", help="where the policy runs: cpu, cuda or cuda:N (the node's device; "
                        "default: the CPU); a device this torch cannot use is refused before any process starts")
    parser.add_argument("--duration-s", type=float, default=6.0, help="episode time limit (sim seconds)")
    parser.add_argument("--output", default="forward_position", choices=OUTPUT_FORMATS, help="command format")
    parser.add_argument("--executor", default="single", choices=("single", "multi"), help="node executor")
    parser.add_argument("--domain-id", type=int, default=0, help="ROS_DOMAIN_ID (0 = private, from the pid)")
    parser.add_argument("--inference-mode", default="process", choices=INFERENCE_MODES,
                        help="run inference in a thread of the node, in a child process, or remote: in "
                             "vla_inference_node over DDS")
    parser.add_argument("--netns", action="store_true", help="remote mode: run vla_inference_node in a network "
                        "namespace of its own, joined by a veth pair (needs root), as a second host would")
    parser.add_argument("--inference-python", default="", help="the interpreter of the node's inference process "
                        "(a virtual environment with this package installed; default: this one)")
    parser.add_argument("--realtime-priority", type=int, default=20,
                        help="SCHED_FIFO priority of the control thread (0 = normal scheduling)")
    parser.add_argument("--params-file", default="", metavar="YAML",
                        help="the node's ROS 2 parameter file, as the launch files take: any node parameter; the "
                             "flags here apply over it where they differ from the node's defaults, and the sim's "
                             "robot, topics, control rate, inference mode and lifecycle always apply")
    parser.add_argument("--action-timeout-s", type=float, default=None,
                        help="the node's action_timeout_s: a policy action whose observation is older than this "
                             "at a tick is dropped (default: the params file's, else 0.5); set it above the "
                             "policy's inference time")
    parser.add_argument("--allow-unmatched-robot", action="store_true",
                        help="run a checkpoint made for another arm with the same DOF, with a warning (the node's "
                             "allow_unmatched_robot); a different DOF never runs")
    add_vision_arguments(parser)  # the node's vision_* parameters
    chunks = ChunkSettings()
    parser.add_argument("--cameras", type=int, default=1, choices=(1, 2),
                        help="2: the bridge publishes the wrist camera too and the node takes both (image_topics)")
    parser.add_argument("--stand-in-images", action="store_true",
                        help="run a policy that reads more images than --cameras gives, each missing one a copy of "
                             "the scene camera's image (the node's allow_stand_in_images)")
    parser.add_argument("--chunk-execution", default=chunks.chunk_execution, choices=CHUNK_EXECUTIONS,
                        help="the node's chunk_execution")
    parser.add_argument("--chunk-blend", default=chunks.chunk_blend, choices=CHUNK_BLENDS,
                        help="the node's chunk_blend")
    parser.add_argument("--chunk-refill-threshold", type=float, default=chunks.chunk_refill_threshold,
                        help="the node's chunk_refill_threshold (fraction of a chunk)")
    parser.add_argument("--chunk-verify-threshold", type=float, default=chunks.chunk_verify_threshold_rad,
                        help="the node's chunk_verify_threshold_rad (0 = no kinematic chunk verification)")
    parser.add_argument("--chunk-anchor", default=chunks.chunk_anchor, choices=CHUNK_ANCHORS,
                        help="the node's chunk_anchor (step: each delta from the measured position at its tick)")
    parser.add_argument("--rtc-horizon", type=int, default=0, help="flow10, flow2: real-time chunking, the steps of "
                        "each chunk guided towards the previous chunk's plan (the node's rtc_horizon; 0 = off)")
    parser.add_argument("--rtc-guidance", type=float, default=5.0, help="real-time chunking's largest guidance gain "
                        "(the node's rtc_guidance)")
    parser.add_argument("--chunk-modes", default="", help="comma-separated, of " + ", ".join(CHUNK_MODES) +
                        ": run the node in each on the same seeds (OUT/MODE), compare them (OUT/chunk_modes.json) "
                        "and plot their commands with the chunk boundaries (OUT/chunk_execution.png); with "
                        "--decoders, every decoder in every mode (OUT/DECODER/MODE; DECODER+iv: with incremental "
                        "vision)")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.core.resources import default_checkpoint
    from vla_accel_ros.models.load import check_device
    from vla_accel_ros.ros.launcher import run_sim, run_sim_decoders  # the node processes: only when it runs

    opts = sim_options(args)
    if opts.policy.device:  # before any process starts
        check_device(opts.policy.checkpoint or default_checkpoint(), opts.policy.device)
    started = time.monotonic()
    if args.chunk_modes:
        decoders = [d.strip() for d in args.decoders.split(",") if d.strip()] or None
        return _run_chunk_modes(opts, [m.strip() for m in args.chunk_modes.split(",") if m.strip()], decoders)
    if args.decoders:
        result = run_sim_decoders(opts, [d.strip() for d in args.decoders.split(",") if d.strip()])
        base = result["baseline"]
        print(f"| decoder | success | inference ms p50 | p99 | target passes | latency vs {base} |")
        print("|---|---|---|---|---|---|")
        for row in result["decoders"]:
            print(f"| {row['decoder']} | {row['success_rate']:.0%} | {row['inference_latency_ms_p50']:.2f} | "
                  f"{row['inference_latency_ms_p99']:.2f} | {row['inference_target_passes_mean']:.2f} | "
                  f"{row[f'latency_ratio_vs_{base}']:.2f} |")
        print(f"sim -> {opts.out} (decoders.json, DECODER/summary.json)")
        return 0
    try:
        s = run_sim(opts)
    except ConfigError as refused:  # the node refused a setting: its message names the flag that sets it here
        raise SettingError(str(refused), *NODE_SETTINGS_FLAGGED) from refused
    print(f"sim: {s['episodes']} episodes, success {s['success_rate']:.0%}, {s['ticks']} ticks at "
          f"{opts.control_rate_hz:g} Hz ({s['ticks_published']} published, {s['fallback_ticks']} fallback, "
          f"{s['hold_ticks']} hold, {s['deadline_misses']} deadline misses; in the episodes "
          f"{s['hold_tick_share']:.1%} hold, {s['policy_tick_share']:.1%} policy, {s['pre_episode_ticks']} ticks "
          f"before the first), jitter p50 "
          f"{s['period_jitter_ms_p50']:.2f} ms p99 {s['period_jitter_ms_p99']:.2f} ms, peak RSS "
          f"{s['peak_rss_mb']:.0f} MB, {time.monotonic() - started:.0f} s -> {opts.out} "
          f"(summary.json{''.join(', ' + name for name in s.get('plots', ()))})")
    if opts.inference_mode == "remote":
        print(f"sim: remote inference round trip p50 {s['inference_round_trip_ms_p50']:.1f} ms, p99 "
              f"{s['inference_round_trip_ms_p99']:.1f} ms; {s['inference_lost']} lost, "
              f"{s['inference_dropped_late']} late")
    if s["no_policy_tick"]:  # the policy never drove the arm: the last line says why and what to change
        print(f"sim: FAILED: {s['no_policy_tick']}")
        return 1
    return 0


def _run_chunk_modes(opts: SimRunOptions, modes: list[str], decoders: list[str] | None) -> int:
    from vla_accel_ros.ros.chunk_runs import run_chunk_modes  # the node processes: only when it runs

    result = run_chunk_modes(opts, modes, decoders=decoders)
    grid = decoders is not None
    print(("| decoder | chunk ms p50 | throughput vs first | image tokens recomputed " if grid else "")
          + "| mode | success | actions/s | chunk-wait ticks | obs->action ms p50 | p99 | jerk rms | jerk max | "
          "largest boundary step (rad) | early re-plans | inferences/action |")
    print("|---" * (15 if grid else 11) + "|")
    for row in result["modes"]:
        lead = ([row["decoder"], f"{row['inference_latency_ms_p50']:.1f}", f"{row['chunk_throughput_vs_first']:.2f}",
                 f"{row['vision_recomputed_mean']:.0%}" if row["vision_recomputed_mean"] is not None else "-"]
                if grid else [])
        cells = [*lead, row["mode"], f"{row['success_rate']:.0%}", f"{row['actions_per_s']:.1f}",
                 f"{row['chunk_wait_tick_share']:.1%}", f"{row['obs_to_action_ms_p50']:.0f}",
                 f"{row['obs_to_action_ms_p99']:.0f}", f"{row['jerk_rms']:.1f}", f"{row['jerk_max']:.1f}",
                 f"{row['chunk_boundary_step_max']:.4f}", str(row["chunk_replans"]),
                 f"{row['inferences_per_action']:.3f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"sim: -> {opts.out}/chunk_modes.json, {opts.out}/chunk_execution.png")
    return 0


def sim_options(args: argparse.Namespace) -> SimRunOptions:
    """The run's options from the flags; ValueError naming a bad one."""
    from vla_accel_ros.ros.launcher import SimRunOptions

    r_min, r_max = args.kinematic_r_bounds or (MODEL_DEFAULT, MODEL_DEFAULT)
    checkpoint = args.checkpoint
    if args.policy_spec is not None:
        if not checkpoint.startswith(REMOTE_PREFIXES):
            raise ValueError("--policy-spec goes with --checkpoint openpi://HOST:PORT (a policy server)")
        if not args.policy_spec.is_file():
            raise ValueError(f"--policy-spec {args.policy_spec}: no such file")
        checkpoint += f"{'&' if '?' in checkpoint else '?'}spec={args.policy_spec.resolve()}"
    policy = PolicySettings(checkpoint=checkpoint, unnorm_key=args.unnorm_key, decoder=args.decoder,
                            temperature=MODEL_DEFAULT if args.temperature is None else args.temperature,
                            kf_fill_check=args.kf_fill_check,
                            kinematic_r_min=r_min, kinematic_r_max=r_max, rtc_horizon=args.rtc_horizon,
                            rtc_guidance=args.rtc_guidance, device=args.device)
    return SimRunOptions(episodes=args.episodes, control_rate_hz=args.control_rate, policy=policy, out=args.out,
                         seed=args.seed, inference_python=args.inference_python, duration_s=args.duration_s,
                         output=args.output, executor=args.executor, domain_id=args.domain_id,
                         inference_mode=args.inference_mode, netns=args.netns, realtime_priority=args.realtime_priority,
                         vision=vision_config(args) if args.vision != "full" else None,
                         allow_unmatched_robot=args.allow_unmatched_robot, cameras=args.cameras,
                         stand_in_images=args.stand_in_images,
                         params_file=args.params_file, action_timeout_s=args.action_timeout_s,
                         chunks=ChunkSettings(chunk_execution=args.chunk_execution, chunk_blend=args.chunk_blend,
                                              chunk_refill_threshold=args.chunk_refill_threshold,
                                              chunk_verify_threshold_rad=args.chunk_verify_threshold,
                                              chunk_anchor=args.chunk_anchor))
