"""vla-accel cost on small models of each family's layout: the per-pass table with its bounds, the
scaling to the real depth, the decoders priced from a real eval summary, the JSON contract and the
refusals. The published shapes themselves are the command's (docs/benchmarks.md)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vla_accel_ros.cli import main
from vla_accel_ros.evaluation import published_models
from vla_accel_ros.evaluation.bounds import Bounds, Timing, Work, pass_work, time_pass
from vla_accel_ros.evaluation.cost import CostOptions, cost, implied_per_action, measured_passes
from vla_accel_ros.evaluation.published_models import TokenVLAShape
from vla_accel_ros.models.openvla.vision import TowerConfig

pytest.importorskip("transformers")

# OpenVLA's layout at a small size: a 2-layer Llama 64 wide, two 3-block towers at 56 px (16 patches)
TINY = TokenVLAShape(
    llama={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 4, "max_position_embeddings": 512, "rms_norm_eps": 1e-6},
    towers=(TowerConfig(width=64, depth=3, heads=1, mlp_width=128, patch_size=14, image_size=56, prefix_tokens=5,
                        layer_scale=True),
            TowerConfig(width=72, depth=3, heads=1, mlp_width=128, patch_size=14, image_size=56)))
ROW_KEYS = {"median_ms", "min_ms", "max_ms", "peak_memory_mb", "flops", "weight_bytes", "bound_ms", "bound", "x_bound"}
TOKEN_PASSES = {"vision", "prefill", "step_1_token", "verify_6_tokens", "prefill_verifying_6"}


def check_rows(table: dict) -> None:
    for name, row in table.items():
        assert ROW_KEYS <= set(row), name
        assert 0 < row["min_ms"] <= row["median_ms"] <= row["max_ms"], name
        assert math.isfinite(row["x_bound"]) and row["x_bound"] > 0, name
        assert row["bound_ms"] > 0 and row["flops"] > 0 and row["weight_bytes"] > 0, name
        assert row["peak_memory_mb"] > 0, name


@pytest.fixture(scope="module")
def openvla_summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("cost")
    return cost(CostOptions(family="openvla", layers=1, repeats=2, out=str(out)), shape=TINY), out


def test_the_openvla_table_has_every_pass_against_its_bound(openvla_summary):
    summary, out = openvla_summary
    assert set(summary["table"]) == TOKEN_PASSES
    check_rows(summary["table"])
    bounds = summary["bounds"]
    assert bounds["copy_gb_s"] > 0 and bounds["matmul_tflop_s"] > 0
    assert bounds["matmul_dtype"] in ("float32", "bfloat16")
    assert summary["text_layers_built"] == 1 and summary["text_layers_real"] == 2
    assert summary["dtype"] == "float32" and summary["clock"] == "process CPU time"
    assert summary["prefix_tokens"] > 16  # BOS, 16 patches, OpenVLA's prompt
    # a 1-token step reads the text model's weights and does little arithmetic: the bandwidth sets its bound
    assert summary["table"]["step_1_token"]["bound"] == "bandwidth"
    assert summary["table"]["prefill"]["flops"] > summary["table"]["step_1_token"]["flops"] * 10
    assert json.loads((out / "cost.json").read_text()) == json.loads(json.dumps(summary))


def test_a_pass_built_with_fewer_layers_is_scaled_to_the_real_depth(tmp_path, openvla_summary):
    scaled = openvla_summary[0]["table"]
    whole = cost(CostOptions(family="openvla", layers=0, repeats=2, out=str(tmp_path)), shape=TINY)
    assert whole["text_layers_built"] == whole["text_layers_real"] == 2
    # the weight bytes a step reads are the layers' (both layers alike), so scaling one layer by 2 is exact
    # up to the final norm and the gathered head rows, which are not scaled apart
    one_layer_step = scaled["step_1_token"]["weight_bytes"]
    assert one_layer_step == pytest.approx(whole["table"]["step_1_token"]["weight_bytes"], rel=0.05)
    # the towers are measured whole, not scaled
    assert scaled["vision"]["flops"] == pytest.approx(whole["table"]["vision"]["flops"])


@pytest.mark.parametrize("family, passes", [("oft", {"vision", "chunk_pass"}), ("hf", TOKEN_PASSES)])
def test_oft_and_llava_tables(tmp_path, family, passes):
    summary = cost(CostOptions(family=family, layers=1, repeats=1, out=str(tmp_path)), shape=TINY)
    assert set(summary["table"]) == passes
    check_rows(summary["table"])
    if family == "oft":
        assert summary["chunk_shape"] == [8, 7]
        assert summary["table"]["chunk_pass"]["flops"] > summary["table"]["vision"]["flops"]


def test_a_flow_familys_chunks_add_their_passes(tmp_path):
    summary = cost(CostOptions(family="smolvla", layers=1, repeats=1, out=str(tmp_path)), shape=1)
    table = summary["table"]
    assert {"towers", "vlm", "flow_step", "prefix_incremental_unchanged", "prefix", "chunk_10_steps",
            "chunk_2_steps", "chunk_2_steps_incremental_unchanged"} <= set(table)
    check_rows(table)
    assert table["chunk_10_steps"]["median_ms"] == pytest.approx(
        table["towers"]["median_ms"] + table["vlm"]["median_ms"] + 10 * table["flow_step"]["median_ms"])
    assert table["chunk_2_steps"]["bound_ms"] == pytest.approx(
        table["towers"]["bound_ms"] + table["vlm"]["bound_ms"] + 2 * table["flow_step"]["bound_ms"])
    assert summary["text_layers_real"] == 16
    # bucketed incremental vision: each bucket's rows pass, and its partial prefix beside the full one
    assert summary["buckets"] == [0, 24, 48, 96, 192] and summary["image_tokens"] == 192
    for size, towers in [(0, None), (24, "towers_1_cameras"), (96, "towers_2_cameras"), (192, "towers")]:
        parts = {f"prefix_rows_bucket_{size}": 1.0, **({towers: 1.0} if towers else {})}
        assert table[f"prefix_bucket_{size}"]["of"] == parts
        assert table[f"prefix_bucket_{size}"]["median_ms"] == pytest.approx(
            sum(table[p]["median_ms"] for p in parts))
    # more rows, more work; the rows pass of no image row is the unchanged frame's pass
    flops = [table[f"prefix_rows_bucket_{size}"]["flops"] for size in summary["buckets"]]
    assert flops == sorted(flops) and flops[0] < flops[-1]
    assert flops[0] == pytest.approx(table["prefix_incremental_unchanged"]["flops"], rel=0.02)
    # the guided sampler (real-time chunking) does ten flow steps' work
    assert table["flow_10_steps_guided"]["flops"] == pytest.approx(10 * table["flow_step"]["flops"])


def test_passes_from_a_real_eval_summary_price_the_decoders(tmp_path, tiny_hf_vla, openvla_summary):
    directory = tiny_hf_vla(tmp_path / "vla")
    for decoder in ("ar", "kerv"):
        assert main(["eval", "--checkpoint", f"hf:{directory}", "--decoder", decoder, "--episodes", "1",
                     "--max-steps", "3", "--allow-unmatched-robot", "--out", str(tmp_path / decoder)]) == 0
    files = tuple(str(tmp_path / d / "summary.json") for d in ("ar", "kerv"))
    measured = measured_passes(files)
    evaluated = {d: json.loads((tmp_path / d / "summary.json").read_text()) for d in ("ar", "kerv")}
    assert {d: m["target_passes_per_action"] for d, m in measured.items()} == {
        d: s["target_passes_per_action"] for d, s in evaluated.items()}
    summary = cost(CostOptions(family="openvla", layers=1, repeats=1, passes_from=files, out=str(tmp_path / "c")),
                   shape=TINY)
    table = summary["table"]
    rows = {r["decoder"]: r for r in summary["decoders"]}
    ar_passes = evaluated["ar"]["target_passes_per_action"]
    assert rows["ar"]["implied_ms_per_action"] == pytest.approx(
        table["prefill"]["median_ms"] + ar_passes * table["step_1_token"]["median_ms"])
    assert rows["kerv"]["pass"] == "verify_6_tokens" and rows["ar"]["implied_speedup_vs_ar"] == pytest.approx(1.0)
    assert rows["kerv"]["source"] == files[1]


def test_a_share_verified_in_the_prefill_is_priced_at_the_verifying_prefill(openvla_summary):
    table = openvla_summary[0]["table"]
    measured = {"world_aware": {"target_passes_per_action": 1.2, "prefill_verified_share": 0.75, "source": "x"}}
    (row,) = implied_per_action(table, measured)
    expected = (0.25 * table["prefill"]["median_ms"] + 0.75 * table["prefill_verifying_6"]["median_ms"]
                + 0.45 * table["verify_6_tokens"]["median_ms"])
    assert row["implied_ms_per_action"] == pytest.approx(expected) and row["implied_speedup_vs_ar"] is None


def test_the_json_contract_on_stdout_and_the_table_on_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(published_models, "OPENVLA_7B", TINY)
    assert main(["cost", "--family", "openvla", "--layers", "1", "--device", "cpu", "--repeats", "1", "--json",
                 "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert {"table", "bounds", "device", "device_name", "torch", "cuda", "command", "family"} <= set(document)
    assert document["torch"] == torch.__version__ and document["command"].startswith("vla-accel")
    assert set(document["table"]) == TOKEN_PASSES
    assert "| step_1_token |" in captured.err and "bounds: copy" in captured.err


@pytest.mark.parametrize("argv, says", [
    (["--family", "smolvla", "--passes-from", "x.json"], "--passes-from prices the decoders"),
    (["--device", "gpu"], "--device must be cpu, cuda or cuda:N"),
    (["--repeats", "0"], "--repeats"),
    (["--family", "smolvla", "--incremental"], "--incremental times the prefill"),
])
def test_bad_flags_are_one_line(tmp_path, capsys, argv, says):
    assert main(["cost", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err


def test_a_file_without_pass_counts_is_refused_naming_it(tmp_path, capsys):
    bad = tmp_path / "summary.json"
    bad.write_text(json.dumps({"episodes": 1}))
    with pytest.raises(ValueError, match="summary.json: not a vla-accel eval or bench summary"):
        measured_passes((str(bad),))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a host without CUDA")
def test_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["cost", "--family", "openvla", "--device", "cuda", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sees no CUDA device" in err
    assert not (tmp_path / "cost.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_passes_are_timed_by_cuda_events(tmp_path):
    summary = cost(CostOptions(family="openvla", device="cuda", layers=1, repeats=2, out=str(tmp_path)), shape=TINY)
    assert summary["clock"] == "CUDA events" and summary["dtype"] == "bfloat16"
    assert summary["bounds"]["matmul_dtype"] == "bfloat16"
    check_rows(summary["table"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["smolvla", "pi0", "pi05"])
def test_cuda_a_flow_familys_graphs_and_buckets_are_timed_beside_their_bounds(tmp_path, family):
    summary = cost(CostOptions(family=family, device="cuda", layers=0, repeats=2, out=str(tmp_path)), shape=1)
    table = summary["table"]
    check_rows(table)
    assert summary["graph_errors"] == []
    graphs = {"prefix_graph", "flow_10_steps_graph", "flow_2_steps_graph", "flow_10_steps_guided_graph",
              *(f"prefix_bucket_{size}_graph" for size in summary["buckets"])}
    assert graphs <= set(table)


def test_a_passs_work_counts_its_weights_and_flops():
    linear = torch.nn.Linear(64, 32)
    table = torch.nn.Embedding(1000, 16)
    x, ids = torch.randn(1, 64), torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        work = pass_work(lambda: linear(x), [linear])
        lookup = pass_work(lambda: table(ids), [table])
    assert work.flops == 2 * 64 * 32 and work.weight_bytes == (64 * 32 + 32) * 4
    assert lookup.weight_bytes == 3 * 16 * 4  # the rows read, not the 1000-row table


def test_the_bound_is_the_larger_term_and_scaling_keeps_the_whole_part():
    bounds = Bounds(copy_gb_s=100.0, matmul_tflop_s=1.0, matmul_dtype="float32")
    assert bounds.bound_ms(Work(flops=1e9, weight_bytes=1e9)) == (pytest.approx(10.0), "bandwidth")
    assert bounds.bound_ms(Work(flops=1e11, weight_bytes=1e6)) == (pytest.approx(100.0), "compute")
    vision = Timing(2.0, 1.0, 3.0, 10.0)
    assert Timing(5.0, 4.0, 6.0, 10.0).scaled(vision, 4.0) == Timing(14.0, 10.0, 18.0, 10.0)
    assert Work(10.0, 8.0).scaled(Work(2.0, 0.0), 2.0) == Work(18.0, 16.0)
    timing = time_pass(lambda: sum(range(10_000)), torch.device("cpu"), repeats=3)
    assert 0 <= timing.min_ms <= timing.median_ms <= timing.max_ms


def test_a_checkpoint_is_timed_at_its_own_size_with_its_incremental_prefill(tmp_path, tiny_hf_vla):
    directory = tiny_hf_vla(tmp_path / "tiny", vision="siglip")
    out = tmp_path / "out"
    assert main(["cost", "--family", "hf", "--checkpoint", f"hf:{directory}", "--repeats", "1", "--incremental",
                 "--frames", "5", "--vision-reuse-tower", "--vision-tower-threshold", "0", "--vision-tower-refresh",
                 "2", "--out", str(out)]) == 0
    summary = json.loads((out / "cost.json").read_text())
    assert summary["parameters_built"] < 1_000_000 and summary["text_layers_built"] == summary["text_layers_real"] == 2
    check_rows(summary["table"])
    inc = summary["incremental"]
    assert inc["frames"] == 5 and inc["refreshes"] == 1  # the first frame only
    # frames 1 and 3 (the timer, every 2) run the tower on every patch, the others on the moved ones only
    assert 0 < inc["tower_recomputed_fraction_mean"] < 1
    assert inc["incremental_prefill_speedup"] == pytest.approx(inc["prefill_full_ms_mean"]
                                                               / inc["prefill_incremental_ms_mean"])


def test_a_checkpoint_of_another_family_is_refused(tmp_path, tiny_hf_vla, capsys):
    directory = tiny_hf_vla(tmp_path / "tiny")
    assert main(["cost", "--family", "openvla", "--checkpoint", f"hf:{directory}", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hf family, not openvla" in err


def test_the_incremental_prefill_of_a_model_made_at_a_shape(tmp_path):
    summary = cost(CostOptions(family="hf", layers=1, repeats=1, incremental=True, frames=3, out=str(tmp_path)),
                   shape=TINY)
    inc = summary["incremental"]
    assert inc["frames"] == 3 and inc["refreshes"] == 1 and 0 < inc["recomputed_fraction_mean"] <= 1
