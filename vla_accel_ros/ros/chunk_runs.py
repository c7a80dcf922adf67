"""Chunk execution compared over DDS (``vla-accel sim --chunk-modes``): the node with each chunk mode
in turn on the same seeded episodes (``OUT/MODE``), their figures side by side
(``OUT/chunk_modes.json``) and their commanded joint positions with the chunk boundaries marked
(``OUT/chunk_execution.png``).

A mode is ``sync`` or ``async:BLEND`` (``async:crossfade``, ...): the node's ``chunk_execution`` and,
for ``async``, its ``chunk_blend``; the other ``chunk_*`` parameters are the run's. ``rtc`` is ``async``
with ``latest_only`` and real-time chunking (the run's ``rtc_horizon``, else ``DEFAULT_RTC_HORIZON``);
the other modes run without it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.chunks import CHUNK_BLENDS, CHUNK_MODES, ChunkSettings
from vla_accel_ros.ros.launcher import SimRunOptions, run_sim
from vla_accel_ros.ros.run_summary import motion_segments

ROW_KEYS = ("success_rate", "actions_per_s", "chunk_wait_tick_share", "obs_to_action_ms_p50", "obs_to_action_ms_p99",
            "jerk_rms", "jerk_max", "chunk_boundary_step_max", "chunk_replans", "inferences_per_action",
            "inference_latency_ms_p50", "fallback_ticks", "hold_ticks", "ticks", "episodes")
PLOT_JOINTS = (1, 3)  # shoulder and elbow: the joints a pick moves most


DEFAULT_RTC_HORIZON = 4  # the steps guided in the rtc mode unless the run sets rtc_horizon


def mode_settings(mode: str, base: ChunkSettings) -> ChunkSettings:
    """``base`` with the execution and blend ``mode`` names; ValueError for an unknown mode."""
    if mode == "rtc":  # the sampler continues the previous chunk: nothing left to blend
        return replace(base, chunk_execution="async", chunk_blend="latest_only")
    execution, _, blend = mode.partition(":")
    if execution == "sync" and not blend:
        return replace(base, chunk_execution="sync")
    if execution == "async" and blend in CHUNK_BLENDS:
        return replace(base, chunk_execution="async", chunk_blend=blend)
    raise ValueError(f"chunk mode {mode!r} is not one of {', '.join(CHUNK_MODES)}")


def run_chunk_modes(opts: SimRunOptions, modes: list[str], progress: bool = True) -> dict[str, Any]:
    """Each mode's run (``opts.out/MODE``) and its figures; written to ``opts.out/chunk_modes.json``."""
    if not modes:
        raise ValueError("--chunk-modes names no mode")
    settings = {mode: mode_settings(mode, opts.chunks) for mode in modes}  # every mode checked before any run
    rows = []
    for mode in modes:
        rtc_horizon = (opts.policy.rtc_horizon or DEFAULT_RTC_HORIZON) if mode == "rtc" else 0
        policy = replace(opts.policy, rtc_horizon=rtc_horizon)
        summary = run_sim(replace(opts, chunks=settings[mode], policy=policy, out=str(Path(opts.out) / _dir(mode))),
                          progress=progress)
        rows.append({"mode": mode, **{k: summary.get(k) for k in ROW_KEYS}})
    result = {"modes": rows, "options": opts.to_json()}
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chunk_modes.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_chunk_modes(out, modes, 1.0 / opts.control_rate_hz)
    return result


def _dir(mode: str) -> str:
    return mode.replace(":", "_")


def plot_chunk_modes(out: Path, modes: list[str], period_s: float) -> Path:
    """The commanded positions of ``PLOT_JOINTS`` over the first episode each mode drove, one row per
    mode, every chunk boundary (a tick that started a new plan) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(modes), 1, figsize=(10, 2.2 * len(modes)), sharex=True, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        log = json.loads((out / _dir(mode) / "node_stats.json").read_text())["tick_log"]
        segments = motion_segments(log)
        if not segments:
            ax.set_title(f"{mode}: no episode the policy drove")
            continue
        seg = segments[0]
        cmd = np.asarray(log["command"], dtype=float)[seg]
        t = np.arange(len(cmd)) * period_s
        for j in PLOT_JOINTS:
            ax.plot(t, cmd[:, j], lw=1.0, marker=".", ms=2.5, label=f"joint{j + 1} commanded")
        for k in np.flatnonzero(np.asarray(log["chunk_start"], dtype=bool)[seg]):
            ax.axvline(t[k], color="k", lw=0.5, alpha=0.35)
        waits = np.flatnonzero(np.asarray(log["source"], dtype=int)[seg] != 0)
        ax.plot(t[waits], cmd[waits, PLOT_JOINTS[0]], "rx", ms=4, label="tick without a plan step")
        ax.set_ylabel("rad")
        ax.set_title(f"{mode} (vertical lines: chunk boundaries)", fontsize=9)
    axes[0, 0].legend(loc="best", fontsize=7)
    axes[-1, 0].set_xlabel("time in the first episode (s)")
    fig.tight_layout()
    path = out / "chunk_execution.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
