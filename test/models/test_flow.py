"""The continuous action head: flow matching learns, the student follows the teacher, files round-trip."""

import json

import numpy as np
import pytest
import torch

from vla_accel_ros.models import load_checkpoint
from vla_accel_ros.models.own.checkpoint import (
    FLOW_META_FILE,
    FLOW_WEIGHTS_FILE,
    CheckpointError,
    save_flow_heads,
)
from vla_accel_ros.models.own.flow import FlowHeadConfig, FlowHeads, euler_sample
from vla_accel_ros.training.flow import FlowTrainConfig, evaluate_heads, train_heads

torch.set_num_threads(1)


def toy_problem(n: int = 512, d: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions that are a fixed function of the condition, inside [-1, 1]."""
    g = torch.Generator().manual_seed(0)
    cond = torch.randn(n, 2 * d, generator=g)
    actions = torch.tanh(cond[:, :7] * 0.8)
    return cond, actions


def test_teacher_learns_and_student_follows_it() -> None:
    cond, actions = toy_problem()
    cfg = FlowTrainConfig(checkpoint="", data="", epochs=60, distill_epochs=30, batch_size=64, lr=3e-3, hidden=64,
                          layers=2, progress=False)
    heads, history = train_heads(cfg, cond, actions, torch.arange(448))
    assert np.mean(history["teacher"][-20:]) < 0.5 * np.mean(history["teacher"][:20])
    assert np.mean(history["student"][-20:]) < np.mean(history["student"][:20])
    metrics = evaluate_heads(heads, cond[448:], actions[448:], seed=0)  # held out
    untrained = evaluate_heads(FlowHeads(heads.config), cond[448:], actions[448:], seed=0)
    assert metrics["teacher_abs_bins"] < 0.5 * untrained["teacher_abs_bins"]
    assert metrics["student_abs_bins"] < 0.5 * untrained["student_abs_bins"]
    assert metrics["agreement_abs_bins"] < metrics["teacher_abs_bins"] + 5  # the student tracks the teacher
    assert 0.0 <= metrics["agreement_within2"] <= 1.0


def test_folded_sampler_equals_euler_steps_of_the_velocity_field() -> None:
    """Sampling splits the first layer by input; it must be the plain Euler integration of ``forward``."""
    field = FlowHeads(FlowHeadConfig(d_model=8, hidden=32, layers=3)).teacher
    cond, x = torch.randn(5, 16), torch.randn(5, 7)
    with torch.no_grad():
        want = x
        for i in range(4):
            want = want + 0.25 * field(want, torch.full((5,), i * 0.25), cond)
        torch.testing.assert_close(field.euler(cond, x, 4), want, atol=1e-5, rtol=0)


def test_a_narrower_student_distils_from_the_teacher() -> None:
    cond, actions = toy_problem()
    cfg = FlowTrainConfig(checkpoint="", data="", epochs=60, distill_epochs=30, batch_size=64, lr=3e-3, hidden=64,
                          layers=2, student_hidden=16, progress=False)
    heads, history = train_heads(cfg, cond, actions, torch.arange(448))
    assert heads.student.net[0].out_features == 16 and heads.teacher.net[0].out_features == 64
    assert np.mean(history["student"][-20:]) < 0.5 * np.mean(history["student"][:20])
    metrics = evaluate_heads(heads, cond[448:], actions[448:], seed=0)
    assert metrics["agreement_abs_bins"] < metrics["teacher_abs_bins"] + 5
    with pytest.raises(ValueError, match="student_hidden"):
        FlowHeadConfig(student_hidden=-1)


def test_teacher_from_reuses_a_trained_teacher_and_distils_only(tmp_path) -> None:
    cond, actions = toy_problem()
    cfg = FlowTrainConfig(checkpoint="", data="", epochs=20, distill_epochs=2, batch_size=64, lr=3e-3, hidden=32,
                          layers=2, progress=False)
    first, _ = train_heads(cfg, cond, actions, torch.arange(448))
    save_flow_heads(first, tmp_path, recipe={}, metrics={})
    again = FlowTrainConfig(**{**cfg.__dict__, "teacher_from": str(tmp_path), "student_hidden": 8, "distill_epochs": 5})
    heads, history = train_heads(again, cond, actions, torch.arange(448))
    assert history["teacher"] == [] and len(history["student"]) > 0
    for a, b in zip(heads.teacher.parameters(), first.teacher.parameters()):
        assert torch.equal(a, b)
    assert heads.student.net[0].out_features == 8
    with pytest.raises(ValueError, match="no flow head"):
        train_heads(FlowTrainConfig(**{**again.__dict__, "teacher_from": str(tmp_path / "none")}), cond, actions,
                    torch.arange(448))


def test_sampler_is_deterministic_for_a_seed_and_bounded() -> None:
    heads = FlowHeads(FlowHeadConfig(d_model=8, hidden=16, layers=1))
    with torch.no_grad():
        for p in heads.parameters():
            p.mul_(20.0)  # a wild field: samples must still be clipped into [-1, 1]
    cond = torch.randn(32, 16)
    a = heads.sample(cond, torch.randn(32, 7, generator=torch.Generator().manual_seed(3)), student=True)
    b = heads.sample(cond, torch.randn(32, 7, generator=torch.Generator().manual_seed(3)), student=True)
    assert torch.equal(a, b) and a.abs().max() <= 1.0
    assert torch.equal(euler_sample(heads.teacher, cond, torch.zeros(32, 7), 10),
                       heads.sample(cond, torch.zeros(32, 7), student=False))


def test_flow_head_files_round_trip_and_fail_clearly(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    assert load_checkpoint(ckpt).flow is None
    heads = FlowHeads(FlowHeadConfig(d_model=32, hidden=16, layers=1))
    save_flow_heads(heads, ckpt, recipe={"test": True}, metrics={})
    loaded = load_checkpoint(ckpt).flow
    assert loaded is not None
    for name, tensor in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor)

    meta = json.loads((ckpt / FLOW_META_FILE).read_text())
    (ckpt / FLOW_META_FILE).write_text(json.dumps({**meta, "config": {**meta["config"], "d_model": 64}}))
    with pytest.raises(CheckpointError, match="flow_head.json: d_model 64"):
        load_checkpoint(ckpt)
    (ckpt / FLOW_META_FILE).write_text(json.dumps(meta))
    (ckpt / FLOW_WEIGHTS_FILE).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="flow_head.safetensors: truncated: 7 bytes, no safetensors header"):
        load_checkpoint(ckpt)
    (ckpt / FLOW_WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match="flow_head.safetensors: file not found"):
        load_checkpoint(ckpt)
