"""A token VLA's full against its incremental prefill over the camera frames of a scripted pick
(``vla-accel cost --checkpoint DIR --incremental``).

The first ``frames`` observations of a scripted-expert pick in the sim, at the model's image size,
on the first held-out seed, are prefilled in order, each frame in full and incrementally (the
policy's ``incremental_prefill``: the keys and values of unchanged image tokens reused, with the
given :class:`~vla_accel_ros.models.configuration.VisionReuseConfig`); the two alternate per frame,
so that machine noise hits both alike. Reported: the mean and median ms per frame of each, the ratio
of the means (time per frame) and of the medians, the mean fraction of the image tokens recomputed
(and of the patches the tower ran on) and the number of full refreshes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.configuration import VisionReuseConfig


def expert_frames(image_size: int, n: int) -> list[Observation]:
    """The first ``n`` observations (fewer if it ends sooner) of a scripted-expert pick at
    ``image_size`` px, on the first held-out seed: what the camera sees while the arm moves."""
    from vla_accel_ros.core.seeds import EVAL_SEED_START
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
    from vla_accel_ros.sim.expert import ScriptedExpert

    with PickCubeEnv(SimConfig(image_size=image_size, max_steps=n)) as env:
        expert = ScriptedExpert(env)
        obs = env.reset(EVAL_SEED_START)
        frames = [obs]
        while len(frames) < n and not env.done:
            obs, _ = env.step(expert.act(obs))
            frames.append(obs)
    return frames


def measure_incremental(policy: Any, frames: list[Observation], config: VisionReuseConfig) -> dict[str, Any]:
    """Full against incremental prefill over ``frames`` in order (module docstring)."""
    import torch

    incremental = policy.incremental_prefill(config)
    full_ms, incremental_ms, fractions, tower_fractions, refreshes = [], [], [], [], 0
    with torch.inference_mode():
        policy.prefill(frames[0])  # warm-up
        for obs in frames:
            t0 = time.perf_counter()
            policy.prefill(obs)
            t1 = time.perf_counter()
            incremental.prefill(obs)
            t2 = time.perf_counter()
            full_ms.append((t1 - t0) * 1e3)
            incremental_ms.append((t2 - t1) * 1e3)
            assert incremental.last is not None
            fractions.append(incremental.last.fraction)
            tower_fractions.append(1.0 if incremental.last_tower is None else incremental.last_tower.fraction)
            refreshes += incremental.last.refreshed
    return {
        "frames": len(frames),
        "prefill_full_ms_mean": statistics.fmean(full_ms),
        "prefill_full_ms_p50": statistics.median(full_ms),
        "prefill_incremental_ms_mean": statistics.fmean(incremental_ms),
        "prefill_incremental_ms_p50": statistics.median(incremental_ms),
        "incremental_prefill_speedup": statistics.fmean(full_ms) / statistics.fmean(incremental_ms),
        "incremental_prefill_speedup_p50": statistics.median(full_ms) / statistics.median(incremental_ms),
        "recomputed_fraction_mean": statistics.fmean(fractions),
        # the share of the patches the vision tower ran on (1 without reuse_tower)
        "tower_recomputed_fraction_mean": statistics.fmean(tower_fractions),
        "refreshes": refreshes,
    }
