"""Chunk execution compared over DDS (``vla-accel sim --chunk-modes``): the node with each chunk mode
in turn on the same seeded episodes (``OUT/MODE``), their figures side by side
(``OUT/chunk_modes.json``) and their commanded joint positions with the chunk boundaries marked
(``OUT/chunk_execution.png``).

A mode is ``sync``, ``wait`` or ``async:BLEND`` (``async:crossfade``, ...): the node's ``chunk_execution`` and,
for ``async``, its ``chunk_blend``; the other ``chunk_*`` parameters are the run's. ``rtc`` is ``async``
with ``latest_only`` and real-time chunking (the run's ``rtc_horizon``, else ``DEFAULT_RTC_HORIZON``);
the other modes run without it.

With ``decoders`` (``--decoders`` beside ``--chunk-modes``) every decoder runs in every mode
(``OUT/DECODER/MODE``); a decoder named ``X+iv`` is ``X`` with incremental vision (the run's
``vision_*`` settings, else their defaults). Each row then also holds its decoder, the share of
image tokens its prefills recomputed, and its chunk throughput (inferences per second of inference
time) over the first row's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.chunks import CHUNK_BLENDS, CHUNK_MODES, WAITING_EXECUTIONS, ChunkSettings
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.ros.launcher import SimRunOptions, run_sim
from vla_accel_ros.ros.run_summary import motion_segments

ROW_KEYS = ("success_rate", "actions_per_s", "chunk_wait_tick_share", "obs_to_action_ms_p50", "obs_to_action_ms_p99",
            "jerk_rms", "jerk_max", "chunk_boundary_step_max", "chunk_replans", "inferences_per_action",
            "inference_latency_ms_p50", "fallback_ticks", "hold_ticks", "ticks", "episodes")
PLOT_JOINTS = (1, 3)  # shoulder and elbow: the joints a pick moves most


DEFAULT_RTC_HORIZON = 4  # the steps guided in the rtc mode unless the run sets rtc_horizon
INCREMENTAL_SUFFIX = "+iv"  # a decoder entry run with incremental vision


def mode_settings(mode: str, base: ChunkSettings) -> ChunkSettings:
    """``base`` with the execution and blend ``mode`` names; ValueError for an unknown mode."""
    if mode == "rtc":  # the sampler continues the previous chunk: nothing left to blend
        return replace(base, chunk_execution="async", chunk_blend="latest_only")
    execution, _, blend = mode.partition(":")
    if execution in WAITING_EXECUTIONS and not blend:
        return replace(base, chunk_execution=execution)
    if execution == "async" and blend in CHUNK_BLENDS:
        return replace(base, chunk_execution="async", chunk_blend=blend)
    raise ValueError(f"chunk mode {mode!r} is not one of {', '.join(CHUNK_MODES)}")


def run_chunk_modes(opts: SimRunOptions, modes: list[str], progress: bool = True,
                    decoders: list[str] | None = None) -> dict[str, Any]:
    """Each mode's run (``opts.out/MODE``, or ``opts.out/DECODER/MODE`` for every one of
    ``decoders``) and its figures; written to ``opts.out/chunk_modes.json``."""
    if not modes:
        raise ValueError("--chunk-modes names no mode")
    settings = {mode: mode_settings(mode, opts.chunks) for mode in modes}  # every mode checked before any run
    runs = [(None, mode) for mode in modes] if not decoders else [(d, mode) for d in decoders for mode in modes]
    rows, labels = [], []
    for decoder, mode in runs:
        rtc_horizon = (opts.policy.rtc_horizon or DEFAULT_RTC_HORIZON) if mode == "rtc" else 0
        policy, vision = opts.policy, opts.vision
        if decoder is not None:
            policy = policy.for_decoder(decoder.removesuffix(INCREMENTAL_SUFFIX))
            if decoder.endswith(INCREMENTAL_SUFFIX):
                vision = opts.vision or VisionReuseConfig()
        run_opts = replace(opts, chunks=settings[mode], policy=replace(policy, rtc_horizon=rtc_horizon), vision=vision,
                           out=str(Path(opts.out) / _dir(mode, decoder)))
        summary = run_sim(run_opts, progress=progress)
        row: dict[str, Any] = {"mode": mode, **{k: summary.get(k) for k in ROW_KEYS}}
        if decoder is not None:
            stats = json.loads((Path(run_opts.out) / "node_stats.json").read_text())
            row = {"decoder": decoder, **row,
                   "vision_recomputed_mean": stats.get("inference_vision_recomputed_mean")}
        rows.append(row)
        labels.append(_dir(mode, decoder))
    if decoders:
        first = rows[0]["inference_latency_ms_p50"] or float("nan")
        for row in rows:
            latency = row["inference_latency_ms_p50"]
            row["chunk_throughput_vs_first"] = first / latency if latency else float("nan")
    result = {"modes": rows, "options": opts.to_json()}
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chunk_modes.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_chunk_modes(out, labels, 1.0 / opts.control_rate_hz)
    return result


def _dir(mode: str, decoder: str | None = None) -> str:
    """A run's folder under the output: MODE, or DECODER/MODE."""
    folder = mode.replace(":", "_")
    return folder if decoder is None else f"{decoder}/{folder}"


def plot_chunk_modes(out: Path, modes: list[str], period_s: float) -> Path:
    """The commanded positions of ``PLOT_JOINTS`` over the first episode each run drove (``modes``:
    the runs' folders under ``out``), one row per run, every chunk boundary (a tick that started a
    new plan) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(modes), 1, figsize=(10, 2.2 * len(modes)), sharex=True, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        log = json.loads((out / mode.replace(":", "_") / "node_stats.json").read_text())["tick_log"]
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
