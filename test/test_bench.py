"""Bench entry construction (the bench itself runs in the CLI, not in the test suite)."""

from __future__ import annotations

from vla_accel_ros.bench import SEQUENTIAL_SUFFIX, TEMPERATURE_PREFIX, bench_entries
from vla_accel_ros.decoding import make_decoder


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
