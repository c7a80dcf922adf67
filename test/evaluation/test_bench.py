"""Bench entry construction, its run order and rows (the bench itself runs in the CLI, not in the test suite)."""

from __future__ import annotations

import argparse

import pytest

from vla_accel_ros.commands.bench import (
    add_arguments,
    parse_contact_bounds,
    parse_sweep_decoders,
    parse_sweep_r,
)
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.core.settings import parse_r_bounds
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.evaluation.bench import (
    AFTER_PREFILL_SUFFIX,
    FILL_CHECK_SUFFIX,
    RATIO_KEYS,
    SEQUENTIAL_SUFFIX,
    SWEEP_R,
    TEMPERATURE_PREFIX,
    BenchEntry,
    bench_entries,
    bench_rows,
    bench_schedule,
    default_decoders,
    matched_success,
    row,
)
from vla_accel_ros.evaluation.bench_report import (
    markdown_table,
    matched_success_table,
    plot_pareto,
    retrieval_note,
)
from vla_accel_ros.evaluation.bench_run import bench_store_options
from vla_accel_ros.evaluation.episode import EpisodeRecord


def test_sequential_draft_entries_only_for_parallel_draft_decoders() -> None:
    entries = bench_entries(["ar", "sd", "kerv", "world_aware", "deadline"], sweep=False, sequential_draft=True)
    extra = {e.name: e for e in entries if e.name.endswith(SEQUENTIAL_SUFFIX)}
    assert set(extra) == {f"{name}{SEQUENTIAL_SUFFIX}" for name in ("kerv", "world_aware", "deadline")}
    for entry in extra.values():
        decoder = make_decoder(entry.decoder, **dict(entry.settings))
        assert decoder.config.parallel_draft is False
    assert make_decoder("kerv").config.parallel_draft is True


def test_fill_check_entries_for_the_kalman_fill_decoders_and_their_incremental_rows() -> None:
    entries = bench_entries(["ar", "sd", "kerv", "world_aware", "deadline"], sweep=False, fill_check=True,
                            reuse_kv=True)
    names = [e.name for e in entries]
    assert names[:7] == ["ar", "sd", "kerv", "world_aware", "deadline", f"kerv{FILL_CHECK_SUFFIX}",
                         f"world_aware{FILL_CHECK_SUFFIX}"]
    assert f"world_aware{FILL_CHECK_SUFFIX}+ivkv" in names and f"kerv{FILL_CHECK_SUFFIX}+ivkv" in names
    for entry in entries:
        decoder = make_decoder(entry.decoder, **dict(entry.settings))
        assert getattr(getattr(decoder, "config", None), "fill_check", False) is (FILL_CHECK_SUFFIX in entry.name)
    assert not any(FILL_CHECK_SUFFIX in e.name for e in bench_entries(["ar", "kerv"], sweep=False))


def test_fill_check_bounds_reach_the_fill_checked_entries_only() -> None:
    entries = bench_entries(["ar", "kerv", "world_aware"], sweep=False, fill_check=True, reuse_kv=True,
                            fill_check_bounds=(3, 10))
    for entry in entries:
        config = getattr(make_decoder(entry.decoder, **dict(entry.settings)), "config", None)
        if FILL_CHECK_SUFFIX in entry.name:
            assert (config.r_min, config.r_max) == (3, 10)
        elif config is not None and hasattr(config, "r_min"):
            assert (config.r_min, config.r_max) == (5, 15)  # the decoders' own
    assert parse_r_bounds("2:6") == (2, 6)
    for bad in ("6:2", "3", "a:b"):
        with pytest.raises(argparse.ArgumentTypeError, match="R_MIN:R_MAX"):
            parse_r_bounds(bad)


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
    latency = {"prefill_p50": prefill, "prefill_mean": prefill, "decode_p50": decode, "head_p50": None,
               "total_p50": total,
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


def test_sweep_r_and_decoders_choose_the_sweep_and_a_listed_wa_prefill_follows_it() -> None:
    entries = bench_entries(["ar", "sd", "kerv", "wa_prefill+sd", "wa_prefill+kerv"], sweep=True, sweep_r=(9, 40),
                            sweep_decoders=("sd",), contact_bounds=((40, 100),))
    extra = [(e.name, e.decoder, e.settings, e.wa_prefill) for e in entries if e.sweep_r is not None or e.bounds]
    assert extra == [
        ("kerv@r=[40,100]", "kerv", (("r_min", 40), ("r_max", 100)), False),
        ("world_aware@r=[40,100]", "world_aware", (("r_min", 40), ("r_max", 100)), False),
        ("wa_prefill+kerv@r=[40,100]", "kerv", (("r_min", 40), ("r_max", 100)), True),
        ("sd@r=9", "sd", (("r", 9),), False), ("wa_prefill+sd@r=9", "sd", (("r", 9),), True),
        ("sd@r=40", "sd", (("r", 40),), False), ("wa_prefill+sd@r=40", "sd", (("r", 40),), True)]


def test_matched_success_takes_the_fastest_setting_within_two_points_of_ar() -> None:
    def r(success: float, speedup: float) -> dict[str, float]:
        return {"success_rate": success, "speedup_vs_ar": speedup, "ncf_rate": 1 - success, "mean_accepted_len": 3.0}

    rows = {"ar": r(0.90, 1.0), "sd": r(0.90, 1.1), "sd@r=20": r(0.88, 1.3), "sd@r=40": r(0.86, 1.6),
            "wa_prefill+sd@r=40": r(0.90, 1.5), "kerv@r=[40,100]": r(0.5, 2.0), "ar@T=0.5": r(1.0, 3.0)}
    matched = matched_success(rows)
    assert set(matched) == {"sd", "wa_prefill+sd", "kerv"}  # temperature rows are not a setting
    assert matched["sd"]["setting"] == "sd@r=20" and matched["sd"]["settings_tried"] == 3
    assert matched["wa_prefill+sd"]["setting"] == "wa_prefill+sd@r=40"
    assert matched["kerv"] is None
    assert "none within 2 points" in matched_success_table(matched, 0.9)


@pytest.mark.parametrize("text", ["", "0,9", "a", "9,-1"])
def test_sweep_r_rejects_bad_lists(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_sweep_r(text)
    assert parse_sweep_r("9, 20,40") == (9, 20, 40)


def test_sweep_decoders_must_be_swept_decoders() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="among"):
        parse_sweep_decoders("sd,world_aware")
    assert parse_sweep_decoders("kerv") == ("kerv",)


def test_entries_keep_their_order_and_names() -> None:
    names = [e.name for e in bench_entries(
        ["ar", "sd", "kerv", "world_aware", "deadline", "heisd", "flow2", "wa_prefill+kerv"], sweep=False,
        incremental_vision=True, sequential_draft=True, temperatures=(0.5,), contact_bounds=((20, 60),),
        after_prefill=True)]
    plain = ["ar", "sd", "kerv", "world_aware", "deadline", "heisd", "flow2", "wa_prefill+kerv"]
    assert names == [
        *plain, "kerv@r=[20,60]", "world_aware@r=[20,60]", "wa_prefill+kerv@r=[20,60]", "ar@T=0.5",
        "kerv@sequential", "world_aware@sequential", "deadline@sequential", "world_aware@after_prefill",
        *(f"{name}+iv" for name in plain)]


# --- repeats: run order and the spread of the ratios ---------------------------------------------
def test_repeats_run_every_decoder_once_per_round_seed_by_seed() -> None:
    order = [(i, k, name) for i, k, name in bench_schedule(["ar", "sd", "kerv"], episodes=2, repeats=2)]
    assert order == [(i, k, name) for i in range(2) for k in range(2) for name in ("ar", "sd", "kerv")]
    assert order[:6] == [(0, 0, "ar"), (0, 0, "sd"), (0, 0, "kerv"), (0, 1, "ar"), (0, 1, "sd"), (0, 1, "kerv")]
    assert [e for *_, e in bench_schedule(["ar", "sd"], episodes=3)] == ["ar", "sd"] * 3  # K = 1: as without repeats
    for episodes, repeats in ((1, 0), (-1, 1)):
        with pytest.raises(ValueError):
            bench_schedule(["ar"], episodes, repeats)


def test_repeats_flag_defaults_to_one_and_is_validated() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--out", "x"]).repeats == 1
    assert parser.parse_args(["--out", "x", "--repeats", "3"]).repeats == 3
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--out", "x", "--repeats", bad])


def record(decoder: str, total_ms: float, success: bool = True, steps: int = 4, modes: str = "") -> EpisodeRecord:
    """A fake episode: ``steps`` actions of ``total_ms`` each (prefill half of it), one mode per letter of ``modes``."""
    names = {"d": "drafter", "r": "retrieval", "s": "skip"}
    mode_list = [names[c] for c in modes] if modes else [""] * steps
    n = len(mode_list)
    return EpisodeRecord(
        seed=0, decoder=decoder, success=success, steps=n, min_clearance=1.0,
        prefill_ms=[total_ms / 2] * n, decode_ms=[total_ms / 2] * n, total_ms=[total_ms] * n, wall_ms=[total_ms] * n,
        target_passes=[1] * n, draft_passes=[1] * n, vision_fraction=[1.0] * n, accepted=[7] * n, drafted=[7] * n,
        thresholds=[9.0] * n, modes=mode_list)


def test_each_ratio_is_the_median_over_repeats_with_its_min_and_max() -> None:
    entries = [BenchEntry("ar", "ar"), BenchEntry("sd", "sd")]
    # three repeats of two episodes: ar at 10 ms throughout, sd at 5, 4 and 8 ms -> e2e 2.0, 2.5, 1.25
    records = {"ar": [[record("ar", 10.0), record("ar", 10.0)] for _ in range(3)],
               "sd": [[record("sd", t), record("sd", t, success=k != 1)] for k, t in enumerate((5.0, 4.0, 8.0))]}
    main, sweep = bench_rows(records, entries)
    assert sweep == {}
    sd = main["sd"]
    for key in ("speedup_vs_ar", "decode_speedup_vs_ar", "speedup_vs_ar_mean"):
        assert (sd[key + "_min"], sd[key], sd[key + "_max"]) == pytest.approx((1.25, 2.0, 2.5))
    assert sd["repeats"] == 3 and sd["episodes"] == 6  # everything else pools the repeats
    assert sd["success_rate"] == pytest.approx(5 / 6)
    assert sd["total_ms_p50"] == pytest.approx(5.0)  # the p50 of all 24 actions, not a median of medians
    assert all(main["ar"][k] == 1.0 for k in ("speedup_vs_ar", "speedup_vs_ar_min", "speedup_vs_ar_max"))
    cells = markdown_table(main).splitlines()[-1].split("|")
    assert cells[-3].strip() == "2.00x [1.25–2.50]"  # e2e speed-up: median [min–max]


def test_one_repeat_gives_min_and_max_equal_to_the_ratio_in_every_row() -> None:
    entries = bench_entries(["ar", "sd", "kerv"], sweep=True)
    records = {e.name: [[record(e.decoder, 10.0 if e.name == "ar" else 4.0)]] for e in entries}
    main, sweep = bench_rows(records, entries)
    assert set(main) == {"ar", "sd", "kerv"} and len(sweep) == 2 * len(SWEEP_R)
    for r in (*main.values(), *sweep.values()):
        present = [k for k in RATIO_KEYS if k in r]
        assert {"speedup_vs_ar", "decode_speedup_vs_ar", "speedup_vs_ar_mean"} <= set(present)
        for key in present:
            assert r[key + "_min"] == r[key] == r[key + "_max"]
    assert main["sd"]["speedup_vs_ar"] == pytest.approx(2.5)
    assert "[" not in markdown_table(main)  # no spread to show with one repeat
    with pytest.raises(ValueError, match="same number"):
        bench_rows({"ar": [[record("ar", 1.0)]], "sd": [[record("sd", 1.0)], [record("sd", 1.0)]]},
                   [BenchEntry("ar", "ar"), BenchEntry("sd", "sd")])


def test_heisd_row_reports_its_verify_skip_share_and_both_speed_ups() -> None:
    entries = [BenchEntry("ar", "ar"), BenchEntry("heisd", "heisd")]
    records = {"ar": [[record("ar", 10.0)]] * 2, "heisd": [[record("heisd", 5.0, modes="drsssrdd")]] * 2}
    main, _ = bench_rows(records, entries)
    heisd = main["heisd"]
    assert heisd["verify_skip_share"] == pytest.approx(3 / 8)
    assert heisd["retrieval_mode_share"] == pytest.approx(2 / 5)
    assert {"speedup_vs_ar", "speedup_vs_ar_mean", "speedup_vs_ar_min", "speedup_vs_ar_mean_max"} <= set(heisd)
    note = retrieval_note(main)
    assert note.startswith("heisd: verify-skip on 38% of actions")
    assert "(p50 latency)" in note and "(mean latency)" in note
    assert "[2.00–2.00]" in note and retrieval_note({"ar": main["ar"]}) == ""


def test_plain_bench_includes_heisd_when_the_checkpoint_has_a_store(tmp_path) -> None:
    pytest.importorskip("faiss")
    from vla_accel_ros.models.load import load_policy

    ckpt = default_checkpoint()
    policy = load_policy(ckpt)
    decoders = default_decoders(policy)
    assert "heisd" in decoders  # the shipped checkpoint has heisd's draft head
    options = bench_store_options(decoders, ckpt, policy)
    assert options["store"].dim == policy.config.d_model
    assert "heisd" in [e.name for e in bench_entries(decoders, sweep=False)]
    storeless = default_decoders(policy)  # a checkpoint directory without retrieval_store/: heisd is left out
    assert bench_store_options(storeless, tmp_path, policy) == {} and "heisd" not in storeless
