"""The decoder bench's entries, run order and rows: every decoder on the same seeded episodes, side by
side, in one process (``vla-accel bench``; :mod:`~vla_accel_ros.evaluation.bench_run` runs them and
:mod:`~vla_accel_ros.evaluation.bench_report` writes the files).

Seeds are the outer loop and decoders the inner one, so machine noise hits every decoder alike;
speed-ups are ratios of latencies measured in this one run, against the registry's ``BASELINE``
(``ar``). With ``--repeats K`` each seed runs K times per decoder (:func:`bench_schedule`: for
each seed, K rounds of every decoder in order), so drift within a seed hits all decoders alike
too. Each ratio (``RATIO_KEYS``) is computed per repeat over that repeat's episodes; a row holds
its median over the repeats under the plain key and the spread beside it (``speedup_vs_ar``,
``speedup_vs_ar_min``, ``speedup_vs_ar_max``; likewise for the other ratios), also for K = 1
(min = max = the value). Everything else in a row (success and NCF rates, accepted length, the
latency percentiles, the mode shares) pools the episodes of all repeats; ``repeats`` is K.

Besides the named decoders, an r sweep of the registry's ``THRESHOLD_SWEPT`` decoders (``sd`` at a
fixed r, ``kerv`` with r_max = r; each decoder's ``threshold_settings``) traces success against
speed-up.

Which decoders get which extra rows is asked of the registry and the decoders' capabilities,
never decided by name here: ``@sequential`` rows for those with ``parallel_draft``,
``@after_prefill`` rows for those with ``verifies_in_prefill``, ``@fill_check`` rows
(``--fill-check``) for those with ``fill_check``, the store for those with ``retrieval_store``, the
flow-head check for those with ``flow_head``.

A row (summary.json's, :func:`row`): ``success_rate``, ``ncf_rate``, ``ncf_share``,
``mean_accepted_len``, ``target_passes_per_action``, ``decode_ms_p50``, ``total_ms_p50``,
``total_ms_p99``, ``wall_ms_p50`` (the wall time around the runner's call per action; None when the
episode summary has none), ``speedup_vs_ar`` (ratio of p50 latencies), ``speedup_vs_ar_mean``
(ratio of mean latencies: time per action), ``decode_speedup_vs_ar``, each with ``_min``/``_max``,
``repeats``, …; an r-sweep row (sweep.json's) also its ``sweep_r`` and ``decoder``.
Incremental-vision rows (``DECODER+iv``, ``DECODER+ivkv``) also hold ``prefill_speedup_vs_full``:
the same decoder's full-vision prefill p50 over theirs, and ``prefill_speedup_vs_full_mean`` the
same of the means (full passes every few frames weigh there). The row of a decoder with a retrieval
store (``heisd``) also holds ``retrieval_mode_share``, ``verify_skip_share``,
``retrieval_accept_rate`` and ``retrieval_query_ms_p50``; it needs a retrieval store (``--store``,
default CHECKPOINT/retrieval_store, from ``vla-accel build-store``; the shipped checkpoint has one,
so a plain ``vla-accel bench`` runs heisd).

``--contact-bounds R_MIN:R_MAX,...`` adds the registry's ``CONTACT_COMPARISON`` pair (``kerv`` and
``world_aware``) at each of those same r bounds (rows ``DECODER@r=[R_MIN,R_MAX]``): at bounds loose
enough for ``kerv`` to fail near contact, what the contact signal saves.

With ``--wa-checkpoint`` (a checkpoint from ``vla-accel train-world``), ``wa_prefill+X`` rows run
decoder X with that checkpoint's world-aware prefill on the same seeds (same keys; speed-ups vs AR
are against the base AR), and :func:`wa_comparison` sets each against X: success, NCF share,
accepted length and the speed-up over X alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from vla_accel_ros.decoding.specs import FLOW_BASELINE, names, spec_of, threshold_sweep
from vla_accel_ros.decoding.wa_prefill import (
    WA_PREFILL_PREFIX,
)
from vla_accel_ros.evaluation.comparisons import (  # the entries' names: also what the bench's flags offer
    AFTER_PREFILL_SUFFIX,
    BASELINE,
    CONTACT_COMPARISON,
    FILL_CHECK_SUFFIX,
    SEQUENTIAL_SUFFIX,
    SWEEP_R,
    TEMPERATURE_PREFIX,
    THRESHOLD_SWEPT,
    fill_check_decoders,
    parallel_draft_decoders,
    prefill_verifying_decoders,
)
from vla_accel_ros.evaluation.episode import EpisodeRecord, summarize

# The mode shares and store query time of a decoder with a retrieval store, copied into its row.
RETRIEVAL_KEYS = ("retrieval_mode_share", "verify_skip_share", "retrieval_accept_rate", "retrieval_query_ms_p50")
# The ratios of a row, each computed per repeat: the median goes under the key, the spread beside it.
RATIO_KEYS = ("speedup_vs_ar", "decode_speedup_vs_ar", "speedup_vs_ar_mean", "prefill_speedup_vs_full",
              "prefill_speedup_vs_full_mean")


Entry = TypeVar("Entry")


def baseline_of(names: Iterable[str]) -> str:
    """A run's baseline among its rows' names: ``BASELINE``, or ``FLOW_BASELINE`` in a run without it
    (a flow VLA's: every ``speedup_vs_ar`` is then against its own 10-step sampler)."""
    return BASELINE if BASELINE in names else FLOW_BASELINE


def run_baseline(policy: Any) -> str:
    """The decoder a bench of ``policy`` measures every speed-up against."""
    return FLOW_BASELINE if policy.capabilities().flow_chunks else BASELINE


def default_decoders(policy: Any) -> list[str]:
    """The decoders a bench without ``--decoders`` runs: every registered one ``policy`` can serve
    (a Hugging Face VLA has no draft head); :func:`bench_store_options` then drops the store
    decoders when the checkpoint has no store."""
    return [d for d in names() if not spec_of(d).refusal(policy.capabilities())]


@dataclass(frozen=True)
class BenchEntry:
    """One column of the bench: a decoder with its settings under a display name."""

    name: str
    decoder: str
    settings: tuple[tuple[str, Any], ...] = ()
    sweep_r: int | None = None
    incremental_vision: bool = False
    reuse_kv: bool = False
    wa_prefill: bool = False  # run by the --wa-checkpoint policy (world-aware prefill)
    temperature: float | None = None  # token sampling temperature; None = the run's --temperature
    bounds: tuple[int, int] | None = None  # (r_min, r_max) of a --contact-bounds entry


def bench_entries(decoders: list[str], sweep: bool, incremental_vision: bool = False,
                  reuse_kv: bool = False, sequential_draft: bool = False,
                  temperatures: tuple[float, ...] = (),
                  contact_bounds: tuple[tuple[int, int], ...] = (),
                  after_prefill: bool = False, sweep_r: tuple[int, ...] = SWEEP_R,
                  sweep_decoders: tuple[str, ...] = THRESHOLD_SWEPT, fill_check: bool = False,
                  fill_check_bounds: tuple[int, int] | None = None) -> list[BenchEntry]:
    entries = [BenchEntry(name, name) for name in decoders]
    if fill_check:  # the decoders with a Kalman fill again, checking it against the target's own picks
        checking = fill_check_decoders()
        settings: tuple[tuple[str, Any], ...] = (("fill_check", True),)
        if fill_check_bounds is not None:  # their r bounds: acceptance and the check alike
            settings += (("r_min", fill_check_bounds[0]), ("r_max", fill_check_bounds[1]))
        entries += [BenchEntry(f"{name}{FILL_CHECK_SUFFIX}", name, settings) for name in decoders if name in checking]
    # the rows that incremental vision repeats: each named decoder, and its fill-checked row
    visioned = list(entries)
    # A listed wa_prefill+X also runs at every looser setting X gets: the relaxation sweep of WA-SpecDec.
    wa_bases = [name[len(WA_PREFILL_PREFIX):] for name in decoders if name.startswith(WA_PREFILL_PREFIX)]
    # the contact comparison at the same (loose) r bounds: what contact awareness does to NCF
    bounded = [*CONTACT_COMPARISON, *(WA_PREFILL_PREFIX + b for b in wa_bases if b in CONTACT_COMPARISON)]
    entries += [BenchEntry(bounds_name(name, lo, hi), name, (("r_min", lo), ("r_max", hi)), bounds=(lo, hi))
                for lo, hi in contact_bounds for name in bounded]
    # the baseline again at each temperature (ar@T=...): what sampling does to success, on the same episodes
    entries += [BenchEntry(f"{BASELINE}{TEMPERATURE_PREFIX}{t:g}", BASELINE, temperature=t) for t in temperatures]
    if sequential_draft:  # the parallel-draft decoders again, drafting with the sequential head
        parallel = parallel_draft_decoders()
        entries += [BenchEntry(f"{name}{SEQUENTIAL_SUFFIX}", name, (("parallel_draft", False),))
                    for name in decoders if name in parallel]
    if after_prefill:  # the prefill-verifying decoders again, verifying after the prefill on every step
        verifying = prefill_verifying_decoders()
        entries += [BenchEntry(f"{name}{AFTER_PREFILL_SUFFIX}", name, (("prefill_verify", False),))
                    for name in decoders if name in verifying]
    if incremental_vision:  # the same decoders again, prefilling only the patches that changed
        entries += [BenchEntry(f"{e.name}+iv", e.decoder, e.settings, incremental_vision=True) for e in visioned]
    if reuse_kv:  # and again, also reusing the keys/values of unchanged prefix tokens
        entries += [BenchEntry(f"{e.name}+ivkv", e.decoder, e.settings, incremental_vision=True, reuse_kv=True)
                    for e in visioned]
    if sweep:
        swept = [name for name in names() if name in sweep_decoders]
        swept += [WA_PREFILL_PREFIX + b for b in wa_bases if b in swept]
        for r in sweep_r:
            for name in swept:
                settings = threshold_sweep(name.removeprefix(WA_PREFILL_PREFIX), r)
                if settings is not None:
                    entries.append(BenchEntry(f"{name}@r={r}", name, tuple(settings.items()), r))
    # "wa_prefill+X" entries run decoder X with the world-aware policy
    return [replace(e, decoder=e.decoder[len(WA_PREFILL_PREFIX):], wa_prefill=True)
            if e.decoder.startswith(WA_PREFILL_PREFIX) else e for e in entries]


def wa_comparison(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each ``wa_prefill+X`` row against X (``wa_prefill+X@r=…`` against ``X@r=…``): success, NCF
    share and the speed-up of the world-aware prefill over X alone (X's end-to-end latency / its
    own), all from this one run."""
    out = {}
    for name, wa in rows.items():
        base = rows.get(name[len(WA_PREFILL_PREFIX):]) if name.startswith(WA_PREFILL_PREFIX) else None
        if base is None:
            continue
        out[name] = {
            "base": name[len(WA_PREFILL_PREFIX):],
            "success_rate": wa["success_rate"],
            "base_success_rate": base["success_rate"],
            "ncf_share": wa["ncf_share"],
            "base_ncf_share": base["ncf_share"],
            "ncf_share_relative_change": (wa["ncf_share"] / base["ncf_share"] - 1.0) if base["ncf_share"] else None,
            "mean_accepted_len": wa["mean_accepted_len"],
            "base_mean_accepted_len": base["mean_accepted_len"],
            "speedup_vs_base": base["total_ms_p50"] / wa["total_ms_p50"],
            "decode_speedup_vs_base": base["decode_ms_p50"] / wa["decode_ms_p50"],
        }
    return out


def setting_family(name: str) -> str:
    """The decoder family of a row name: ``'wa_prefill+sd@r=40'`` -> ``'wa_prefill+sd'``."""
    return name.split("@", 1)[0]


def matched_success(rows: dict[str, dict[str, Any]], tolerance: float = 0.02) -> dict[str, dict[str, Any] | None]:
    """For each decoder family among ``rows`` (a decoder at its default and every swept or bounded
    setting), the fastest setting (``speedup_vs_ar``) whose success is within ``tolerance`` of
    ``BASELINE``'s; None when no setting of the family gets there. Temperature rows are left out:
    they change the baseline's sampling, not a threshold."""
    baseline = baseline_of(rows)
    target = rows[baseline]["success_rate"] - tolerance - 1e-9
    families: dict[str, list[str]] = {}
    for name in rows:
        if name != baseline and TEMPERATURE_PREFIX not in name:
            families.setdefault(setting_family(name), []).append(name)
    out: dict[str, dict[str, Any] | None] = {}
    for family, members in families.items():
        ok = [n for n in members if rows[n]["success_rate"] >= target and "speedup_vs_ar" in rows[n]]
        best = max(ok, key=lambda n: rows[n]["speedup_vs_ar"], default=None)
        out[family] = None if best is None else {
            "setting": best, "settings_tried": len(members), "success_rate": rows[best]["success_rate"],
            "ncf_rate": rows[best]["ncf_rate"], "mean_accepted_len": rows[best]["mean_accepted_len"],
            **{k: rows[best][k] for k in ("speedup_vs_ar", "speedup_vs_ar_min", "speedup_vs_ar_max", "repeats")
               if k in rows[best]},
        }
    return out


def row(summary: dict[str, Any], ar: dict[str, Any] | None, plain_prefill_ms: float | None = None) -> dict[str, Any]:
    """One decoder's summary.json entry. For a decoder whose proposal the prefill verified on some
    steps, ``decode_ms_p50`` counts the extra rows of that prefill as decoding: total p50 minus
    ``plain_prefill_ms``, the prefill p50 of the baseline with the same vision in the same run (the
    decoder's own time after its prefill is ``decode_after_prefill_ms_p50``). ``wall_ms_p50`` is the
    wall time around the runner's call per action, None when ``summary`` has none."""
    lat = summary["latency_ms"]
    out = {
        "success_rate": summary["success_rate"],
        "ncf_rate": summary["ncf_rate"],
        "ncf_share": summary["ncf_share"],
        "mean_accepted_len": summary["mean_accepted_len"],
        "acceptance_rate": summary["acceptance_rate"],
        "target_passes_per_action": summary["target_passes_per_action"],
        "draft_passes_per_action": summary["draft_passes_per_action"],
        "vision_recomputed_fraction": summary["vision_recomputed_fraction"],
        "prefill_ms_p50": lat["prefill_p50"],
        "prefill_ms_mean": lat["prefill_mean"],
        "decode_ms_p50": lat["decode_p50"],
        "head_ms_p50": lat["head_p50"],  # continuous heads only (None otherwise): the sampler's own time
        "total_ms_p50": lat["total_p50"],
        "total_ms_p99": lat["total_p99"],
        "total_ms_mean": lat["total_mean"],
        "wall_ms_p50": lat.get("wall_p50"),  # around the runner's call: prefill, decode and what surrounds them
        "episodes": summary["episodes"],
    }
    for key in RETRIEVAL_KEYS:
        if key in summary:
            out[key] = summary[key]
    if "prefill_verified_share" in summary:
        out["prefill_verified_share"] = summary["prefill_verified_share"]
        out["prefill_verified_ms_p50"] = lat["prefill_verified_p50"]
        out["decode_after_prefill_ms_p50"] = lat["decode_p50"]
        if plain_prefill_ms is not None:
            out["decode_ms_p50"] = lat["total_p50"] - plain_prefill_ms
    if ar is not None:
        out["speedup_vs_ar"] = ar["latency_ms"]["total_p50"] / lat["total_p50"]
        out["decode_speedup_vs_ar"] = ar["latency_ms"]["decode_p50"] / out["decode_ms_p50"]
        out["speedup_vs_ar_mean"] = ar["latency_ms"]["total_mean"] / lat["total_mean"]  # time per action
    return out


def bench_schedule(entries: Sequence[Entry], episodes: int, repeats: int = 1) -> list[tuple[int, int, Entry]]:
    """The run order as (episode index, repeat, entry): seeds outermost; for each seed, ``repeats``
    rounds that each run every entry once, in order (ar, d1, d2, ..., ar, d1, d2, ...)."""
    if episodes < 0 or repeats < 1:
        raise ValueError(f"episodes must be >= 0 and repeats >= 1, got {episodes} and {repeats}")
    return [(i, k, entry) for i in range(episodes) for k in range(repeats) for entry in entries]


def main_rows(summaries: dict[str, dict[str, Any]], entries: Sequence[BenchEntry]) -> dict[str, dict[str, Any]]:
    """summary.json's rows (every entry outside the r sweep) from each entry's episode summary."""
    baseline = summaries[baseline_of(summaries)]
    rows = {e.name: row(summaries[e.name], baseline, plain_prefill_ms(summaries, e))
            for e in entries if e.sweep_r is None}
    for e in entries:  # incremental rows: their prefill against the same decoder's full-vision prefill
        if e.incremental_vision and e.decoder in rows:
            rows[e.name]["prefill_speedup_vs_full"] = rows[e.decoder]["prefill_ms_p50"] / rows[e.name]["prefill_ms_p50"]
            rows[e.name]["prefill_speedup_vs_full_mean"] = (rows[e.decoder]["prefill_ms_mean"]
                                                            / rows[e.name]["prefill_ms_mean"])
    return rows


def sweep_rows(summaries: dict[str, dict[str, Any]], entries: Sequence[BenchEntry]) -> dict[str, dict[str, Any]]:
    """sweep.json's rows: the r-sweep entries, with their r and decoder."""
    baseline = summaries[baseline_of(summaries)]
    return {e.name: dict(row(summaries[e.name], baseline), sweep_r=e.sweep_r, decoder=e.decoder)
            for e in entries if e.sweep_r is not None}


def with_spread(pooled: dict[str, dict[str, Any]], per_repeat: Sequence[dict[str, dict[str, Any]]]
                ) -> dict[str, dict[str, Any]]:
    """``pooled`` (rows over all repeats' episodes) with each ratio of ``RATIO_KEYS`` replaced by
    its median over ``per_repeat`` (the same rows, one dict per repeat) and its min and max added
    as ``KEY_min`` / ``KEY_max``; ``repeats`` is the number of repeats."""
    out = {}
    for name, pooled_row in pooled.items():
        new = dict(pooled_row, repeats=len(per_repeat))
        for key in RATIO_KEYS:
            values = [rows[name][key] for rows in per_repeat if key in rows.get(name, {})]
            if key not in pooled_row or not values:
                continue
            new[key] = float(np.median(values))
            new[key + "_min"], new[key + "_max"] = float(np.min(values)), float(np.max(values))
        out[name] = new
    return out


def bench_rows(records: dict[str, list[list[EpisodeRecord]]], entries: Sequence[BenchEntry]
               ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """summary.json's and sweep.json's rows from ``records`` (entry name -> one list of episode
    records per repeat): ratios per repeat (median, min, max), everything else pooled over all
    repeats (:func:`with_spread`)."""
    repeats = {len(per_repeat) for per_repeat in records.values()}
    if len(repeats) != 1 or 0 in repeats:
        raise ValueError(f"every entry needs the same number (>= 1) of repeats, got {sorted(repeats)}")
    pooled = {name: summarize([r for recs in per_repeat for r in recs]) for name, per_repeat in records.items()}
    by_repeat = [{name: summarize(per_repeat[k]) for name, per_repeat in records.items()} for k in range(repeats.pop())]
    return (with_spread(main_rows(pooled, entries), [main_rows(s, entries) for s in by_repeat]),
            with_spread(sweep_rows(pooled, entries), [sweep_rows(s, entries) for s in by_repeat]))


def plain_prefill_ms(summaries: dict[str, dict[str, Any]], entry: BenchEntry) -> float | None:
    """The prefill p50 of the baseline with ``entry``'s vision (full, +iv or +ivkv) in this run."""
    reference = baseline_of(summaries) + ("+ivkv" if entry.reuse_kv else "+iv" if entry.incremental_vision else "")
    return summaries[reference]["latency_ms"]["prefill_p50"] if reference in summaries else None


def bounds_name(decoder: str, r_min: int, r_max: int) -> str:
    return f"{decoder}@r=[{r_min},{r_max}]"


