"""Closed-loop smoke runs of `vla-accel eval` and `vla-accel bench` with the shipped checkpoint."""

import json

import pytest

from vla_accel_ros.cli import main
from vla_accel_ros.core.resources import default_checkpoint

CHECKPOINT = default_checkpoint()
pytestmark = pytest.mark.skipif(not (CHECKPOINT / "model.json").is_file(), reason="no shipped checkpoint")


def test_eval_writes_summary_and_plot(tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", "--decoder", "ar", "--episodes", "1", "--max-steps", "8", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("episodes", "success_rate", "ncf_rate", "target_passes_per_action", "params", "checkpoint_mb"):
        assert key in summary
    assert set(summary["latency_ms"]) >= {"prefill_p50", "prefill_mean", "decode_p50", "total_p50", "total_p99",
                                          "wall_p50", "wall_p99"}
    assert summary["latency_ms"]["wall_p50"] >= summary["latency_ms"]["total_p50"]  # the call holds the step
    assert summary["episodes"] == 1 and summary["actions"] == 8
    assert summary["target_passes_per_action"] == 7.0  # AR: one pass per token
    assert 0 < summary["checkpoint_mb"] <= 15
    assert (out / "latency.png").stat().st_size > 0


def test_run_episode_drives_the_node_s_runner_and_times_each_call():
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.evaluation.episode import run_episode, summarize
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig

    runner = build_runner(RunnerConfig(decoder="kerv", max_steps=4), ArmKinematics(default_urdf()))
    with PickCubeEnv(SimConfig(image_size=runner.image_size, max_steps=4)) as env:
        record = run_episode(env, runner, seed=100_007)
    assert record.decoder == "kerv" and record.steps == len(record.wall_ms) == len(record.total_ms) == 4
    assert runner.history.episode == 100_007  # the seed keys the episode's sampling noise
    assert all(wall >= total for wall, total in zip(record.wall_ms, record.total_ms))
    latency = summarize([record])["latency_ms"]
    assert latency["wall_p50"] >= latency["total_p50"] and latency["wall_p99"] >= latency["wall_p50"]


def test_bench_compares_decoders_on_the_same_episodes(tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "--episodes", "1", "--max-steps", "6", "--decoders", "ar,kerv", "--no-sweep", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"ar", "kerv"}
    for row in summary.values():
        for key in ("success_rate", "ncf_rate", "mean_accepted_len", "target_passes_per_action", "decode_ms_p50",
                    "total_ms_p50", "total_ms_p99", "speedup_vs_ar"):
            assert key in row
    assert summary["ar"]["speedup_vs_ar"] == pytest.approx(1.0)
    assert summary["kerv"]["target_passes_per_action"] == 1.0
    assert (out / "table.md").read_text().startswith("| decoder")


@pytest.mark.parametrize(
    ("option", "value", "rows", "checked_row", "passes", "plot"),
    [
        ("--temperature-sweep", "0,1.5", {"ar", "ar@T=0", "ar@T=1.5"}, "ar@T=1.5", 7.0, "temperature_sweep.png"),
        ("--contact-bounds", "20:60", {"ar", "kerv@r=[20,60]", "world_aware@r=[20,60]"}, "world_aware@r=[20,60]",
         1.0, "contact_bounds.png"),
    ],
)
def test_bench_extra_rows_and_their_plot(tmp_path, option, value, rows, checked_row, passes, plot):
    out = tmp_path / "bench"
    args = ["bench", "--episodes", "1", "--max-steps", "4", "--decoders", "ar", "--no-sweep", option, value,
            "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == rows
    assert summary[checked_row]["target_passes_per_action"] == passes
    assert (out / plot).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("option", "bad"), [("--temperature-sweep", "0,3"), ("--contact-bounds", "60:20")])
def test_bench_refuses_bad_extra_rows(tmp_path, option, bad):
    with pytest.raises(SystemExit):
        main(["bench", option, bad, "--out", str(tmp_path / "bad")])


def short_bench(out, decoders: str, *options: str) -> dict:
    """``vla-accel bench`` over one 6-step episode without the r sweep; its summary.json."""
    args = ["bench", "--episodes", "1", "--max-steps", "6", "--decoders", decoders, "--no-sweep", *options,
            "--out", str(out)]
    assert main(args) == 0
    return json.loads((out / "summary.json").read_text())


def test_bench_with_incremental_vision_and_the_flow_heads(tmp_path):
    out = tmp_path / "bench_iv"
    summary = short_bench(out, "ar,flow10,flow2", "--incremental-vision")
    assert set(summary) == {"ar", "flow10", "flow2", "ar+iv", "flow10+iv", "flow2+iv"}
    assert summary["ar"]["vision_recomputed_fraction"] == 1.0
    assert summary["ar+iv"]["vision_recomputed_fraction"] < 1.0  # the arm moves, the table does not
    for name in ("ar", "flow10", "flow2"):
        assert summary[f"{name}+iv"]["prefill_speedup_vs_full"] == pytest.approx(
            summary[name]["prefill_ms_p50"] / summary[f"{name}+iv"]["prefill_ms_p50"])
        assert summary[f"{name}+iv"]["prefill_speedup_vs_full_mean"] == pytest.approx(
            summary[name]["prefill_ms_mean"] / summary[f"{name}+iv"]["prefill_ms_mean"])
        assert "prefill_speedup_vs_full" not in summary[name]
    for name in ("flow10", "flow2"):
        assert summary[name]["target_passes_per_action"] == 0.0  # no token decoding after the prefill
    table = (out / "table.md").read_text()
    assert ("prefill ms p50" in table
            and "prefill speed-up over the same decoder with full vision (p50, mean): ar+iv " in table)


def test_heisd_eval_and_bench_with_a_store(tmp_path, capsys):
    pytest.importorskip("faiss")
    import numpy as np

    from vla_accel_ros.decoding.boundary import PUBLISHED_BOUNDARY
    from vla_accel_ros.decoding.retrieval import RetrievalStore

    assert main(["eval", "--decoder", "heisd", "--episodes", "1", "--max-steps", "4", "--store",
                 str(tmp_path / "none"), "--out", str(tmp_path / "x")]) == 2
    assert "eval: error:" in (err := capsys.readouterr().err) and "build-store" in err
    rng = np.random.default_rng(0)  # random keys: any neighbour is a draft; the target still verifies it
    store = RetrievalStore.build(rng.normal(size=(64, 128)).astype(np.float32), rng.integers(0, 255, (64, 4, 7)),
                                 meta={"calibration": PUBLISHED_BOUNDARY.to_dict()})
    store.save(tmp_path / "store")
    out = tmp_path / "bench_heisd"
    args = ["bench", "--episodes", "1", "--max-steps", "10", "--decoders", "ar,heisd", "--no-sweep",
            "--store", str(tmp_path / "store"), "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["heisd"]) >= set(summary["ar"]) - {"speedup_vs_ar"}
    for key in ("retrieval_mode_share", "verify_skip_share", "retrieval_accept_rate", "retrieval_query_ms_p50"):
        assert key in summary["heisd"] and key not in summary["ar"]
    assert 0.0 <= summary["heisd"]["retrieval_mode_share"] <= 1.0


def test_bench_world_aware_verifies_inside_the_prefill_beside_its_after_prefill_row(tmp_path):
    out = tmp_path / "bench"
    summary = short_bench(out, "ar,world_aware", "--after-prefill")
    assert set(summary) == {"ar", "world_aware", "world_aware@after_prefill"}
    verified = summary["world_aware"]
    assert 0 < verified["prefill_verified_share"] < 1  # the first step has no previous action to propose
    assert verified["target_passes_per_action"] == 1.0
    assert verified["decode_ms_p50"] == pytest.approx(verified["total_ms_p50"] - summary["ar"]["prefill_ms_p50"])
    assert "prefill_verified_share" not in summary["world_aware@after_prefill"]
    assert "verified inside the prefill" in (out / "table.md").read_text()
