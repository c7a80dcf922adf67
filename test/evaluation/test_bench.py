"""Bench entry construction (the bench itself runs in the CLI, not in the test suite)."""

from __future__ import annotations

import argparse

import pytest

from vla_accel_ros.commands.bench import parse_contact_bounds
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.evaluation.bench import (
    AFTER_PREFILL_SUFFIX,
    SEQUENTIAL_SUFFIX,
    SWEEP_R,
    TEMPERATURE_PREFIX,
    bench_entries,
    markdown_table,
    plot_pareto,
    row,
)


def test_sequential_draft_entries_only_for_parallel_draft_decoders() -> None:
    entries = bench_entries(["ar", "sd", "kerv", "world_aware", "deadline"], sweep=False, sequential_draft=True)
    extra = {e.name: e for e in entries if e.name.endswith(SEQUENTIAL_SUFFIX)}
    assert set(extra) == {f"{name}{SEQUENTIAL_SUFFIX}" for name in ("kerv", "world_aware", "deadline")}
    for entry in extra.values():
        decoder = make_decoder(entry.decoder, **dict(entry.settings))
        assert decoder.config.parallel_draft is False
    assert make_decoder("kerv").config.parallel_draft is True


def test_no_sequential_entries_by_default() -> None:
    names = [e.name for e in bench_entries(["ar", "kerv"], sweep=False)]
    assert names == ["ar", "kerv"]


def test_temperature_sweep_adds_ar_entries_at_each_temperature() -> None:
    entries = bench_entries(["ar", "kerv"], sweep=False, temperatures=(0.0, 0.5))
    swept = [e for e in entries if e.temperature is not None]
    assert [(e.name, e.decoder, e.temperature) for e in swept] == [
        (f"ar{TEMPERATURE_PREFIX}0", "ar", 0.0), (f"ar{TEMPERATURE_PREFIX}0.5", "ar", 0.5)]
    assert all(e.temperature is None for e in entries if e not in swept)  # the run's --temperature


def test_contact_bounds_add_kerv_and_world_aware_at_the_same_bounds() -> None:
    entries = bench_entries(["ar", "kerv"], sweep=False, contact_bounds=((20, 60), (40, 100)))
    bounded = [e for e in entries if e.bounds is not None]
    assert [(e.name, e.decoder) for e in bounded] == [
        ("kerv@r=[20,60]", "kerv"), ("world_aware@r=[20,60]", "world_aware"),
        ("kerv@r=[40,100]", "kerv"), ("world_aware@r=[40,100]", "world_aware")]
    for entry in bounded:
        config = make_decoder(entry.decoder, **dict(entry.settings)).config
        assert (config.r_min, config.r_max) == entry.bounds


def test_contact_bounds_argument_is_validated() -> None:
    assert parse_contact_bounds("20:60, 5:15") == ((20, 60), (5, 15))
    for bad in ("20", "60:20", "a:b", "1:2:3"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_contact_bounds(bad)


def test_pareto_plot_of_the_sweeps_and_the_named_rows(tmp_path) -> None:
    def row(success: float, decode: float, e2e: float, **extra: object) -> dict:
        return {"success_rate": success, "decode_speedup_vs_ar": decode, "speedup_vs_ar": e2e, **extra}

    sweep = {f"{family}@r={r}": row(1.0 - r / 100, 1.0 + r / 10, 1.0 + r / 40, sweep_r=r)
             for family in ("sd", "kerv") for r in (3, 9, 20)}
    main = {"ar": row(1.0, 1.0, 1.0), "kerv": row(0.98, 1.5, 1.2), "kerv@sequential": row(0.98, 1.1, 1.0)}
    out = tmp_path / "pareto.png"
    plot_pareto(sweep, main, out)
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_after_prefill_entries_only_for_decoders_that_verify_inside_the_prefill() -> None:
    entries = bench_entries(["ar", "kerv", "world_aware"], sweep=False, after_prefill=True)
    extra = [e for e in entries if e.name.endswith(AFTER_PREFILL_SUFFIX)]
    assert [e.name for e in extra] == [f"world_aware{AFTER_PREFILL_SUFFIX}"]
    assert make_decoder(extra[0].decoder, **dict(extra[0].settings)).config.prefill_verify is False
    assert make_decoder("world_aware").config.prefill_verify is True


def summary(prefill: float, decode: float, total: float, **extra: float) -> dict:
    """An episode summary with these latency p50s (ms) and ``extra`` latency keys."""
    latency = {"prefill_p50": prefill, "decode_p50": decode, "head_p50": None, "total_p50": total,
               "total_p99": total, "total_mean": total, **extra}
    return {"success_rate": 1.0, "ncf_rate": 0.0, "ncf_share": 0.0, "mean_accepted_len": 4.0,
            "acceptance_rate": 0.5, "target_passes_per_action": 1.0, "draft_passes_per_action": 1.0,
            "vision_recomputed_fraction": 1.0, "episodes": 1, "latency_ms": latency}


def test_decode_of_a_prefill_verifying_decoder_counts_the_prefills_extra_rows() -> None:
    ar = summary(2.0, 1.8, 3.8)
    plain = row(summary(2.0, 0.9, 2.9), ar, plain_prefill_ms=2.0)
    assert plain["decode_ms_p50"] == 0.9 and "prefill_verified_share" not in plain
    verified = summary(2.1, 0.2, 2.35, prefill_verified_p50=2.1)
    verified["prefill_verified_share"] = 0.7
    out = row(verified, ar, plain_prefill_ms=2.0)
    assert out["decode_ms_p50"] == pytest.approx(0.35)  # total - ar's prefill: the extra rows count
    assert out["decode_after_prefill_ms_p50"] == 0.2 and out["prefill_verified_share"] == 0.7
    assert out["decode_speedup_vs_ar"] == pytest.approx(1.8 / 0.35)
    assert out["speedup_vs_ar"] == pytest.approx(3.8 / 2.35)


def test_wall_time_is_reported_next_to_the_prefill_decode_split() -> None:
    ar = summary(2.0, 1.8, 3.8)
    timed = row(summary(2.0, 0.9, 2.9, wall_p50=3.25, wall_p99=4.0), ar)
    untimed = row(summary(2.0, 0.9, 2.9), ar)
    assert timed["wall_ms_p50"] == 3.25 and untimed["wall_ms_p50"] is None
    header, rule, *lines = markdown_table({"kerv": timed, "sd": untimed}).splitlines()
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns.index("wall ms p50") == columns.index("total ms p99") + 1
    assert rule.count("---|") == len(columns)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert all(len(c) == len(columns) for c in cells)
    wall = columns.index("wall ms p50")
    assert cells[0][wall] == "3.25" and cells[1][wall] == "-"


def test_sweep_entries_trace_sd_and_kerv_over_r() -> None:
    swept = [e for e in bench_entries(["ar", "kerv"], sweep=True) if e.sweep_r is not None]
    assert [(e.name, e.decoder, e.settings, e.sweep_r) for e in swept] == [
        entry for r in SWEEP_R for entry in (
            (f"sd@r={r}", "sd", (("r", r),), r),
            (f"kerv@r={r}", "kerv", (("r_min", max(1, r // 3)), ("r_max", r)), r))]


def test_entries_keep_their_order_and_names() -> None:
    names = [e.name for e in bench_entries(
        ["ar", "sd", "kerv", "world_aware", "deadline", "heisd", "flow2", "wa_prefill+kerv"], sweep=False,
        incremental_vision=True, sequential_draft=True, temperatures=(0.5,), contact_bounds=((20, 60),),
        after_prefill=True)]
    plain = ["ar", "sd", "kerv", "world_aware", "deadline", "heisd", "flow2", "wa_prefill+kerv"]
    assert names == [
        *plain, "kerv@r=[20,60]", "world_aware@r=[20,60]", "ar@T=0.5",
        "kerv@sequential", "world_aware@sequential", "deadline@sequential", "world_aware@after_prefill",
        *(f"{name}+iv" for name in plain)]
