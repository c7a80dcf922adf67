"""``vla-accel eval``: closed-loop episodes of the policy in the sim with one decoder.

The result line gives the success rate and the NCF rate (near-contact failures: failed episodes
whose gripper came within 2 cm of the cube), the target passes per action and the latencies, and
names the files written.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vla_accel_ros.commands.closed_loop_options import (
    add_camera_arguments,
    add_episode_arguments,
    add_robot_arguments,
    add_sampling_arguments,
    sampling_config,
    stand_in_images,
)
from vla_accel_ros.commands.vision_options import add_vision_arguments, vision_config
from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.core.seeds import EVAL_SEED_START
from vla_accel_ros.core.settings import parse_r_bounds
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.specs import (
    BASELINE,
    names,
    names_with,
    shared_settings,
    spec_of,
)
from vla_accel_ros.decoding.wa_prefill import WA_PREFILL_PREFIX, split_prefill
from vla_accel_ros.ros.parameters import NodeConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--decoder", default=BASELINE, metavar="DECODER",
                        help=f"decoding method: {', '.join(names())}, or {WA_PREFILL_PREFIX}<one of them> "
                             "(that decoder on the world-aware prefill, see --wa-checkpoint)")
    add_episode_arguments(parser)
    parser.add_argument("--device", default="", help="where the policy runs: cpu, cuda or cuda:N (default: the CPU); "
                                                     "a device this torch cannot use is refused before loading")
    parser.add_argument("--kf-fill-check", action="store_true",
                        help=f"{', '.join(names_with(lambda s: s.fill_check))}: check the Kalman filter's fill of a "
                             "rejected suffix against the target's own picks from the same verify pass")
    parser.add_argument("--kinematic-r-bounds", type=parse_r_bounds, default=None, metavar="R_MIN:R_MAX",
                        help="kerv, world_aware: the bounds of the kinematic acceptance threshold, in token bins "
                             "(default: the model's, with its kf_fill_check: its vla_spec.json's kinematic_r_bounds, "
                             "else 5:15 for the package's policies and 2:6 with the fill check for a model trained "
                             "elsewhere)")
    parser.add_argument("--store", type=Path, default=None,
                        help=f"{', '.join(names_with(lambda s: s.retrieval_store))}: retrieval store directory "
                             "(default: CHECKPOINT/retrieval_store; see vla-accel build-store)")
    parser.add_argument("--wa-checkpoint", type=Path, default=None,
                        help=f"checkpoint with a world component (vla-accel train-world) for --decoder "
                             f"{WA_PREFILL_PREFIX}X (default: --checkpoint, which must then have one)")
    add_camera_arguments(parser)
    add_vision_arguments(parser)
    add_sampling_arguments(parser)
    add_robot_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import torch  # torch, MuJoCo and the models: only when it runs

    from vla_accel_ros.evaluation.decoder_options import decoder_options
    from vla_accel_ros.evaluation.episode import (
        checkpoint_megabytes,
        peak_rss_mb,
        plot_latency,
        run_episode,
        summarize,
    )
    from vla_accel_ros.evaluation.robot_check import checkpoints_fit_robot, sim_robot
    from vla_accel_ros.models.load import check_device, load_policy, resolve_checkpoint
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner, run_defaults
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
    from vla_accel_ros.sim.gl import check_rendering

    if args.episodes < 1:
        raise ValueError("--episodes must be >= 1")
    if args.device:  # before the sim or a model loads
        check_device(args.checkpoint or default_checkpoint(), args.device)
    if not check_rendering("eval"):  # no GL: one line saying what to set, before any work
        return 2
    if args.seed < EVAL_SEED_START:
        print(f"warning: seed {args.seed} < {EVAL_SEED_START} may overlap the training demonstrations")
    torch.set_num_threads(args.threads)
    base_decoder, wa_prefill = split_prefill(args.decoder)
    if args.wa_checkpoint is not None and not wa_prefill:
        raise ValueError(f"--wa-checkpoint is for --decoder {WA_PREFILL_PREFIX}X, not {args.decoder}")
    ckpt = (args.wa_checkpoint if wa_prefill else None) or args.checkpoint or default_checkpoint()
    policy = load_policy(ckpt, unnorm_key=args.unnorm_key, device=args.device or None)
    if wa_prefill and policy.world is None:
        raise ValueError(f"{ckpt} has no world component for --decoder {args.decoder}: run vla-accel train-world")
    if spec_of(base_decoder).flow_head and not policy.capabilities().flow_head:
        raise ValueError(f"{ckpt} has no continuous action head for --decoder {args.decoder}: run vla-accel "
                         "train-flow")
    # what the flags leave to the model: its temperature, kinematic bounds and checked fill (RunDefaults)
    defaults = run_defaults(resolve_checkpoint(ckpt, unnorm_key=args.unnorm_key))
    sampling = sampling_config(args, defaults.temperature)
    model = RunnerConfig(decoder=base_decoder, temperature=sampling.temperature, kf_fill_check=args.kf_fill_check,
                         kinematic_r_bounds=args.kinematic_r_bounds).for_model(defaults)
    cameras, stand_ins = stand_in_images(args, policy.capabilities().image_slots)
    settings = decoder_options(base_decoder, args.store, args.checkpoint or default_checkpoint(), policy, ckpt)
    settings.update(shared_settings(base_decoder, fill_check=model.kf_fill_check,
                                    kinematic_r_bounds=model.kinematic_r_bounds))
    decoder = make_decoder(base_decoder, **settings)
    args.out.mkdir(parents=True, exist_ok=True)
    # a two-camera policy (front, wrist) sees the sim's wrist camera as its second image slot
    sim_config = SimConfig(image_size=policy.config.image_size, max_steps=args.max_steps, wrist_image=cameras > 1)
    records = []
    start = time.perf_counter()
    with PickCubeEnv(sim_config) as env:
        if not checkpoints_fit_robot("eval", [ckpt], sim_robot(env), args.allow_unmatched_robot):
            return 2
        settings = RunnerConfig(decoder=base_decoder, temperature=sampling.temperature,
                                vision=vision_config(args) if args.vision != "full" else None,
                                action_dt_s=env.control_dt, period_s=env.control_dt, max_steps=args.max_steps,
                                torch_threads=args.threads, device=args.device, stand_in_images=stand_ins > 0)
        try:
            runner = build_runner(settings, env.kin, policy=policy, decoder=decoder)
        except ValueError as err:  # a setting this policy refuses (e.g. --vision incremental on a Hugging Face VLA)
            raise ValueError(f"{ckpt}: {err}") from err
        bar = progress_bar(range(args.episodes), desc=f"eval {args.decoder}", unit="ep")
        for i in bar:
            records.append(run_episode(env, runner, args.seed + i))
            bar.success(sum(r.success for r in records), len(records))
    summary = summarize(records)
    summary.update(
        decoder=args.decoder,
        vision=args.vision,
        temperature=sampling.temperature,
        kf_fill_check=model.kf_fill_check,
        kinematic_r_bounds=model.kinematic_r_bounds,
        cameras=cameras,
        stand_in_images=stand_ins,
        seed=args.seed,
        device=args.device or "cpu",
        checkpoint=str(ckpt),
        params=sum(policy.n_parameters().values()),
        params_by_part=policy.n_parameters(),
        checkpoint_mb=checkpoint_megabytes(ckpt),
        peak_rss_mb=peak_rss_mb(),
        wall_s=time.perf_counter() - start,
        per_episode=[{"seed": r.seed, "success": r.success, "steps": r.steps, "min_clearance": r.min_clearance}
                     for r in records],
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_latency(records, args.out / "latency.png", f"{args.decoder}: per-step latency")
    lat = summary["latency_ms"]
    node_timeout_s = NodeConfig.action_timeout_s  # the node's default: an action older than it is never used
    late = (f"; at {lat['wall_p50']:.0f} ms per action the node's actions would expire before use (action_timeout_s "
            f"{node_timeout_s:g} s): raise action_timeout_s above it, or use a faster decoder or device"
            if lat["wall_p50"] > node_timeout_s * 1e3 else "")
    print(
        f"eval {args.decoder} (temperature {sampling.temperature:g}): success {summary['success_rate']:.1%} "
        f"over {summary['episodes']} episodes, "
        f"NCF (near-contact failures) {summary['ncf_rate']:.1%}, {summary['target_passes_per_action']:.2f} target "
        f"passes/action, prefill {lat['prefill_p50']:.2f} ms, decode {lat['decode_p50']:.2f} ms, total p50 "
        f"{lat['total_p50']:.2f} / p99 {lat['total_p99']:.2f} ms, policy steps {summary['policy_tick_share']:.0%} "
        f"-> {args.out} (summary.json, latency.png){late}"
    )
    if "verify_skip_share" in summary:
        query = summary["retrieval_query_ms_p50"]
        print(f"  retrieval mode on {summary['retrieval_mode_share']:.0%} of model steps, retrieved actions accepted "
              f"{summary['retrieval_accept_rate']:.0%}, verify-skipped steps {summary['verify_skip_share']:.0%}, "
              f"query p50 {'n/a' if query is None else f'{query:.3f} ms'}")
    if summary["episodes_without_policy_steps"]:
        seeds = ", ".join(str(seed) for seed in summary["episodes_without_policy_steps"])
        print(f"eval: FAILED: no step of the episode(s) of seed {seeds} took its action from the policy "
              f"(in the node: raise action_timeout_s above the inference time, {lat['wall_p50']:.0f} ms p50)")
        return 1
    return 0
