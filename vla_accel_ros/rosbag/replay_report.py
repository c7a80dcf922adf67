"""A replay's step-by-step record, written beside its ``summary.json`` (``vla-accel replay --summary
DIR``): every produced command next to the recorded one it was matched with, as a CSV and as a plot.

- ``replay_steps.csv``: one row per produced command and joint (the arm's joints, then the
  gripper's fingers when both sides have them): ``time_s`` (seconds since the bag's start),
  ``joint``, ``recorded`` and ``replayed`` (rad, or m for a finger), ``difference`` (replayed minus
  recorded; empty, like ``recorded``, when no recorded command lies within half a control period)
  and ``source`` (what produced the command: ``policy``, ``fallback`` or ``hold``; empty when the
  node does not say, as in a realtime replay).
- ``replay.png``: per arm joint, the recorded and the replayed commands over time, the steps whose
  difference exceeds the tolerance marked in red with a line at the first of them, and the
  episode boundaries (the bag's episode reports) as grey lines.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.rosbag.compare import match_commands
from vla_accel_ros.rosbag.io import float_seconds
from vla_accel_ros.rosbag.lockstep import Command

STEPS_FILE = "replay_steps.csv"
PLOT_FILE = "replay.png"
COLUMNS = ("time_s", "joint", "recorded", "replayed", "difference", "source")


def step_rows(produced: list[Command], recorded: list[Command], joint_names: tuple[str, ...],
              finger_names: tuple[str, ...], period_s: float, start_ns: int) -> list[dict[str, Any]]:
    """The CSV's rows (see the module docstring)."""
    match = dict(match_commands(produced, recorded, period_s))
    rows = []
    for step, cmd in enumerate(produced):
        rec = recorded[match[step]] if step in match else None
        t = round(float_seconds(cmd.t_ns - start_ns), 6)
        values = list(zip(joint_names, cmd.q, rec.q if rec is not None else [None] * len(joint_names)))
        if cmd.fingers.size == len(finger_names) and finger_names:
            known = rec is not None and rec.fingers.size == cmd.fingers.size
            values += list(zip(finger_names, cmd.fingers, rec.fingers if known else [None] * len(finger_names)))
        for name, mine, other in values:
            rows.append({"time_s": t, "joint": name, "recorded": "" if other is None else float(other),
                         "replayed": float(mine), "difference": "" if other is None else float(mine - other),
                         "source": cmd.source})
    return rows


def write_steps_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def plot_replay(path: Path, produced: list[Command], recorded: list[Command], joint_names: tuple[str, ...],
                period_s: float, start_ns: int, tolerance: float, boundaries_ns: list[int]) -> None:
    """``replay.png`` (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def seconds(commands: list[Command]) -> np.ndarray:
        return np.array([float_seconds(c.t_ns - start_ns) for c in commands])

    pairs = match_commands(produced, recorded, period_s)
    n = len(joint_names)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.5 * n + 0.8), sharex=True, squeeze=False)
    t_rec, t_rep = seconds(recorded), seconds(produced)
    q_rec = np.array([c.q for c in recorded]).reshape(len(recorded), n)
    q_rep = np.array([c.q for c in produced]).reshape(len(produced), n)
    beyond = [(step, j) for step, j in pairs if float(np.abs(produced[step].q - recorded[j].q).max()) > tolerance]
    for k, name in enumerate(joint_names):
        ax = axes[k, 0]
        ax.plot(t_rec, q_rec[:, k], lw=1.0, color="tab:blue", label="recorded")
        ax.plot(t_rep, q_rep[:, k], lw=0.8, ls="--", color="tab:orange", label="replayed")
        off = [(step, j) for step, j in pairs if abs(produced[step].q[k] - recorded[j].q[k]) > tolerance]
        if off:
            ax.scatter(t_rep[[step for step, _ in off]], q_rep[[step for step, _ in off], k], s=6, color="tab:red",
                       zorder=3, label=f"|diff| > {tolerance:.3g} rad")
        for b in boundaries_ns:
            ax.axvline(float_seconds(b - start_ns), color="0.6", lw=0.8)
        if beyond:
            ax.axvline(t_rep[beyond[0][0]], color="tab:red", lw=0.8, ls=":")
        ax.set_ylabel(f"{name} (rad)", fontsize=8)
    handles = {label: h for ax in axes[:, 0] for h, label in zip(*ax.get_legend_handles_labels())}
    if boundaries_ns:
        handles["episode boundary"] = plt.Line2D([], [], color="0.6", lw=0.8)
    if beyond:
        handles["first step beyond the tolerance"] = plt.Line2D([], [], color="tab:red", lw=0.8, ls=":")
    axes[0, 0].legend(handles.values(), handles.keys(), loc="upper right", fontsize=7, ncol=2)
    axes[-1, 0].set_xlabel("time since the bag's start (s)")
    fig.suptitle(f"recorded and replayed commands (tolerance {tolerance:.3g} rad)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(out: Path, produced: list[Command], recorded: list[Command], kin: Any, period_s: float,
                 start_ns: int, tolerance: float, boundaries_ns: list[int]) -> dict[str, str]:
    """Write ``replay_steps.csv`` and ``replay.png`` into ``out``; their paths, by summary key."""
    out.mkdir(parents=True, exist_ok=True)
    joints, fingers = tuple(kin.joint_names), tuple(kin.gripper_joint_names)
    write_steps_csv(out / STEPS_FILE, step_rows(produced, recorded, joints, fingers, period_s, start_ns))
    plot_replay(out / PLOT_FILE, produced, recorded, joints, period_s, start_ns, tolerance, boundaries_ns)
    return {"steps_csv": str(out / STEPS_FILE), "plot": str(out / PLOT_FILE)}
