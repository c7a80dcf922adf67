"""``vla-accel sim --decoders ... --chunk-modes ...``: every decoder runs in every mode with the
node settings that combination names (the decoder, incremental vision for ``X+iv``, real-time
chunking only in ``rtc``), each in its own folder, and the rows carry the chunk throughput against
the first. The DDS run itself is replaced by a stand-in that records what it was asked for."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rclpy")
from vla_accel_ros.ros import chunk_runs  # noqa: E402
from vla_accel_ros.ros.launcher import SimRunOptions  # noqa: E402
from vla_accel_ros.ros.parameters import PolicySettings  # noqa: E402


def test_every_decoder_runs_in_every_mode_with_its_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[SimRunOptions] = []
    latency = {"flow10": 100.0, "flow2": 40.0, "flow2+iv": 25.0}

    def stand_in(opts: SimRunOptions, progress: bool = True) -> dict[str, Any]:
        asked.append(opts)
        out = Path(opts.out)
        out.mkdir(parents=True)
        decoder = out.parent.name
        log = {"command": [], "chunk_start": [], "source": [], "stamp": [], "episode": []}
        (out / "node_stats.json").write_text(json.dumps({
            "tick_log": log, "inference_vision_recomputed_mean": 0.4 if decoder.endswith("+iv") else 1.0}))
        return {"success_rate": 0.9, "inference_latency_ms_p50": latency[decoder]}

    monkeypatch.setattr(chunk_runs, "run_sim", stand_in)
    monkeypatch.setattr(chunk_runs, "plot_chunk_modes", lambda out, labels, period: out / "chunk_execution.png")
    opts = SimRunOptions(policy=replace(PolicySettings(), decoder="flow10"), out=str(tmp_path))
    result = chunk_runs.run_chunk_modes(opts, ["sync", "rtc"], progress=False,
                                        decoders=["flow10", "flow2", "flow2+iv"])
    rows = result["modes"]
    assert [(r["decoder"], r["mode"]) for r in rows] == [(d, m) for d in ("flow10", "flow2", "flow2+iv")
                                                         for m in ("sync", "rtc")]
    assert [Path(o.out).relative_to(tmp_path).as_posix() for o in asked] == [
        f"{d}/{m}" for d in ("flow10", "flow2", "flow2+iv") for m in ("sync", "rtc")]
    for opts_run, row in zip(asked, rows, strict=True):
        assert opts_run.policy.decoder == row["decoder"].removesuffix("+iv")
        assert (opts_run.vision is not None and opts_run.vision.enabled) == row["decoder"].endswith("+iv")
        assert (opts_run.policy.rtc_horizon > 0) == (row["mode"] == "rtc")
        assert (opts_run.chunks.chunk_execution == "async") == (row["mode"] == "rtc")
    assert [r["chunk_throughput_vs_first"] for r in rows[::2]] == [1.0, 2.5, 4.0]
    assert rows[-1]["vision_recomputed_mean"] == 0.4
    assert json.loads((tmp_path / "chunk_modes.json").read_text())["modes"] == rows


@pytest.mark.parametrize(("mode", "execution", "blend"), [
    ("sync", "sync", None), ("wait", "wait", None), ("async:crossfade", "async", "crossfade"),
    ("rtc", "async", "latest_only")])
def test_each_mode_names_its_execution_and_blend(mode: str, execution: str, blend: str | None) -> None:
    base = SimRunOptions().chunks
    settings = chunk_runs.mode_settings(mode, base)
    assert settings.chunk_execution == execution
    assert settings.chunk_blend == (blend or base.chunk_blend)


@pytest.mark.parametrize("mode", ["wait:crossfade", "async", "async:blend", "later"])
def test_an_unknown_mode_is_refused_naming_the_modes(mode: str) -> None:
    with pytest.raises(ValueError, match="sync, wait, async:latest_only"):
        chunk_runs.mode_settings(mode, SimRunOptions().chunks)
