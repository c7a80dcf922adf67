"""Incremental vision encoding on a tiny random policy: exactness, what gets recomputed, refreshes."""

import numpy as np
import pytest
import torch

from vla_accel_ros.models import Policy, VLAConfig
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.own.incremental import IncrementalVisionEncoder
from vla_accel_ros.models.tokenizer import ActionTokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def policy() -> Policy:
    config = VLAConfig(image_size=32, patch_size=8, d_model=32, n_heads=2, n_layers=1, vision_layers=1,
                       max_text_len=8, local_channels=8, contact_hidden=8, keypoints=2, text_layers=1)
    return Policy.create(config, ActionTokenizer(np.full(7, -1.0), np.full(7, 1.0)), seed=0)


def frame(seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, 32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


TEXT = torch.tensor([[1, 2, 3, 4, 0, 0, 0, 0]])


def with_inverted_patch(images: torch.Tensor, patch: int) -> torch.Tensor:
    """A copy of (1, 32, 32, 3) images with the pixels of one 8x8 patch (row-major) inverted."""
    row, column = divmod(patch, 4)
    changed = images.clone()
    block = changed[0, 8 * row : 8 * row + 8, 8 * column : 8 * column + 8]
    block.copy_(255 - block)
    return changed


def full(policy: Policy, images: torch.Tensor, text: torch.Tensor = TEXT) -> torch.Tensor:
    return policy.encode_local(images, text)


def test_threshold_zero_equals_full_encoding(policy: Policy) -> None:
    reuse = IncrementalVisionEncoder(policy, VisionReuseConfig(threshold=0.0, refresh_steps=100, max_drift=1e9))
    images = frame(0)
    for step in range(6):
        images = images.clone()
        r, c = (step * 5) % 24, (step * 11) % 24
        images[0, r : r + 6, c : c + 6] = 255 - images[0, r : r + 6, c : c + 6]  # a moving object
        torch.testing.assert_close(reuse.encode(images, TEXT), full(policy, images), atol=1e-5, rtol=0)
    assert reuse.last is not None and not reuse.last.refreshed and 0 < reuse.last.recomputed < 16


def test_unchanged_frame_recomputes_nothing_and_one_patch_recomputes_one(policy: Policy) -> None:
    reuse = IncrementalVisionEncoder(policy)
    images = frame(1)
    reuse.encode(images, TEXT)
    assert reuse.last.refreshed and reuse.last.reason == "first frame" and reuse.last.fraction == 1.0
    reuse.encode(images.clone(), TEXT)
    assert reuse.last.recomputed == 0 and not reuse.last.refreshed
    changed = with_inverted_patch(images, 6)  # row 1, column 2
    local = reuse.encode(changed, TEXT)
    assert reuse.last.recomputed == 1 and reuse.last.fraction == 1 / 16
    torch.testing.assert_close(local, full(policy, changed), atol=1e-5, rtol=0)  # that patch was the one


def test_refresh_on_timer_drift_and_new_instruction(policy: Policy) -> None:
    reuse = IncrementalVisionEncoder(policy, VisionReuseConfig(threshold=10.0, refresh_steps=3, max_drift=100.0))
    images = frame(2)
    reasons = []
    for _ in range(4):
        reuse.encode(images, TEXT)
        reasons.append(reuse.last.reason)
    assert reasons == ["first frame", "", "", "timer"]
    reuse.encode(images, torch.tensor([[5, 6, 0, 0, 0, 0, 0, 0]]))
    assert reuse.last.reason == "instruction changed"

    drifting = IncrementalVisionEncoder(policy, VisionReuseConfig(threshold=10.0, refresh_steps=100, max_drift=3.0))
    base = frame(3).to(torch.int16)
    reasons = []
    for step in range(6):  # every pixel brightens by 1 a frame: never a dynamic patch, but drift grows
        images = (base + step).clamp(0, 255).to(torch.uint8)
        drifting.encode(images, TEXT)
        reasons.append(drifting.last.reason)
        assert drifting.last.recomputed in (0, 16)
    assert reasons[:4] == ["first frame", "", "", ""] and "drift" in reasons[4:]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="threshold"):
        VisionReuseConfig(threshold=-1)
    with pytest.raises(ValueError, match="refresh_steps"):
        VisionReuseConfig(refresh_steps=0)


def test_policy_runner_reuses_vision_and_restarts_it_with_the_episode(tmp_path, tiny_checkpoint) -> None:
    """The node's runner (thread and process mode build the same one) with incremental vision on."""
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.runtime.runner import PolicyRunner

    kin = ArmKinematics(default_urdf())
    runner = PolicyRunner.load(tiny_checkpoint(tmp_path / "ckpt"), "kerv", kin, action_dt_s=0.05, period_s=0.05,
                               vision=VisionReuseConfig(threshold=4.0))
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    q = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    fractions = [runner(Observation(image, text, q, 0.04, stamp=0.05 * i)).vision_fraction
                 for i, text in enumerate(["pick up the red cube"] * 3 + ["pick up the blue cube"])]
    assert fractions == [1.0, 0.0, 0.0, 1.0]  # first frame, two unchanged frames, a new instruction


def observation(images: torch.Tensor, q_offset: float = 0.0):
    from vla_accel_ros.core.observation import Observation

    q = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]) + q_offset
    return Observation(images[0].numpy(), "pick up the red cube", q, 0.04, stamp=0.0)


def assert_same_prefix(a, b, atol: float = 1e-5) -> None:
    torch.testing.assert_close(a.hidden_last, b.hidden_last, atol=atol, rtol=0)
    torch.testing.assert_close(a.pooled, b.pooled, atol=atol, rtol=0)
    assert a.prefix_len == b.prefix_len
    for (ka, va), (kb, vb) in zip(a.cache.layers, b.cache.layers):
        torch.testing.assert_close(ka, kb, atol=atol, rtol=0)
        torch.testing.assert_close(va, vb, atol=atol, rtol=0)


def prefix_caches(reuse: IncrementalVisionEncoder, *observations) -> list:
    """The encoder's cache of keys and values after each of ``observations`` in turn."""
    caches = []
    with torch.inference_mode():
        for obs in observations:
            reuse.prefill(obs)
            caches.append(reuse._state)
    return caches


def test_kv_reuse_is_exact_on_the_first_frame_and_for_a_new_joint_state(policy: Policy) -> None:
    """Proprioception and BOS come last in the prefix: with an unchanged image the reuse is exact."""
    reuse = IncrementalVisionEncoder(policy, VisionReuseConfig(reuse_kv=True))
    images = frame(3)
    with torch.inference_mode():
        assert_same_prefix(reuse.prefill(observation(images)), policy.prefill(observation(images)))
        assert reuse.last.refreshed
        moved = observation(images, q_offset=0.3)
        assert_same_prefix(reuse.prefill(moved), policy.prefill(moved))
        assert reuse.last.recomputed == 0 and not reuse.last.refreshed


def test_kv_reuse_recomputes_the_changed_patch_and_refreshes_to_exact(policy: Policy) -> None:
    reuse = IncrementalVisionEncoder(policy, VisionReuseConfig(reuse_kv=True, refresh_steps=2))
    images = frame(4)
    changed = with_inverted_patch(images, 6)
    with torch.inference_mode():
        reuse.prefill(observation(images))
        approx = reuse.prefill(observation(changed))
        assert reuse.last.recomputed == 1
        exact = policy.prefill(observation(changed))
        # The decoder state differs from a full prefill only through the reused keys/values.
        assert not torch.allclose(approx.cache.layers[0][0], exact.cache.layers[0][0], atol=1e-6)
        _, text, _ = policy.observation_tensors(observation(changed))
        vision = policy.target.global_vision(policy.encode_local(changed, text))
        # One global layer: the changed patch sees every patch's exact keys, so its token is exact.
        torch.testing.assert_close(reuse._state.vision[:, 6], vision[:, 6], atol=1e-5, rtol=0)
        assert_same_prefix(reuse.prefill(observation(changed)), exact)  # the timer refresh: exact again
        assert reuse.last.refreshed and reuse.last.reason == "timer"


def test_kv_reuse_writes_the_keys_of_exactly_the_changed_patch_and_the_keypoint_token(policy: Policy) -> None:
    reuse = IncrementalVisionEncoder(policy, VisionReuseConfig(reuse_kv=True))
    images = frame(6)
    before, after = prefix_caches(reuse, observation(images), observation(with_inverted_patch(images, 6)))
    assert reuse.last.recomputed == 1
    n_patches = policy.config.n_patches
    # In the first layer a token's keys and values depend on its own input alone: those of the
    # changed patch and of the keypoint token (which comes right after the patches) are new, the
    # rest (proprioception and BOS are recomputed from the same joint state) stay bit for bit.
    keys_before, keys_after = before.decoder_kv[0], after.decoder_kv[0]
    assert keys_after.shape == keys_before.shape
    moved = (keys_before != keys_after).flatten(0, 2).any(dim=0).any(dim=-1)
    assert torch.nonzero(moved).flatten().tolist() == [6, n_patches]


def test_kv_reuse_with_an_unchanged_image_recomputes_only_proprioception_and_bos(policy: Policy) -> None:
    reuse = IncrementalVisionEncoder(policy, VisionReuseConfig(reuse_kv=True))
    images = frame(5)
    changed = with_inverted_patch(images, 0)
    # then the arm moves, the image does not
    _, before, after = prefix_caches(reuse, observation(images), observation(changed),
                                     observation(changed, q_offset=0.2))
    assert reuse.last.recomputed == 0
    assert after.vision_kv is before.vision_kv and after.vision is before.vision
    for (k0, v0), (k1, v1) in zip(before.decoder_kv, after.decoder_kv):
        assert torch.equal(k0[:, :, :-2], k1[:, :, :-2]) and torch.equal(v0[:, :, :-2], v1[:, :, :-2])
        assert not torch.equal(k0[:, :, -2:], k1[:, :, -2:])  # proprioception and BOS are new
    assert torch.equal(before.hidden[:, :-2], after.hidden[:, :-2])
