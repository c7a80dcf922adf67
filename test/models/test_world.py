"""World-aware prefill: a fresh bias changes nothing, shapes line up with the patch grid, the bias
reaches the target the same way in prefill and training, its pieces learn, and its files round-trip."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models import (
    CheckpointError,
    FrameAutoencoder,
    FrameAutoencoderConfig,
    Policy,
    VLAConfig,
    WorldBias,
    WorldBiasConfig,
    WorldPrefill,
    load_checkpoint,
    save_checkpoint,
)
from vla_accel_ros.models.own.checkpoint import WORLD_META_FILE, WORLD_WEIGHTS_FILE
from vla_accel_ros.models.tokenizer import N_BINS, ActionTokenizer
from vla_accel_ros.training.world import (
    encode_frames,
    next_frame_metrics,
    next_frame_pairs,
    train_autoencoder,
    train_bias,
)

torch.set_num_threads(1)
TINY = dict(image_size=32, patch_size=8, d_model=32, n_heads=2, n_layers=2, vision_layers=1, max_text_len=8,
            local_channels=8, contact_hidden=8, keypoints=2, text_layers=1)
WORLD = dict(latent_channels=4, width=8, hidden=16, head_hidden=16)


def make_policy(seed: int = 0) -> Policy:
    policy = Policy.create(VLAConfig(**TINY), ActionTokenizer(np.full(7, -1.0), np.full(7, 1.0)),
                           proprio_mean=np.linspace(-1, 1, 8), proprio_std=np.linspace(0.5, 2, 8), seed=seed)
    with torch.no_grad():  # non-trivial logits, so greedy tokens depend on the input
        for p in policy.target.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.2)
    return policy


def make_world(config: VLAConfig, nonzero: bool) -> WorldPrefill:
    torch.manual_seed(0)
    world = WorldPrefill.for_target(config, **WORLD)
    if nonzero:  # what training would do: a bias that actually moves the tokens
        with torch.no_grad():
            world.bias.out.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    return world


def make_batch(b: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (b, 32, 32, 3), dtype=torch.uint8, generator=g),
            torch.randint(0, 257, (b, 8), generator=g), torch.randn(b, 8, generator=g))


def everything(policy: Policy, batch) -> list[torch.Tensor]:
    """Prefill state, verify logits, draft tokens and logits, contact logits of one batch."""
    prefix = policy.prefill_tensors(*batch).prefix
    tokens = policy.greedy_decode(prefix)
    return [prefix.hidden_last, prefix.pooled, prefix.cache.layers[-1][0], policy.score(prefix, tokens).logits,
            *policy.draft_tokens(prefix, 7, None), policy.contact_logits(prefix)]


def test_a_fresh_world_leaves_the_target_exactly_unchanged() -> None:
    policy, batch = make_policy(), make_batch()
    plain = everything(policy, batch)
    policy.world = make_world(policy.config, nonzero=False)
    assert torch.count_nonzero(policy.world_bias(batch[0])) == 0
    for a, b in zip(plain, everything(policy, batch)):
        assert (a.float() - b.float()).abs().max() <= 1e-6
    images, text, proprio = batch
    tokens = torch.randint(0, N_BINS - 1, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        n = policy.normalise_proprio(proprio)
        torch.testing.assert_close(policy.target(images, text, n, tokens, policy.world_bias(images)),
                                   policy.target(images, text, n, tokens), atol=1e-6, rtol=0)
    assert "world" in policy.n_parameters()


def test_latent_grid_is_the_patch_grid_and_bias_spares_the_keypoint_token() -> None:
    default = VLAConfig()
    ae = FrameAutoencoder(FrameAutoencoderConfig(default.image_size, default.patch_size))
    latent = ae.encode(torch.zeros(3, 128, 128, 3, dtype=torch.uint8))
    assert latent.shape == (3, 8, 8, 8) and latent.shape[2] * latent.shape[3] == default.n_patches
    assert ae.decode(latent).shape == (3, 3, 128, 128)

    policy = make_policy()
    world = make_world(policy.config, nonzero=True)
    images, text, _ = make_batch()
    bias = world.patch_bias(images)
    assert bias.shape == (2, policy.config.n_patches, policy.config.d_model) and bias.abs().max() > 0
    target = policy.target
    with torch.no_grad():
        local = target.encode_patches(target.patchify(images), text)
        biased = target.add_patch_bias(local, bias)
        d = policy.config.d_model
        assert torch.equal(biased[..., d:], local[..., d:])  # keypoint channels untouched
        torch.testing.assert_close(biased[..., :d], local[..., :d] + bias)
        plain_tokens, biased_tokens = target.global_vision(local), target.global_vision(biased)
    assert plain_tokens.shape[1] == policy.config.n_vision_tokens == policy.config.n_patches + 1
    assert torch.equal(plain_tokens[:, -1], biased_tokens[:, -1])  # the keypoint token gets no bias
    assert not torch.allclose(plain_tokens[:, :-1], biased_tokens[:, :-1])
    with pytest.raises(ValueError, match="patch_bias"):
        target.add_patch_bias(local, bias[:, :3])


def test_prefill_training_and_cached_tokens_all_see_the_same_bias() -> None:
    policy, (images, text, proprio) = make_policy(), make_batch()
    plain = policy.prefill_tensors(images, text, proprio).prefix
    policy.world = make_world(policy.config, nonzero=True)
    prefix = policy.prefill_tensors(images, text, proprio).prefix
    assert not torch.allclose(prefix.hidden_last, plain.hidden_last)
    # training's teacher-forced pass (train.py passes the same bias) equals the cached decoding
    tokens = torch.randint(0, N_BINS - 1, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = policy.target(images, text, policy.normalise_proprio(proprio), tokens, policy.world_bias(images))
    cached, current = [policy.score(prefix, tokens[:, :0]).logits[:, 0]], prefix
    for i in range(6):
        out = policy.score(current, tokens[:, i : i + 1])
        current = out.prefix
        cached.append(out.logits[:, -1])
    torch.testing.assert_close(torch.stack(cached, 1), full, atol=1e-5, rtol=0)
    # local tokens from a cache are unbiased; the prefill adds the bias after them
    obs = Observation(images[0].numpy(), "red", np.zeros(7, np.float32), 0.02)
    img, txt, _ = policy.observation_tensors(obs)
    torch.testing.assert_close(policy.prefill_tensors(*policy.observation_tensors(obs),
                                                      local_tokens=policy.encode_local(img, txt)).prefix.hidden_last,
                               policy.prefill(obs).hidden_last, atol=1e-6, rtol=0)
    # the draft head reads the target's (biased) prefix: it proposes from the world-aware state
    assert not torch.equal(policy.draft_tokens(prefix, 7, None)[1], policy.draft_tokens(plain, 7, None)[1])


def moving_square(episodes: int = 6, steps: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames of a red square sliding right 2 px per step on a dark background, and their episode ids."""
    g = torch.Generator().manual_seed(0)
    frames, episode = [], []
    for e in range(episodes):
        y, x0 = int(torch.randint(0, 24, (1,), generator=g)), int(torch.randint(0, 6, (1,), generator=g))
        for t in range(steps):
            image = torch.full((32, 32, 3), 30, dtype=torch.uint8)
            x = min(x0 + 2 * t, 24)
            image[y : y + 8, x : x + 8] = torch.tensor([220, 40, 40], dtype=torch.uint8)
            frames.append(image)
            episode.append(e)
    return torch.stack(frames), torch.tensor(episode)


def test_autoencoder_and_bias_learn_a_moving_square() -> None:
    images, episode = moving_square()
    torch.manual_seed(0)
    ae = FrameAutoencoder(FrameAutoencoderConfig(32, 8, 4, 8))
    g = torch.Generator().manual_seed(0)
    history = train_autoencoder(ae, images, torch.arange(len(images)), 80, 3e-3, 16, g, progress=False)
    assert np.mean(history[-10:]) < 0.2 * np.mean(history[:10])
    assert not any(p.requires_grad for p in ae.parameters())  # frozen after its phase
    latents = encode_frames(ae, images, progress=False)
    assert latents.shape == (len(images), 4, 4, 4)
    now, nxt = next_frame_pairs(episode)
    assert len(now) == 6 * 11 and torch.all(episode[now] == episode[nxt])  # never across episodes
    bias = WorldBias(WorldBiasConfig(4, 4, 32, 16, 2, 16))
    before = next_frame_metrics(bias, latents, (now, nxt))
    assert before["next_val_mse"] == pytest.approx(before["next_val_mse_persistence"])  # starts at "no change"
    history = train_bias(bias, latents, (now, nxt), 100, 3e-3, 32, 0.0, g, progress=False)
    assert np.mean(history[-10:]) < 0.5 * np.mean(history[:10])
    after = next_frame_metrics(bias, latents, (now, nxt))
    assert after["next_val_mse"] < 0.5 * after["next_val_mse_persistence"]
    # the per-cell head cannot see where the square comes from: the bias carries that
    assert after["next_val_mse"] < 0.5 * after["next_val_mse_bias_zeroed"]


def test_configs_validate() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        FrameAutoencoderConfig(patch_size=6)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        FrameAutoencoderConfig(image_size=100)
    with pytest.raises(ValueError, match="hidden"):
        WorldBiasConfig(hidden=0)
    with pytest.raises(ValueError, match="unknown"):
        WorldBiasConfig.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="latents"):
        WorldPrefill(FrameAutoencoderConfig(latent_channels=4), WorldBiasConfig(latent_channels=8))
    policy = make_policy()
    with pytest.raises(ValueError, match="width"):
        policy.world = WorldPrefill.for_target(VLAConfig(**{**TINY, "d_model": 64, "n_heads": 2}))
    with pytest.raises(ValueError, match="images"):
        policy.world = WorldPrefill.for_target(VLAConfig())


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Policy, Path]:
    policy = make_policy()
    policy.world = make_world(policy.config, nonzero=True)
    policy.world.info = {"recipe": {"seed": 0}, "metrics": {"next_val_mse": 0.5}}
    return policy, save_checkpoint(policy, tmp_path / "ckpt", {"test": True})


def test_world_checkpoint_round_trip(saved) -> None:
    policy, path = saved
    assert {WORLD_META_FILE, WORLD_WEIGHTS_FILE} <= {p.name for p in path.iterdir()}
    loaded = load_checkpoint(path)
    assert loaded.world is not None and not loaded.world.training
    assert loaded.world.info["metrics"]["next_val_mse"] == 0.5 and loaded.world.info["recipe"] == {"seed": 0}
    batch = make_batch()
    for a, b in zip(everything(policy, batch), everything(loaded, batch)):
        assert torch.equal(a, b)
    meta = json.loads((path / WORLD_META_FILE).read_text())
    assert meta["autoencoder"]["latent_channels"] == 4 and meta["bias"]["d_model"] == 32
    # re-saving a policy without a world removes the stale files, so they cannot bias that target
    loaded.world = None
    save_checkpoint(loaded, path, {"test": True})
    assert not (path / WORLD_WEIGHTS_FILE).exists() and load_checkpoint(path).world is None


def expect_error(path: Path, file_name: str, fragment: str) -> None:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert file_name in str(info.value) and fragment in str(info.value), str(info.value)


def test_bad_world_files_name_the_file(saved) -> None:
    _, path = saved
    weights, meta_path = path / WORLD_WEIGHTS_FILE, path / WORLD_META_FILE
    good_weights, good_meta = weights.read_bytes(), meta_path.read_text()

    weights.unlink()
    expect_error(path, WORLD_WEIGHTS_FILE, "not found")
    weights.write_bytes(b"not a safetensors file")
    expect_error(path, WORLD_WEIGHTS_FILE, "not safetensors")
    tensors = {k: v for k, v in load_file(str(path / "model.safetensors")).items()}  # wrong tensors entirely
    save_file(tensors, str(weights))
    expect_error(path, WORLD_WEIGHTS_FILE, "missing tensors")
    weights.write_bytes(good_weights)
    tensors = load_file(str(weights))
    tensors["bias.out.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(weights))
    expect_error(path, WORLD_WEIGHTS_FILE, "shape")
    weights.write_bytes(good_weights)

    meta_path.unlink()
    expect_error(path, WORLD_META_FILE, "not found")
    meta_path.write_text("{ truncated")
    expect_error(path, WORLD_META_FILE, "cannot read it as JSON")
    meta = json.loads(good_meta)
    meta["bias"]["d_model"] = 64  # a bias for another target
    meta_path.write_text(json.dumps(meta))
    expect_error(path, WORLD_META_FILE, "does not match the target")
    meta = json.loads(good_meta)
    meta["autoencoder"]["latent_channels"] = 6  # autoencoder and bias disagree
    meta_path.write_text(json.dumps(meta))
    expect_error(path, WORLD_META_FILE, "bad config")
    meta = json.loads(good_meta)
    del meta["bias"]
    meta_path.write_text(json.dumps(meta))
    expect_error(path, WORLD_META_FILE, "missing key 'bias'")
    meta_path.write_text(good_meta)
    assert load_checkpoint(path).world is not None
