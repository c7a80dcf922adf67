"""The bench's files in its output directory, and the tables it prints.

``summary.json`` (the rows of :func:`~vla_accel_ros.evaluation.bench.bench_rows`, one per entry
outside the r sweep), ``sweep.json`` (the r-sweep rows, with their r and decoder), ``meta.json`` (the
run: seed, episodes, repeats, checkpoint, threads, temperature, wall time, ...),
``matched_success.json`` (:func:`~vla_accel_ros.evaluation.bench.matched_success`) and ``table.md``:
the rows with their ratios as ``median [min–max]`` when there were several repeats, and under them
the prefill-verified and incremental-prefill notes, the retrieval store's (:func:`retrieval_note`)
and the fastest setting of each family at matched success. Plots: ``pareto.png`` (success vs
speed-up over the r sweep), ``threshold_trace.png`` (r and acceptance per step of one episode),
``temperature_sweep.png``, ``contact_bounds.png``; with a world-aware checkpoint
``wa_comparison.json`` / ``.md`` and ``wa_relaxation.png``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.evaluation.bench import baseline_of, bounds_name, matched_success, wa_comparison
from vla_accel_ros.evaluation.comparisons import (
    BASELINE,
    CONTACT_COMPARISON,
    THRESHOLD_SWEPT,
)
from vla_accel_ros.evaluation.episode import EpisodeRecord

# The speed-ups the accelerated decoders aim for (decode, end to end), drawn on pareto.png.
DECODE_SPEEDUP_TARGET = 2.5
E2E_SPEEDUP_TARGET = 1.5
SWEEP_COLOURS = ("tab:orange", "tab:blue", "tab:purple", "tab:brown", "tab:olive")  # one per THRESHOLD_SWEPT decoder


def write_bench_report(out: Path, main_rows: dict[str, dict[str, Any]], sweep_rows: dict[str, dict[str, Any]],
                       meta: dict[str, Any], *, temperature_rows: dict[float, dict[str, Any]],
                       traced: dict[str, EpisodeRecord], contact_bounds: tuple[tuple[int, int], ...] = (),
                       world_aware: bool = False) -> tuple[str, list[str]]:
    """Write every file of the bench into ``out`` and return what it prints (table.md's table, the
    world-aware comparison and the r sweep) and the names of the plots it drew. ``temperature_rows``:
    the baseline's row at each swept temperature; ``traced``: the episode whose threshold trace is
    drawn, by decoder; ``world_aware``: the run had a world-aware checkpoint (the wa_comparison files)."""
    every_row = {**main_rows, **sweep_rows}
    comparison = wa_comparison(every_row)
    matched = matched_success(every_row)
    plots: list[str] = []
    (out / "matched_success.json").write_text(json.dumps(matched, indent=2))
    if world_aware:
        (out / "wa_comparison.json").write_text(json.dumps(comparison, indent=2))
        (out / "wa_comparison.md").write_text(wa_table(comparison) + "\n")
        plot_wa_relaxation(comparison, every_row, out / "wa_relaxation.png")
        plots.append("wa_relaxation.png")
    (out / "summary.json").write_text(json.dumps(main_rows, indent=2))
    (out / "sweep.json").write_text(json.dumps(sweep_rows, indent=2))
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    table = summary_table(main_rows, matched)
    sweep_table = markdown_table(sweep_rows) if sweep_rows else ""
    (out / "table.md").write_text(table + ("\n\nr sweep:\n\n" + sweep_table if sweep_table else "") + "\n")
    if sweep_rows:
        plot_pareto(sweep_rows, main_rows, out / "pareto.png")
        plots.append("pareto.png")
    if temperature_rows:
        plot_temperature_sweep(temperature_rows, out / "temperature_sweep.png")
        plots.append("temperature_sweep.png")
    if contact_bounds:
        plot_contact_bounds(main_rows, contact_bounds, out / "contact_bounds.png")
        plots.append("contact_bounds.png")
    if traced:
        plot_threshold_trace(traced, out / "threshold_trace.png")
        plots.append("threshold_trace.png")
    printed = table
    if comparison:
        printed += "\n\nworld-aware prefill vs the same decoder alone:\n" + wa_table(comparison)
    if sweep_table:
        printed += "\n\nr sweep:\n" + sweep_table
    return printed, plots


COLUMN_NOTE = ("SR: success rate. NCF: near-contact failures, failed episodes whose gripper came within 2 cm of "
               "the cube (rate: of all episodes; share: of the failed ones). Speed-ups: the baseline's latency over "
               "the row's, in this run (ar; flow10 for a flow VLA without action tokens).")


def summary_table(main_rows: dict[str, dict[str, Any]], matched: dict[str, dict[str, Any] | None]) -> str:
    """table.md without the r sweep: the rows, the notes on prefill-verified and incremental rows and
    on the retrieval store, and the fastest setting of each family at matched success."""
    table = markdown_table(main_rows) + "\n\n" + COLUMN_NOTE
    verified = {name: r for name, r in main_rows.items() if "prefill_verified_share" in r}
    if verified:
        table += (f"\n\nverified inside the prefill (decode ms = total - the prefill of {baseline_of(main_rows)} with "
                  "the same "
                  "vision): " + ", ".join(
                      f"{name} {r['prefill_verified_share']:.0%} of actions (prefill "
                      f"{r['prefill_verified_ms_p50']:.2f} ms there, "
                      f"{r['decode_after_prefill_ms_p50']:.2f} ms after it)" for name, r in verified.items()))
    incremental = {name: r for name, r in main_rows.items() if "prefill_speedup_vs_full" in r}
    if incremental:
        table += "\n\nprefill speed-up over the same decoder with full vision (p50, mean): " + ", ".join(
            f"{name} {r['prefill_speedup_vs_full']:.2f}x, {r['prefill_speedup_vs_full_mean']:.2f}x"
            for name, r in incremental.items())
    if note := retrieval_note(main_rows):
        table += "\n\n" + note
    baseline = baseline_of(main_rows)
    return table + "\n\n" + matched_success_table(matched, main_rows[baseline]["success_rate"], baseline)


def ratio_cell(r: dict[str, Any], key: str) -> str:
    """A ratio as "1.52x", with its spread over the repeats, "1.52x [1.40–1.61]", when there were several."""
    value = r.get(key, float("nan"))
    if r.get("repeats", 1) > 1 and key + "_min" in r:
        return f"{value:.2f}x [{r[key + '_min']:.2f}–{r[key + '_max']:.2f}]"
    return f"{value:.2f}x"


def markdown_table(rows: dict[str, dict[str, Any]]) -> str:
    """One line per row; ``wall ms p50`` is "-" for a row without ``wall_ms_p50``; the speed-ups
    are ``median [min–max]`` over the repeats when the rows have several (:func:`ratio_cell`)."""
    header = ("| decoder | SR | NCF rate | NCF share | accepted len | target passes/action | draft steps/action | "
              "prefill ms p50 | decode ms p50 | total ms p50 | total ms p99 | wall ms p50 | decode speed-up | "
              "e2e speed-up | e2e speed-up (mean) |")
    lines = [header, "|" + "---|" * 15]
    for name, r in rows.items():
        wall = r.get("wall_ms_p50")
        lines.append(
            f"| {name} | {r['success_rate']:.0%} | {r['ncf_rate']:.0%} | {r['ncf_share']:.0%} | "
            f"{r['mean_accepted_len']:.2f} | {r['target_passes_per_action']:.2f} | "
            f"{r['draft_passes_per_action']:.2f} | "
            f"{r['prefill_ms_p50']:.2f} | {r['decode_ms_p50']:.2f} | {r['total_ms_p50']:.2f} | "
            f"{r['total_ms_p99']:.2f} | {'-' if wall is None else f'{wall:.2f}'} | "
            f"{ratio_cell(r, 'decode_speedup_vs_ar')} | {ratio_cell(r, 'speedup_vs_ar')} | "
            f"{ratio_cell(r, 'speedup_vs_ar_mean')} |"
        )
    return "\n".join(lines)


def retrieval_note(rows: dict[str, dict[str, Any]]) -> str:
    """One line per row with a retrieval store (heisd): its verify-skip share, retrieval-mode share
    and query time, and both end-to-end speed-ups (p50 latency, and mean latency, which counts the
    near-free skipped steps that the median hides); "" without such rows."""
    lines = []
    for name, r in rows.items():
        if "verify_skip_share" not in r:
            continue
        query = r.get("retrieval_query_ms_p50")
        lines.append(
            f"{name}: verify-skip on {r['verify_skip_share']:.0%} of actions, retrieval mode on "
            f"{r['retrieval_mode_share']:.0%} of model steps (retrieved action accepted whole "
            f"{r['retrieval_accept_rate']:.0%}, query p50 {'-' if query is None else f'{query:.3f} ms'}); "
            f"e2e speed-up {ratio_cell(r, 'speedup_vs_ar')} (p50 latency), "
            f"{ratio_cell(r, 'speedup_vs_ar_mean')} (mean latency)")
    return "\n".join(lines)


def matched_success_table(matched: dict[str, dict[str, Any] | None], baseline_success: float,
                          baseline: str = BASELINE) -> str:
    lines = [f"fastest setting within 2 points of {baseline} ({baseline_success:.0%} success):", "",
             f"| family | setting | SR | NCF rate | accepted len | e2e speed-up vs {baseline} |", "|" + "---|" * 6]
    for family, m in matched.items():
        if m is None:
            lines.append(f"| {family} | none within 2 points | | | | |")
        else:
            lines.append(f"| {family} | {m['setting']} | {m['success_rate']:.0%} | {m['ncf_rate']:.0%} | "
                         f"{m['mean_accepted_len']:.2f} | {ratio_cell(m, 'speedup_vs_ar')} |")
    return "\n".join(lines)


def wa_table(comparison: dict[str, dict[str, Any]]) -> str:
    lines = [("| world-aware prefill | SR (base -> wa) | NCF share (base -> wa) | accepted len (base -> wa) | "
              "decode speed-up vs base | e2e speed-up vs base |"), "|" + "---|" * 6]
    for name, c in comparison.items():
        lines.append(
            f"| {name} vs {c['base']} | {c['base_success_rate']:.0%} -> {c['success_rate']:.0%} | "
            f"{c['base_ncf_share']:.0%} -> {c['ncf_share']:.0%} | {c['base_mean_accepted_len']:.2f} -> "
            f"{c['mean_accepted_len']:.2f} | {c['decode_speedup_vs_base']:.2f}x | {c['speedup_vs_base']:.2f}x |"
        )
    return "\n".join(lines)


def plot_pareto(sweep: dict[str, dict[str, Any]], main: dict[str, dict[str, Any]], out: Path) -> None:
    """Success against decode and end-to-end speed-up: the r sweep of each ``THRESHOLD_SWEPT``
    decoder as a line, the named rows as points, the speed-up targets as dashed lines (so the plot
    shows how far off they are) and the band within 2 points of the baseline's success as "matched
    success"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    panels = (("decode_speedup_vs_ar", "decode speed-up vs AR (same run)", DECODE_SPEEDUP_TARGET),
              ("speedup_vs_ar", "end-to-end speed-up vs AR (same run)", E2E_SPEEDUP_TARGET))
    for ax, (key, label, target) in zip(axes, panels):
        for family, color in zip(THRESHOLD_SWEPT, SWEEP_COLOURS):
            pts = sorted((v["sweep_r"], v.get(key, 1.0), v["success_rate"])
                         for k, v in sweep.items() if k.startswith(family + "@"))
            if pts:
                ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", color=color, label=f"{family} (r sweep)")
                for r, x, y in pts:
                    ax.annotate(f"r={r}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        for name, v in main.items():
            if "@" not in name:  # variants (@sequential, @r=[...], @T=...) have their own plots and tables
                ax.scatter([v.get(key, 1.0)], [v["success_rate"]], marker="s", s=30, label=name, zorder=3)
        ax.axvline(target, color="tab:red", linestyle="--", linewidth=1)
        ax.annotate(f"target {target:g}x", (target, 0.02), xycoords=("data", "axes fraction"),
                    textcoords="offset points", xytext=(4, 0), fontsize=8, color="tab:red")
        if main:
            base = main[baseline_of(main)]["success_rate"]
            ax.axhspan(base - 0.02, base + 0.02, color="tab:green", alpha=0.12,
                       label=f"matched success ({baseline_of(main)} ± 2 points)")
        ax.set_xlim(left=min(0.9, ax.get_xlim()[0]), right=max(target * 1.1, ax.get_xlim()[1]))
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    lowest = min([v["success_rate"] for v in (*sweep.values(), *main.values())], default=1.0)
    axes[0].set_ylim(max(0.0, min(0.5, lowest - 0.1)), 1.03)  # whole-scale: a flat 100% stays readable
    axes[0].set_ylabel("success rate")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_temperature_sweep(rows: dict[float, dict[str, Any]], out: Path) -> None:
    """Success and NCF rate of the baseline against the token sampling temperature (0 = greedy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperatures = sorted(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, style in (("success_rate", "success", "o-"), ("ncf_rate", "near-contact failure", "s--")):
        ax.plot(temperatures, [rows[t][key] for t in temperatures], style, label=label)
    ax.set_xlabel("sampling temperature (0 = greedy)")
    ax.set_ylabel("rate over the episodes")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"{BASELINE}: success against temperature")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_threshold_trace(records: dict[str, EpisodeRecord], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_a) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    for name, rec in records.items():
        ax_r.plot(rec.thresholds, label=name)
        ax_a.plot(rec.accepted, label=name)
    ax_r.set_ylabel("threshold r (bins)")
    ax_a.set_ylabel("accepted draft tokens")
    ax_a.set_xlabel(f"control step (seed {next(iter(records.values())).seed})")
    ax_r.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_wa_relaxation(comparison: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]], out: Path) -> None:
    """Success and end-to-end speed-up vs ar of each ``wa_prefill+X`` setting beside X at the same
    setting: does the world-aware prefill keep success as the relaxation loosens?"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(comparison)
    x = np.arange(len(names))
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 0.9 * len(names) + 3), 4.2))
    for ax, key, title in ((axes[0], "success_rate", "success rate"), (axes[1], "speedup_vs_ar", "e2e speed-up vs ar")):
        base = [rows[comparison[n]["base"]].get(key, np.nan) for n in names]
        wa = [rows[n].get(key, np.nan) for n in names]
        ax.bar(x - 0.2, base, width=0.4, label="X alone")
        ax.bar(x + 0.2, wa, width=0.4, label="wa_prefill+X")
        ax.set_xticks(x, [comparison[n]["base"] for n in names], rotation=45, ha="right", fontsize=7)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylim(0, 1.05)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_contact_bounds(rows: dict[str, dict[str, Any]], bounds: tuple[tuple[int, int], ...], out: Path) -> None:
    """Near-contact failure and success of the ``CONTACT_COMPARISON`` pair at each of the same r bounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
    x = np.arange(len(bounds))
    for ax, key, title in ((axes[0], "ncf_rate", "near-contact failure rate"),
                           (axes[1], "success_rate", "success rate")):
        for k, name in enumerate(CONTACT_COMPARISON):
            values = [rows[bounds_name(name, lo, hi)][key] for lo, hi in bounds]
            ax.bar(x + (k - 0.5) * 0.38, values, width=0.38, label=name)
        ax.set_xticks(x, [f"[{lo}, {hi}]" for lo, hi in bounds])
        ax.set_xlabel("r bounds [r_min, r_max]")
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
