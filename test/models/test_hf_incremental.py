"""The incremental prefill of a Hugging Face VLA (models/hf_incremental.py) on tiny random Llava models
(the ``tiny_hf_vla`` fixture): exact where it must be, what it recomputes, its refreshes, rollback
after it, and the runner driving it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.models.api import Prefix
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.hf.checkpoint import load_hf_vla
from vla_accel_ros.models.token_vla.incremental import HFIncrementalPrefill
from vla_accel_ros.models.token_vla.policy import HFTokenVLA
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner

torch.set_num_threads(1)
INSTRUCTION = "pick up the red cube"
TOKENS = torch.tensor([[3, 100, 200, 254, 0, 17, 128]])
ATOL = 1e-5
N_PATCHES = 16  # 32 px images, 8 px patches
# the pixel rule: threshold 8, refresh every 20 frames, max drift 2
KV = VisionReuseConfig(reuse_kv=True, feature_threshold=0.0)


@pytest.fixture(scope="module")
def policy(tiny_hf_vla: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> HFTokenVLA:
    return load_hf_vla(tiny_hf_vla(tmp_path_factory.mktemp("hf_incremental") / "tiny"))


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def observation(pixels: np.ndarray, instruction: str = INSTRUCTION) -> Observation:
    return Observation(image=pixels, instruction=instruction, joint_pos=np.zeros(7), gripper=0.04)


def with_inverted_patch(pixels: np.ndarray, patch: int) -> np.ndarray:
    """A copy with the pixels of one 8x8 patch (row-major) inverted."""
    row, column = divmod(patch, 4)
    changed = pixels.copy()
    block = changed[8 * row : 8 * row + 8, 8 * column : 8 * column + 8]
    block[:] = 255 - block
    return changed


def assert_same_prefix(policy: HFTokenVLA, got: Prefix, want: Prefix) -> None:
    """The same last hidden state and pooled feature, and ``score`` after them gives the same logits."""
    assert got.prefix_len == want.prefix_len == got.cache.cache.get_seq_length()
    torch.testing.assert_close(got.action_hidden, want.action_hidden, rtol=0, atol=ATOL)
    torch.testing.assert_close(got.pooled, want.pooled, rtol=0, atol=ATOL)
    torch.testing.assert_close(policy.score(got, TOKENS).logits, policy.score(want, TOKENS).logits, rtol=0, atol=ATOL)


# --- exact where it must be -------------------------------------------------------------------
@pytest.mark.parametrize("vision", ["clip", "siglip"])
def test_every_patch_dynamic_equals_the_full_prefill(tiny_hf_vla: Callable[..., Path], tmp_path: Path,
                                                     vision: str) -> None:
    policy = load_hf_vla(tiny_hf_vla(tmp_path / vision, vision=vision))
    incremental = HFIncrementalPrefill(policy, KV)
    incremental.prefill(observation(image(0)))
    assert incremental.last is not None and incremental.last.reason == "first frame"
    new = observation(image(1))  # every patch changes
    prefix = incremental.prefill(new)
    assert not incremental.last.refreshed and incremental.last.recomputed == N_PATCHES
    assert_same_prefix(policy, prefix, policy.prefill(new))


def test_threshold_zero_recomputes_every_image_token_on_any_change(policy: HFTokenVLA) -> None:
    incremental = HFIncrementalPrefill(policy, VisionReuseConfig(threshold=0.0, max_drift=255.0, reuse_kv=True,
                                                                       feature_threshold=0.0))
    pixels = image(2)
    incremental.prefill(observation(pixels))
    for step in range(3):
        pixels = pixels.copy()
        pixels[5 * step, 3, 0] ^= 1  # one value of one patch, by one level
        obs = observation(pixels)
        prefix = incremental.prefill(obs)
        assert incremental.last is not None and not incremental.last.refreshed
        assert incremental.last.recomputed == N_PATCHES  # the tower is bidirectional: every feature moved
        assert_same_prefix(policy, prefix, policy.prefill(obs))
    same = incremental.prefill(observation(pixels.copy()))
    assert incremental.last.recomputed == 0
    assert_same_prefix(policy, same, policy.prefill(observation(pixels)))


def test_an_unchanged_frame_recomputes_only_the_text_without_the_tower(policy: HFTokenVLA) -> None:
    incremental = HFIncrementalPrefill(policy, KV)
    obs = observation(image(3))
    incremental.prefill(obs)
    calls: list[int] = []
    hook = policy.model.model.vision_tower.register_forward_hook(lambda *_: calls.append(1))
    try:
        prefix = incremental.prefill(observation(image(3)))
    finally:
        hook.remove()
    assert incremental.last is not None and (incremental.last.recomputed, incremental.last.fraction) == (0, 0.0)
    assert incremental.recomputed_tokens.tolist() == [] and calls == []
    assert_same_prefix(policy, prefix, policy.prefill(obs))


def test_the_last_patch_changed_equals_the_model_over_reused_and_new_features(policy: HFTokenVLA) -> None:
    """Only the last image token changed: every static image token precedes it, so its cached keys
    and values are exactly those of the model run on the old features there and the new one last."""
    old, new = image(4), with_inverted_patch(image(4), N_PATCHES - 1)
    incremental = HFIncrementalPrefill(policy, KV)
    incremental.prefill(observation(old))
    prefix = incremental.prefill(observation(new))
    assert incremental.recomputed_tokens.tolist() == [N_PATCHES - 1]
    ids = policy.prompt_ids(INSTRUCTION)
    with torch.inference_mode():
        features = policy.image_features(policy.pixel_values(old))
        features[:, -1] = policy.image_features(policy.pixel_values(new))[:, -1]
        embeddings = policy.embed_ids(ids)
        embeddings[:, 1 : 1 + N_PATCHES] = features
        hidden = policy.model.model(inputs_embeds=embeddings).last_hidden_state
    torch.testing.assert_close(prefix.action_hidden, hidden[:, -1:], rtol=0, atol=ATOL)


def test_one_changed_patch_recomputes_exactly_its_token(policy: HFTokenVLA) -> None:
    incremental = HFIncrementalPrefill(policy, KV)
    pixels = image(5)
    incremental.prefill(observation(pixels))
    changed = with_inverted_patch(pixels, 6)
    prefix = incremental.prefill(observation(changed))
    assert incremental.last is not None and not incremental.last.refreshed
    assert incremental.recomputed_tokens.tolist() == [6] and incremental.last.fraction == 1 / N_PATCHES
    assert prefix.prefix_len == policy.prompt_ids(INSTRUCTION).shape[1] == prefix.cache.cache.get_seq_length()
    assert torch.isfinite(policy.score(prefix, TOKENS).logits).all()
    # The same frame again reuses the reordered cache of that pass: the same prefix, exactly.
    again = incremental.prefill(observation(changed.copy()))
    assert incremental.last.recomputed == 0
    assert_same_prefix(policy, again, prefix)


def test_a_changed_instruction_the_timer_and_drift_refresh_everything(policy: HFTokenVLA) -> None:
    incremental = HFIncrementalPrefill(policy, VisionReuseConfig(refresh_steps=3, max_drift=1.0, reuse_kv=True,
                                                                      feature_threshold=0.0))
    pixels = image(6)
    incremental.prefill(observation(pixels))
    other = observation(pixels, "pick up the blue cube")
    prefix = incremental.prefill(other)
    assert incremental.last is not None and incremental.last.refreshed
    assert (incremental.last.reason, incremental.last.fraction) == ("instruction changed", 1.0)
    assert_same_prefix(policy, prefix, policy.prefill(other))
    for _ in range(2):  # a full prefill every 3 frames
        incremental.prefill(other)
        assert not incremental.last.refreshed
    incremental.prefill(other)
    assert incremental.last.reason == "timer"
    noisy = np.clip(pixels.astype(int) + 3, 0, 255).astype(np.uint8)  # under the threshold everywhere
    incremental.prefill(observation(noisy, "pick up the blue cube"))
    assert incremental.last.reason == "drift"
    incremental.reset()
    incremental.prefill(other)
    assert incremental.last.reason == "first frame"


# --- the feature rule ---------------------------------------------------------------------------
FEATURES = VisionReuseConfig(reuse_kv=True, feature_threshold=0.05)


def relative_feature_change(policy: HFTokenVLA, old: np.ndarray, new: np.ndarray) -> torch.Tensor:
    """(P,) |f_new - f_old| / |f_old| per image token."""
    with torch.inference_mode():
        f_old = policy.image_features(policy.pixel_values(old))[0]
        f_new = policy.image_features(policy.pixel_values(new))[0]
    return (f_new - f_old).norm(dim=-1) / f_old.norm(dim=-1)


def test_the_feature_rule_recomputes_the_tokens_whose_features_moved(policy: HFTokenVLA) -> None:
    """The tower is bidirectional, so one inverted patch moves the features of other patches too:
    the feature rule recomputes exactly the tokens whose features moved past the threshold, with the
    tower run once per frame."""
    old, new = image(11), with_inverted_patch(image(11), 6)
    change = relative_feature_change(policy, old, new)
    moved = torch.nonzero(change > FEATURES.feature_threshold).squeeze(1).tolist()
    assert 6 in moved and 1 < len(moved) < N_PATCHES  # more than the patch itself, not every token
    incremental = HFIncrementalPrefill(policy, FEATURES)
    incremental.prefill(observation(old))
    calls: list[int] = []
    hook = policy.model.model.vision_tower.register_forward_hook(lambda *_: calls.append(1))
    try:
        prefix = incremental.prefill(observation(new))
    finally:
        hook.remove()
    assert incremental.recomputed_tokens.tolist() == moved and calls == [1]
    assert incremental.last is not None and not incremental.last.refreshed
    assert torch.isfinite(policy.score(prefix, TOKENS).logits).all()


def test_the_feature_rule_compares_with_the_features_behind_the_cache(policy: HFTokenVLA) -> None:
    """A token left static keeps its reference: small changes add up until it is recomputed, and
    the same frame again recomputes nothing and gives the same prefix."""
    incremental = HFIncrementalPrefill(policy, FEATURES)
    pixels = image(12)
    incremental.prefill(observation(pixels))
    again = incremental.prefill(observation(pixels.copy()))
    assert incremental.last is not None and incremental.last.recomputed == 0
    assert_same_prefix(policy, again, policy.prefill(observation(pixels)))
    step = np.clip(pixels.astype(int) + 2, 0, 255).astype(np.uint8)
    first = relative_feature_change(policy, pixels, step)
    incremental.prefill(observation(step))
    assert incremental.last.recomputed == int((first > FEATURES.feature_threshold).sum())
    static = first <= FEATURES.feature_threshold
    further = np.clip(pixels.astype(int) + 4, 0, 255).astype(np.uint8)
    incremental.prefill(observation(further))
    # judged against the first frame's features, not the previous frame's
    want = static & (relative_feature_change(policy, pixels, further) > FEATURES.feature_threshold)
    assert set(torch.nonzero(want).squeeze(1).tolist()) <= set(incremental.recomputed_tokens.tolist())


def test_the_feature_rule_with_every_token_moved_equals_the_full_prefill(policy: HFTokenVLA) -> None:
    incremental = HFIncrementalPrefill(policy, FEATURES)
    first = incremental.prefill(observation(image(13)))
    assert incremental.last is not None and incremental.last.reason == "first frame"
    assert_same_prefix(policy, first, policy.prefill(observation(image(13))))  # its full prefill reuses the features
    new = observation(image(14))
    prefix = incremental.prefill(new)
    assert incremental.last.recomputed == N_PATCHES
    assert_same_prefix(policy, prefix, policy.prefill(new))
    scored = incremental.prefill_batch([observation(image(15))], TOKENS[:, :6])
    torch.testing.assert_close(scored.logits, policy.prefill_batch([observation(image(15))], TOKENS[:, :6]).logits,
                               rtol=0, atol=ATOL)


def test_the_feature_rule_is_the_default_and_the_package_policy_judges_by_pixels() -> None:
    from vla_accel_ros.core.resources import default_checkpoint
    from vla_accel_ros.models import load_checkpoint

    assert VisionReuseConfig().feature_threshold == 0.15
    package_policy = load_checkpoint(default_checkpoint())
    size, patch = package_policy.config.image_size, package_policy.config.patch_size
    encoder = package_policy.incremental_prefill(VisionReuseConfig(reuse_kv=True))
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    encoder.prefill(observation(pixels))
    moved = pixels.copy()
    moved[:patch, :patch] = 255 - moved[:patch, :patch]  # one of its patches
    encoder.prefill(observation(moved))
    assert encoder.last is not None and encoder.last.recomputed == 1
    with pytest.raises(ValueError, match="feature_threshold must be >= 0"):
        VisionReuseConfig(feature_threshold=-0.1)


# --- rollback and scoring after an incremental prefill ----------------------------------------
def incremental_prefix(policy: HFTokenVLA, seed: int) -> tuple[HFIncrementalPrefill, Observation, Prefix]:
    """An incremental prefill after a frame with one changed patch."""
    incremental = HFIncrementalPrefill(policy, KV)
    pixels = image(seed)
    incremental.prefill(observation(pixels))
    obs = observation(with_inverted_patch(pixels, 9))
    return incremental, obs, incremental.prefill(obs)


@pytest.mark.parametrize(("m", "more"), [(0, [5, 6]), (3, [9]), (7, [])])
def test_truncate_then_score_after_an_incremental_prefill(policy: HFTokenVLA, m: int, more: list[int]) -> None:
    _, _, prefix = incremental_prefix(policy, 7)
    whole = policy.score(prefix, TOKENS)
    steps = [policy.score(prefix, TOKENS[:, :0]).logits[:, 0]]
    step = prefix
    for i in range(TOKENS.shape[1]):  # one token at a time: the same logits
        out = policy.score(step, TOKENS[:, i : i + 1])
        step = out.prefix
        steps.append(out.logits[:, 1])
    torch.testing.assert_close(whole.logits, torch.stack(steps, dim=1), rtol=0, atol=ATOL)
    again = policy.score(whole.prefix.truncate(m), torch.tensor([more], dtype=torch.long))
    direct = policy.score(prefix, torch.tensor([TOKENS[0, :m].tolist() + more], dtype=torch.long))
    torch.testing.assert_close(again.logits, direct.logits[:, m:], rtol=0, atol=ATOL)


def test_prefill_scored_equals_the_incremental_prefill_then_score(policy: HFTokenVLA) -> None:
    pixels = image(8)
    frames = [observation(pixels), observation(with_inverted_patch(pixels, 9))]
    apart_by, scored_by = HFIncrementalPrefill(policy, KV), HFIncrementalPrefill(policy, KV)
    for obs in frames:
        prefix = apart_by.prefill(obs)
    scored_by.prefill(frames[0])
    scored = scored_by.prefill_batch([frames[1]], TOKENS[:, :6])
    assert scored_by.last is not None and scored_by.last.recomputed == 1
    apart = policy.score(prefix, TOKENS[:, :6])
    torch.testing.assert_close(scored.logits, apart.logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(scored.prefix.pooled, prefix.pooled, rtol=0, atol=ATOL)
    assert scored.prefix.prefix_len == prefix.prefix_len and scored.prefix.tokens.tolist() == TOKENS[:, :6].tolist()
    on = policy.score(scored.prefix.truncate(2), torch.tensor([[7, 8]]))
    off = policy.score(apart.prefix.truncate(2), torch.tensor([[7, 8]]))
    torch.testing.assert_close(on.logits, off.logits, rtol=0, atol=ATOL)


# --- how it is selected -----------------------------------------------------------------------
def test_reuse_of_tower_outputs_alone_is_refused(policy: HFTokenVLA) -> None:
    with pytest.raises(ValueError, match="only with reused keys/values.*bidirectional"):
        HFIncrementalPrefill(policy, VisionReuseConfig())
    with pytest.raises(ValueError, match="only with reused keys/values"):
        policy.incremental_prefill(VisionReuseConfig(reuse_kv=False))


def test_an_hf_policy_serves_its_own_incremental_prefill(policy: HFTokenVLA) -> None:
    encoder = policy.incremental_prefill(KV)
    pixels = image(9)
    encoder.prefill(observation(pixels))
    assert encoder.last is not None and encoder.last.refreshed
    prefix = encoder.prefill(observation(pixels.copy()))
    assert isinstance(prefix, Prefix) and encoder.last.recomputed == 0
    scored = encoder.prefill_batch([observation(with_inverted_patch(pixels, 2))], TOKENS[:, :6])
    assert encoder.last.recomputed == 1 and scored.logits.shape == (1, 7, 256)
    encoder.reset()
    encoder.prefill(observation(pixels))
    assert encoder.last.reason == "first frame"


@pytest.mark.parametrize("decoder", ["ar", "kerv", "world_aware"])
def test_a_runner_decodes_an_hf_policy_with_reused_keys_and_values(policy: HFTokenVLA, decoder: str) -> None:
    runner = build_runner(RunnerConfig(decoder=decoder, temperature=0.0, vision=KV), ArmKinematics(default_urdf()),
                          policy=policy)
    assert vision_fractions(runner, image(10), steps=5, patch_5_moves_at=3) == [1.0, 0.0, 0.0, 1 / N_PATCHES, 0.0]


def vision_fractions(runner: Any, pixels: np.ndarray, steps: int, patch_5_moves_at: int) -> list[float]:
    """The runner's share of image patches re-encoded per step over ``pixels``, patch 5 inverted
    from step ``patch_5_moves_at`` on; every action sound."""
    fractions = []
    for step in range(steps):
        if step == patch_5_moves_at:
            pixels = with_inverted_patch(pixels, 5)
        obs = Observation(image=pixels, instruction=INSTRUCTION, joint_pos=np.full(7, 0.01 * step), gripper=0.04,
                          stamp=0.05 * step)
        result = runner(obs)
        assert result.tokens.shape == (7,) and np.isfinite(result.action).all()
        fractions.append(result.vision_fraction)
    return fractions


def test_eval_refuses_per_patch_vision_on_an_hf_policy_in_one_line(tiny_hf_vla: Callable[..., Path],
                                                                    tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from vla_accel_ros.cli import main

    directory = tiny_hf_vla(tmp_path / "hf")
    assert main(["eval", "--checkpoint", f"hf:{directory}", "--vision", "incremental", "--episodes", "1",
                 "--max-steps", "2", "--allow-unmatched-robot", "--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error:" in line] == [line for line in err.splitlines()
                                                                       if line.startswith("eval: error:")]
    assert "reuse_kv" in err


def test_a_prompt_that_puts_the_image_after_the_instruction(tiny_hf_vla: Callable[..., Path], tmp_path: Path) -> None:
    directory = tiny_hf_vla(tmp_path / "text_first")
    (directory / "vla_spec.json").write_text('{"prompt": "In: {instruction}?{image}\\nOut:"}')
    policy = load_hf_vla(directory)
    ids = policy.prompt_ids(INSTRUCTION)[0]
    is_image = (ids == policy.image_token_id).nonzero().squeeze(1)
    assert len(is_image) == N_PATCHES and 1 < int(is_image[0]) and int(is_image[-1]) < len(ids) - 1
    assert bool((is_image.diff() == 1).all())  # one block, with text before and after it
    incremental = HFIncrementalPrefill(policy, KV)
    incremental.prefill(observation(image(0)))
    new = observation(image(1))  # every patch changes: the text before the image stays cached
    assert_same_prefix(policy, incremental.prefill(new), policy.prefill(new))
    one = observation(with_inverted_patch(image(1), 5))
    incremental.prefill(one)
    assert incremental.last.recomputed == 1


def test_a_proprio_prompt_recomputes_the_proprio_tokens_with_the_text(tiny_hf_vla: Callable[..., Path],
                                                                       tmp_path: Path) -> None:
    directory = tiny_hf_vla(tmp_path / "proprio")
    table = json.loads((directory / "dataset_statistics.json").read_text())
    table["tiny_dataset"]["proprio"] = {"q01": [-1.0] * 7 + [0.0], "q99": [1.0] * 7 + [0.04]}
    (directory / "dataset_statistics.json").write_text(json.dumps(table))
    (directory / "vla_spec.json").write_text(json.dumps({"prompt": "In: {instruction}?{image}{proprio}\nOut:"}))
    policy = load_hf_vla(directory)
    incremental = HFIncrementalPrefill(policy, KV)
    pixels = image(7)
    incremental.prefill(observation(pixels))
    for step in (1, 2):  # the arm moves, the image stays: exact, with no image token recomputed
        obs = Observation(image=pixels, instruction=INSTRUCTION, joint_pos=np.full(7, 0.3 * step), gripper=0.01 * step)
        prefix = incremental.prefill(obs)
        assert not incremental.last.refreshed and incremental.last.recomputed == 0
        assert_same_prefix(policy, prefix, policy.prefill(obs))
        assert not torch.equal(prefix.action_hidden, policy.prefill(observation(pixels)).action_hidden)


# --- the tower's reuse (reuse_tower) --------------------------------------------------------
@pytest.fixture(scope="module")
def siglip_policy(tiny_hf_vla: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> HFTokenVLA:
    return load_hf_vla(tiny_hf_vla(tmp_path_factory.mktemp("hf_tower") / "tiny", vision="siglip"))


def tower_reuse(**overrides: Any) -> VisionReuseConfig:
    """The pixel rule with the tower's reuse; ``overrides`` replace its fields."""
    return VisionReuseConfig(**{"reuse_kv": True, "feature_threshold": 0.0, "reuse_tower": True, **overrides})


def test_tower_reuse_with_every_patch_moved_equals_the_full_prefill(siglip_policy: HFTokenVLA) -> None:
    incremental = HFIncrementalPrefill(siglip_policy, tower_reuse(tower_refresh_steps=100))
    incremental.prefill(observation(image(20)))
    assert incremental.last_tower is not None and incremental.last_tower.refreshed
    obs = observation(image(21))  # every patch moves
    prefix = incremental.prefill(obs)
    assert not incremental.last_tower.refreshed and incremental.last_tower.recomputed == N_PATCHES
    assert_same_prefix(siglip_policy, prefix, siglip_policy.prefill(obs))


def test_tower_reuse_runs_the_tower_on_the_moved_patches_only(siglip_policy: HFTokenVLA) -> None:
    incremental = HFIncrementalPrefill(siglip_policy, tower_reuse(tower_refresh_steps=100))
    direct = siglip_policy.direct
    assert direct is not None
    pixels, moved = image(22), with_inverted_patch(image(22), 6)
    with torch.inference_mode():
        before = direct.tower_pass(siglip_policy.pixel_values(pixels)).features
        after = direct.tower_pass(siglip_policy.pixel_values(moved)).features
    incremental.prefill(observation(pixels))
    incremental.prefill(observation(pixels.copy()))  # nothing moved: the tower does not run
    assert incremental.last_tower is not None and incremental.last_tower.recomputed == 0
    incremental.prefill(observation(moved))
    assert incremental.last_tower.recomputed == 1 and incremental.recomputed_tokens.tolist() == [6]
    assert incremental._tower is not None
    features = incremental._tower.features
    static = [p for p in range(N_PATCHES) if p != 6]
    torch.testing.assert_close(features[:, static], before[:, static], rtol=0, atol=0)  # kept as they were
    # the moved patch attended to the others' cached keys and values, which the full pass moves too:
    # near the full pass's features, not equal to them
    assert 0 < float((features[0, 6] - after[0, 6]).norm()) < float((before[0, 6] - after[0, 6]).norm())


def test_tower_reuse_refreshes_on_its_timer_and_with_the_prefill(siglip_policy: HFTokenVLA) -> None:
    incremental = HFIncrementalPrefill(siglip_policy, tower_reuse(tower_refresh_steps=3, refresh_steps=6))
    pixels = image(23)
    reasons = []
    for _ in range(7):
        incremental.prefill(observation(pixels.copy()))
        assert incremental.last_tower is not None
        reasons.append(incremental.last_tower.reason)
    assert reasons == ["first frame", "", "", "tower timer", "", "", "timer"]
    incremental.prefill(observation(pixels.copy(), "pick up the blue cube"))
    assert incremental.last_tower.reason == "instruction changed"


def test_tower_reuse_needs_the_direct_forward(tiny_hf_vla: Callable[..., Path], tmp_path: Path) -> None:
    policy = load_hf_vla(tiny_hf_vla(tmp_path / "clip", vision="clip"))
    with pytest.raises(ValueError, match="reuse_tower.*direct forward"):
        HFIncrementalPrefill(policy, tower_reuse())


def test_a_node_configuration_turns_the_tower_reuse_on(siglip_policy: HFTokenVLA) -> None:
    from vla_accel_ros.core.settings import from_params
    from vla_accel_ros.ros.parameters import NodeConfig

    node = from_params(NodeConfig, {"vision_reuse": True, "vision_reuse_kv": True, "vision_reuse_tower": True,
                                    "vision_feature_threshold": 0.0, "vision_tower_refresh_steps": 100})
    runner = build_runner(replace(node.runner_config(), temperature=0.0), ArmKinematics(default_urdf()),
                          policy=siglip_policy)
    assert vision_fractions(runner, image(24), steps=3, patch_5_moves_at=2) == [1.0, 0.0, 1 / N_PATCHES]
