"""``vla-accel hf-cost``: what the passes of a Hugging Face VLA at (toward) OpenVLA's shape cost on
this machine, and the end-to-end speed-up each decoder's pass counts imply there.

A random-weight Llava (a small SigLIP tower, 256 image tokens at 224 px / patch 14; a Llama of
``hidden`` width and ``layers`` layers, 32000 text ids) runs through :class:`HFTokenVLA`, the policy
the decoders drive, on one thread. Timed, median of ``repeats``: the prefill; a 1-token step (what
``ar`` takes 7 of); a 6-token verify pass (what ``kerv`` takes one of: 7 rows, the proposal's last
token is not fed); the prefill with 6 proposed tokens verified inside it (``world_aware`` in free
space); and the vision tower with its projector alone (``vision_ms``), which every frame of an
incremental prefill still runs. With ``checkpoint`` (``hf:DIR``) the same is timed on that model at
its own image size instead of a random one. A decoder's implied time per action = prefill + passes
x the pass it makes; its speed-up is ``ar``'s time over it. The pass counts are the bench's (README),
given as ``--passes``.

With ``incremental``, the prefill is also timed over the first ``frames`` camera frames of a
scripted-expert pick in the sim at ``image_size`` px, frame by frame, in full and incremental
(the policy's ``incremental_prefill``, reused keys/values of the
unchanged image tokens, with ``vision``'s settings); the two alternate per frame, so that machine
noise hits both alike. Reported: the mean and median ms per frame of each, the ratio of the means
(time per frame) and of the medians, the mean fraction of image tokens recomputed and the number of
full refreshes.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding import specs
from vla_accel_ros.models.configuration import VisionReuseConfig

# target passes per action measured by the bench (README, 10 episodes x 2 repeats)
BENCH_PASSES = {specs.AR.name: 7.0, specs.SD.name: 1.24, specs.KervReleased.name: 1.15, specs.Kerv.name: 1.00,
                specs.Deadline.name: 1.17}
# verified inside the prefill in free space (72% of world_aware's actions)
IN_PREFILL = specs.names_with(lambda spec: spec.verifies_in_prefill)


@dataclass(frozen=True)
class CostOptions:
    hidden: int = 1024
    layers: int = 8
    image_size: int = 224
    patch_size: int = 14
    repeats: int = 10
    threads: int = 1
    out: str = "outputs/hf_cost"
    checkpoint: str = ""  # hf:DIR: time this model instead of a random one at the shape above
    incremental: bool = False  # also time the incremental prefill over sim frames
    frames: int = 60
    vision: VisionReuseConfig = field(default_factory=lambda: VisionReuseConfig(reuse_kv=True))

    def __post_init__(self) -> None:
        if self.hidden % 64 or self.layers < 1 or self.repeats < 1:
            raise ValueError("hidden must be a multiple of 64, layers and repeats positive")
        if self.frames < 2:
            raise ValueError("frames must be >= 2 (the first is a full prefill either way)")
        if not self.vision.reuse_kv:
            raise ValueError("a Hugging Face VLA's incremental prefill reuses keys/values: "
                             "vision.reuse_kv must be true")


def _median_ms(run: Callable[[], Any], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def build_model(opts: CostOptions, directory: Path) -> Any:
    """The random-weight VLA at ``opts``'s shape, saved and loaded as ``hf:directory``."""
    from vla_accel_ros.models.hf.checkpoint import load_hf_vla
    from vla_accel_ros.training.hf_vla import (
        HFTrainConfig,
        build_hf_vla,
        write_side_files,
    )

    cfg = HFTrainConfig(data="", out=str(directory), vision="siglip", patch_size=opts.patch_size, vision_hidden=96,
                        vision_layers=2, vision_heads=4, hidden_size=opts.hidden, layers=opts.layers,
                        heads=opts.hidden // 64, kv_heads=opts.hidden // 64,
                        intermediate_size=int(opts.hidden * 2.6875), text_vocab=32000)
    build_hf_vla(directory, cfg, opts.image_size)
    stats = {"q01": [-0.01] * 6 + [0.0], "q99": [0.01] * 6 + [1.0], "mask": [True] * 6 + [False]}
    write_side_files(directory, {"sim": {"action": stats}}, opts.image_size)
    return load_hf_vla(directory)


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


def measure(opts: CostOptions) -> dict[str, Any]:
    import torch  # here, not at the top: CostOptions gives vla-accel hf-cost --help its defaults

    torch.set_num_threads(opts.threads)
    if opts.checkpoint:
        from vla_accel_ros.models.load import load_policy

        policy = load_policy(opts.checkpoint)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            policy = build_model(opts, Path(tmp) / "vla")
    size = int(policy.config.image_size)
    rng = np.random.default_rng(0)
    obs = Observation(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "pick up the red cube", np.zeros(7),
                      0.04, 0.0)
    pixels = policy.pixel_values(obs.image)
    one, six = torch.tensor([[3]]), torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.inference_mode():
        prefix = policy.prefill(obs)
        costs = {
            "prefill_ms": _median_ms(lambda: policy.prefill(obs), opts.repeats),
            "step_1_token_ms": _median_ms(lambda: policy.score(prefix, one), opts.repeats),
            "verify_6_tokens_ms": _median_ms(lambda: policy.score(prefix, six), opts.repeats),
            "prefill_verifying_6_ms": _median_ms(lambda: policy.prefill_batch([obs], six), opts.repeats),
            "vision_ms": _median_ms(lambda: policy.image_features(pixels), opts.repeats),
        }
    prefix_tokens = int(prefix.prefix_len)
    n_params = sum(p.numel() for p in policy.model.parameters())
    ar_ms = costs["prefill_ms"] + BENCH_PASSES[specs.BASELINE] * costs["step_1_token_ms"]
    rows = []
    for name, passes in BENCH_PASSES.items():
        per_pass = costs["step_1_token_ms"] if name == specs.BASELINE else costs["verify_6_tokens_ms"]
        total = costs["prefill_ms"] + passes * per_pass
        rows.append({"decoder": name, "target_passes": passes, "implied_ms": total, "implied_speedup": ar_ms / total})
    for name in IN_PREFILL:
        total = costs["prefill_verifying_6_ms"]
        rows.append({"decoder": name, "target_passes": 1.0, "implied_ms": total, "implied_speedup": ar_ms / total,
                     "note": "every action verified inside the prefill (free space)"})
    result = {"options": asdict(opts), "parameters": n_params, "prefix_tokens": prefix_tokens, **costs,
              "decoders": rows}
    if opts.incremental:
        result["incremental"] = measure_incremental(policy, expert_frames(size, opts.frames), opts.vision)
    return result


def hf_cost(opts: CostOptions) -> dict[str, Any]:
    result = measure(opts)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
