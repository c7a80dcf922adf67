"""``vla-accel vision-fidelity``: how far incremental vision is from the full prefill, frame by frame.

Incremental vision re-encodes only the image patches that changed since the previous frame
(``iv``), and with reused keys/values (``ivkv``) also keeps the cached attention state of the
unchanged ones: an approximation of the full prefill. The full prefill drives the episodes; each
frame's incremental prefix is compared with the full one (greedy action and tokens, hidden-state
error, share of patches re-encoded).
"""

from __future__ import annotations

import argparse
import json
import time

from vla_accel_ros.commands.closed_loop_options import add_episode_arguments, add_robot_arguments
from vla_accel_ros.commands.vision_options import add_vision_reuse_arguments, vision_config
from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.core.resources import default_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_episode_arguments(parser, episodes=10, episodes_help="episodes, driven by the full prefill")
    add_vision_reuse_arguments(parser)
    add_robot_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch  # torch and MuJoCo: only when it runs

    from vla_accel_ros.evaluation.robot_check import checkpoints_fit_robot, sim_robot
    from vla_accel_ros.evaluation.vision_fidelity import (
        MODES,
        FidelityRecord,
        driver_config,
        plot_fidelity,
        run_episode,
    )
    from vla_accel_ros.models import load_checkpoint
    from vla_accel_ros.runtime.builder import build_runner
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig

    if args.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    torch.set_num_threads(args.threads)
    ckpt = args.checkpoint or default_checkpoint()
    policy = load_checkpoint(ckpt)
    if policy.world is not None:
        raise ValueError(f"{ckpt} has a world-aware prefill, which incremental vision with reused keys/values "
                         "does not support")
    encoders = {mode: policy.incremental_prefill(vision_config(args, reuse_kv)) for mode, reuse_kv in MODES.items()}
    records = {mode: FidelityRecord() for mode in MODES}
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    successes = []
    with PickCubeEnv(SimConfig(image_size=policy.config.image_size, max_steps=args.max_steps)) as env:
        if not checkpoints_fit_robot("vision-fidelity", [ckpt], sim_robot(env), args.allow_unmatched_robot):
            return 2
        driver = build_runner(driver_config(env, args.max_steps, args.threads), env.kin, policy=policy)
        bar = progress_bar(range(args.episodes), desc="vision-fidelity", unit="ep")
        for i in bar:
            successes.append(run_episode(env, driver, encoders, records, args.seed + i))
            bar.success(sum(successes), len(successes))
    summaries = {mode: record.summary() for mode, record in records.items()}
    config = encoders["ivkv"].config
    meta = {"seed": args.seed, "episodes": args.episodes, "checkpoint": str(ckpt), "threshold": config.threshold,
            "refresh_steps": config.refresh_steps, "max_drift": config.max_drift,
            "driver_success_rate": float(np.mean(successes)), "wall_s": time.perf_counter() - start}
    (args.out / "summary.json").write_text(json.dumps({**summaries, "meta": meta}, indent=2))
    plot_fidelity(summaries, args.out / "fidelity.png")
    for mode, s in summaries.items():
        print(f"{mode}: greedy action equal to full {s['action_agreement']:.1%}, tokens equal "
              f"{s['token_agreement']:.1%} "
              f"(within 2: {s['token_within_2']:.1%}, max distance {s['max_token_distance']}), hidden error p50 "
              f"{s['hidden_rel_error_p50']:.2e} / p99 {s['hidden_rel_error_p99']:.2e}, "
              f"{s['recomputed_fraction']:.0%} of patches re-encoded")
    print(f"vision-fidelity: {sum(len(r.hidden_rel_error) for r in records.values()) // len(records)} frames of "
          f"{args.episodes} episodes in {meta['wall_s']:.0f} s -> {args.out} (summary.json, fidelity.png)")
    return 0
