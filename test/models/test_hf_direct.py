"""The direct forward (models/hf_direct.py) against transformers' modules on a tiny random SigLIP +
Llama VLA: the same features, prefill, one-pass scoring, one-token steps and incremental prefill;
the models it refuses and the spec switch that turns it off."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.hf.checkpoint import load_hf_vla
from vla_accel_ros.models.hf.direct import DirectLlavaForward, unsupported_reason
from vla_accel_ros.models.token_vla.policy import HFTokenVLA

torch.set_num_threads(1)
TOKENS = torch.tensor([[3, 100, 200, 254, 0, 17, 128]])


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0.0, atol=1e-6)


def observation(seed: int, image: np.ndarray | None = None) -> Observation:
    if image is None:
        image = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    return Observation(image=image, instruction="pick up the red cube", joint_pos=np.zeros(7), gripper=0.04)


@pytest.fixture(scope="module")
def pair(tiny_hf_vla: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[HFTokenVLA, HFTokenVLA]:
    """The same SigLIP VLA loaded twice: through the direct forward, and through transformers' modules."""
    direct_dir = tiny_hf_vla(tmp_path_factory.mktemp("hf_direct") / "tiny", vision="siglip")
    modules_dir = direct_dir.parent / "modules"
    shutil.copytree(direct_dir, modules_dir)
    (modules_dir / "vla_spec.json").write_text(json.dumps({"direct_forward": False}))
    return load_hf_vla(direct_dir), load_hf_vla(modules_dir)


def test_the_switch_and_what_each_runs(pair: tuple[HFTokenVLA, HFTokenVLA]) -> None:
    direct, modules = pair
    assert direct.direct is not None and direct.info["forward"] == "direct"
    assert modules.direct is None and modules.info["forward"] == "transformers (direct_forward off)"


def test_features_prefill_and_scoring_match_the_modules(pair: tuple[HFTokenVLA, HFTokenVLA]) -> None:
    direct, modules = pair
    obs = observation(0)
    with torch.inference_mode():
        pixels = direct.pixel_values(obs.image)
        same(direct.image_features(pixels), modules.image_features(pixels))
    a, b = direct.prefill(obs), modules.prefill(obs)
    same(a.action_hidden, b.action_hidden)
    same(a.pooled, b.pooled)
    scored_a, scored_b = direct.prefill_batch([obs], TOKENS), modules.prefill_batch([obs], TOKENS)
    same(scored_a.logits, scored_b.logits)
    # a 7-token verify pass after the prefill, then one-token steps after a rollback
    same(direct.score(a, TOKENS).logits, modules.score(b, TOKENS).logits)
    for i in range(3):
        step_a, step_b = direct.score(a, TOKENS[:, i : i + 1]), modules.score(b, TOKENS[:, i : i + 1])
        same(step_a.logits, step_b.logits)
        a, b = step_a.prefix, step_b.prefix


def test_the_incremental_prefill_matches_the_modules(pair: tuple[HFTokenVLA, HFTokenVLA]) -> None:
    direct, modules = pair
    config = VisionReuseConfig(reuse_kv=True, feature_threshold=0.0)  # by pixels: one patch recomputed
    runs = [policy.incremental_prefill(config) for policy in pair]
    image = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    for frame in range(4):
        image = image.copy()
        image[8 * frame : 8 * frame + 8, :8] = 255 - image[8 * frame : 8 * frame + 8, :8]  # one patch moves
        a, b = (run.prefill_batch([observation(0, image)], TOKENS) for run in runs)
        same(a.logits, b.logits)
        assert runs[0].last == runs[1].last
    assert not runs[0].last.refreshed and runs[0].last.recomputed < direct.config.n_image_tokens


def test_what_it_refuses(tiny_hf_vla: Callable[..., Path], tmp_path: Path) -> None:
    policy = load_hf_vla(tiny_hf_vla(tmp_path / "clip", vision="clip"))
    reason = unsupported_reason(policy.model)
    assert "not SigLIP" in reason
    assert policy.direct is None and policy.info["forward"] == f"transformers (no direct forward: {reason})"
    with pytest.raises(ValueError, match="no direct forward"):
        DirectLlavaForward(policy.model)


def test_a_tower_pass_over_every_patch_equals_the_full_one(pair: tuple[HFTokenVLA, HFTokenVLA]) -> None:
    direct = pair[0].direct
    assert direct is not None
    with torch.inference_mode():
        first = direct.tower_pass(pair[0].pixel_values(observation(0).image))
        pixels = pair[0].pixel_values(observation(1).image)
        full = direct.tower_pass(pixels)
        every = direct.tower_pass(pixels, torch.arange(full.features.shape[1]), first)
        unchanged = direct.tower_pass(pixels, torch.tensor([2, 5]), full)
    torch.testing.assert_close(every.features, full.features, rtol=0, atol=1e-5)
    for got, want in zip(every.keys + every.values, full.keys + full.values, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(unchanged.features, full.features, rtol=0, atol=1e-5)  # same pixels: same result
    with pytest.raises(ValueError, match="needs the cache"):
        direct.tower_pass(pixels, torch.tensor([0]))
