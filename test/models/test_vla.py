"""Target VLA, prefixes with a KV cache, scoring, truncation and the draft head (tiny random models)."""

import numpy as np
import pytest
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models import BOS, Policy, Prefix, VLAConfig
from vla_accel_ros.models.kernels import ONEDNN_MIN_MACS, dense, onednn_linear_available
from vla_accel_ros.models.tokenizer import N_BINS, ActionTokenizer, encode_instruction

torch.set_num_threads(1)
TINY = dict(image_size=32, patch_size=8, d_model=32, n_heads=2, n_layers=2, vision_layers=1, max_text_len=8,
            local_channels=8, contact_hidden=8, keypoints=2, text_layers=1)
TOL = 1e-5


def make_policy(seed: int = 0) -> Policy:
    policy = Policy.create(VLAConfig(**TINY), ActionTokenizer(np.full(7, -1.0), np.full(7, 1.0)),
                           proprio_mean=np.linspace(-1, 1, 8), proprio_std=np.linspace(0.5, 2, 8), seed=seed)
    # Break the near-uniform logits of a fresh init so greedy tokens vary with the input.
    with torch.no_grad():
        for p in policy.target.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.2)
    return policy


def make_batch(b: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (b, 32, 32, 3), dtype=torch.uint8, generator=g)
    text = torch.randint(0, 257, (b, 8), generator=g)
    proprio = torch.randn(b, 8, generator=g)
    return images, text, proprio


@pytest.fixture(scope="module")
def policy() -> Policy:
    return make_policy()


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return make_batch(2)


def random_tokens(b: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, N_BINS - 1, (b, k), generator=torch.Generator().manual_seed(seed))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="multiple of patch_size"):
        VLAConfig(image_size=30, patch_size=8)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        VLAConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="d_model"):
        VLAConfig(d_model=0)
    with pytest.raises(ValueError, match="unknown"):
        VLAConfig.from_dict({**VLAConfig().to_dict(), "bogus": 1})
    assert VLAConfig.from_dict(VLAConfig(**TINY).to_dict()) == VLAConfig(**TINY)
    assert VLAConfig().n_patches == 64 and VLAConfig(**TINY).prefix_len == 16 + 1 + 8 + 2  # + keypoint token
    assert VLAConfig(**{**TINY, "keypoints": 0}).prefix_len == 16 + 8 + 2
    with pytest.raises(ValueError, match="keypoints"):
        VLAConfig(keypoints=-1)


def test_kv_cached_decoding_equals_full_recompute(policy: Policy, batch) -> None:
    images, text, proprio = batch
    tokens = random_tokens(2, 7)
    with torch.inference_mode():
        full = policy.target(images, text, policy.normalise_proprio(proprio), tokens)  # (B, 7, 256), no cache
    prefix = policy.prefill_tensors(images, text, proprio).prefix
    cached = [policy.score(prefix, tokens[:, :0]).logits[:, 0]]
    for i in range(6):
        out = policy.score(prefix, tokens[:, i : i + 1])
        prefix = out.prefix
        cached.append(out.logits[:, -1])
    torch.testing.assert_close(torch.stack(cached, 1), full, atol=TOL, rtol=0)
    assert prefix.length == policy.config.prefix_len + 6 and prefix.n_tokens == 6


@pytest.mark.parametrize("causal", [False, True])
def test_block_on_selected_tokens_equals_the_full_block_when_all_are_selected(policy: Policy, causal: bool) -> None:
    """Recomputing every token of a sequence (in a shuffled order) against stale keys and values
    replaces all of them, so it gives the full block's outputs and keys/values on those rows."""
    block = policy.target.blocks[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 10, policy.config.d_model, generator=g)
    order = torch.randperm(10, generator=g)
    with torch.inference_mode():
        full, (k, v) = block(x, causal=causal)
        stale = torch.randn(2, *k.shape, generator=g)
        mask = order[:, None] >= torch.arange(10) if causal else None  # token i sees positions up to its own
        selected, keys_values = block(x[:, order], stale, positions=order, attn_mask=mask)
    torch.testing.assert_close(selected, full[:, order], atol=TOL, rtol=0)
    torch.testing.assert_close(keys_values, torch.stack([k, v]), atol=TOL, rtol=0)


@pytest.mark.parametrize("start, k", [(0, 7), (0, 1), (2, 3), (3, 4)])
def test_score_k_tokens_equals_k_single_steps(policy: Policy, batch, start: int, k: int) -> None:
    images, text, proprio = batch
    tokens = random_tokens(2, start + k, seed=start + k)
    prefix = policy.prefill_tensors(images, text, proprio).prefix
    if start:
        prefix = policy.score(prefix, tokens[:, :start]).prefix
    one_pass = policy.score(prefix, tokens[:, start:])
    assert one_pass.logits.shape == (2, k + 1, N_BINS)
    step = prefix
    for i in range(k + 1):
        out = policy.score(step, tokens[:, start + i : start + i + 1] if i < k else tokens[:, :0])
        torch.testing.assert_close(one_pass.logits[:, i], out.logits[:, 0], atol=TOL, rtol=0)
        step = out.prefix
    for (k1, v1), (k2, v2) in zip(one_pass.prefix.cache.layers, step.cache.layers):
        torch.testing.assert_close(k1, k2, atol=TOL, rtol=0)
        torch.testing.assert_close(v1, v2, atol=TOL, rtol=0)
    torch.testing.assert_close(one_pass.prefix.hidden_last, step.hidden_last, atol=TOL, rtol=0)
    assert torch.equal(one_pass.prefix.tokens, tokens)


def test_score_leaves_the_prefix_untouched(policy: Policy, batch) -> None:
    prefix = policy.prefill_tensors(*batch).prefix
    before = [t.clone() for kv in prefix.cache.layers for t in kv] + [prefix.hidden_last.clone()]
    policy.score(prefix, random_tokens(2, 5))
    after = [t for kv in prefix.cache.layers for t in kv] + [prefix.hidden_last]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert prefix.n_tokens == 0 and prefix.length == policy.config.prefix_len


def test_truncate(policy: Policy, batch) -> None:
    tokens = random_tokens(2, 7, seed=5)
    base = policy.score(policy.prefill_tensors(*batch).prefix, tokens[:, :2]).prefix
    extended = policy.score(base, tokens[:, 2:7]).prefix
    for m in range(6):
        cut = extended.truncate(m)
        direct = policy.score(base, tokens[:, 2 : 2 + m]).prefix
        assert cut.length == direct.length == policy.config.prefix_len + 2 + m
        assert torch.equal(cut.tokens, tokens[:, : 2 + m])
        torch.testing.assert_close(cut.hidden_last, direct.hidden_last, atol=TOL, rtol=0)
        # continuing from a truncated prefix equals continuing from a directly built one
        if cut.n_tokens < 7:
            nxt = tokens[:, :1]
            from_cut, from_direct = policy.score(cut, nxt).logits, policy.score(direct, nxt).logits
            torch.testing.assert_close(from_cut, from_direct, atol=TOL, rtol=0)
    zero = extended.truncate(0)
    torch.testing.assert_close(zero.hidden_last, base.hidden_last, atol=0, rtol=0)
    with pytest.raises(ValueError):
        extended.truncate(6)
    with pytest.raises(ValueError):
        extended.truncate(-1)
    assert extended.n_tokens == 7  # truncate never changes the prefix it is called on


def test_score_rejects_bad_tokens_and_overlong_actions(policy: Policy, batch) -> None:
    prefix = policy.prefill_tensors(*batch).prefix
    with pytest.raises(ValueError):
        policy.score(prefix, torch.full((2, 1), BOS))
    with pytest.raises(ValueError):
        policy.score(prefix, torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError):
        policy.score(prefix, torch.zeros(2, 1, dtype=torch.int32))
    full = policy.score(prefix, random_tokens(2, 7)).prefix
    with pytest.raises(ValueError, match="exceed"):
        policy.score(full, random_tokens(2, 1))


def test_draft_tokens_shapes_determinism_and_first_token(policy: Policy, batch) -> None:
    prefix = policy.prefill_tensors(*batch).prefix
    tokens, logits = policy.draft_tokens(prefix, 7, None)
    assert tokens.shape == (2, 7) and tokens.dtype == torch.long and logits.shape == (2, 7, N_BINS)
    assert torch.equal(tokens, logits.argmax(-1))
    again, again_logits = policy.draft_tokens(prefix, 7, None)
    assert torch.equal(tokens, again) and torch.equal(logits, again_logits)
    # the first proposal is the target's own greedy token
    greedy = policy.greedy_decode(prefix)
    assert torch.equal(tokens[:, 0], greedy[:, 0])
    torch.testing.assert_close(logits[:, 0], policy.score(prefix, greedy[:, :0]).logits[:, 0], atol=TOL, rtol=0)
    # shorter drafts are prefixes of longer ones
    assert torch.equal(policy.draft_tokens(prefix, 3, None)[0], tokens[:, :3])
    empty, empty_logits = policy.draft_tokens(prefix, 0, None)
    assert empty.shape == (2, 0) and empty_logits.shape == (2, 0, N_BINS)


def test_draft_tokens_after_consumed_tokens(policy: Policy, batch) -> None:
    prefix = policy.prefill_tensors(*batch).prefix
    consumed = random_tokens(2, 4, seed=9)
    mid = policy.score(prefix, consumed).prefix.truncate(3)
    tokens, _ = policy.draft_tokens(mid, 4, consumed[:, 2])
    assert tokens.shape == (2, 4)
    assert torch.equal(tokens[:, 0], policy.score(mid, consumed[:, :0]).logits[:, 0].argmax(-1))
    with pytest.raises(ValueError, match="last_token"):
        policy.draft_tokens(mid, 4, (consumed[:, 2] + 1) % 255)
    with pytest.raises(ValueError, match="start of the action"):
        policy.draft_tokens(mid, 4, None)
    with_bos = policy.draft_tokens(prefix, 2, torch.full((2,), BOS))[0]
    assert torch.equal(with_bos, policy.draft_tokens(prefix, 2, None)[0])
    with pytest.raises(ValueError):
        policy.draft_tokens(prefix, -1, None)


def test_draft_depends_on_the_draft_head(batch) -> None:
    a, b = make_policy(), make_policy()
    with torch.no_grad():
        for p in b.draft.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
    prefix_a, prefix_b = a.prefill_tensors(*batch).prefix, b.prefill_tensors(*batch).prefix
    logits_a, logits_b = a.draft_tokens(prefix_a, 7, None)[1], b.draft_tokens(prefix_b, 7, None)[1]
    torch.testing.assert_close(logits_a[:, 0], logits_b[:, 0])  # step 0 is the target's
    assert not torch.allclose(logits_a[:, 1:], logits_b[:, 1:])


def test_greedy_decode_matches_manual_loop(policy: Policy, batch) -> None:
    prefix = policy.prefill_tensors(*batch).prefix
    manual, step = [], prefix
    logits = policy.score(step, random_tokens(2, 0)).logits[:, -1]
    for i in range(7):
        token = logits.argmax(-1, keepdim=True)
        manual.append(token)
        if i < 6:
            out = policy.score(step, token)
            step, logits = out.prefix, out.logits[:, -1]
    assert torch.equal(policy.greedy_decode(prefix), torch.cat(manual, 1))


def test_patch_encoder_is_local(policy: Policy) -> None:
    images, _, _ = make_batch(1, seed=3)
    target = policy.target
    with torch.inference_mode():
        patches = target.patchify(images)
        local = target.encode_patches(patches)
        subset = target.encode_patches(patches[:, [1, 5, 7]])
        torch.testing.assert_close(subset, local[:, [1, 5, 7]], atol=TOL, rtol=0)
        changed = images.clone()
        changed[0, :8, 8:16] = 255 - changed[0, :8, 8:16]  # patch 1 (row 0, column 1)
        local2 = target.encode_patches(target.patchify(changed))
    moved = (local2 - local).abs().amax(-1)[0]
    assert moved[1] > 0 and torch.all(moved[torch.arange(16) != 1] == 0)


def test_precomputed_film_equals_the_condition(policy: Policy) -> None:
    """Encoding with ``film_params`` computed once gives exactly what the condition gives."""
    images, text, _ = make_batch(2, seed=5)
    target = policy.target
    with torch.inference_mode():
        patches = target.patchify(images)
        condition = target.instruction_condition(text)
        direct = target.patch_encoder(patches, condition)
        cached = target.patch_encoder(patches, film=target.patch_encoder.film_params(condition))
        plain = target.patch_encoder(patches)
    assert torch.equal(direct, cached)
    assert not torch.equal(direct, plain)  # the condition does change the encoding


def test_patch_bytes_then_pixels_is_patchify(policy: Policy) -> None:
    images, _, _ = make_batch(2, seed=6)
    target = policy.target
    patch_bytes = target.patch_bytes(images)
    assert patch_bytes.dtype == torch.uint8
    assert torch.equal(target.patch_pixels(patch_bytes[:, [2, 9]]), target.patchify(images)[:, [2, 9]])


def test_patch_cells_gather_the_encoders_input_straight_from_the_image(policy: Policy) -> None:
    images, text, _ = make_batch(2, seed=7)
    target = policy.target
    expected = target.patch_encoder.cells(target.patchify(images))  # (2, P, cells, values)
    assert torch.equal(target.patch_cells(images), expected)
    subset = torch.tensor([9, 0, 5])
    one = images[1:]
    assert torch.equal(target.patch_cells(one, subset), expected[1:, subset])
    assert torch.equal(target.patch_cells(one.to(torch.float32), subset), expected[1:, subset])  # 0..255 floats
    offsets = target.cell_offsets(subset)
    assert torch.equal(one.reshape(-1)[offsets].view(1, 3, *target.patch_cell_shape).float().mul(2 / 255).sub(1),
                       expected[1:, subset])
    with torch.inference_mode():
        torch.testing.assert_close(target.encode_images(images, policy.instruction_film(text)),
                                   target.encode_patches(target.patchify(images), text), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="one image"):
        target.patch_cells(images, subset)
    with pytest.raises(ValueError, match="uint8 or float32"):
        target.patch_cells(images.to(torch.int32))


def test_observation_tensors_reject_a_bad_image_and_non_finite_joints(policy: Policy) -> None:
    image = np.zeros((32, 32, 3), np.uint8)
    q = np.zeros(7)
    images, _, proprio = policy.observation_tensors(Observation(image, "pick", q, 0.04, stamp=0.0))
    assert images.shape == (1, 32, 32, 3) and proprio.dtype == torch.float32
    assert proprio[0, -1].item() == pytest.approx(0.04)
    with pytest.raises(ValueError, match="uint8"):
        policy.observation_tensors(Observation(image.astype(np.float32), "pick", q, 0.04, stamp=0.0))
    for joints, gripper in ((np.r_[q[:6], np.nan], 0.04), (np.r_[q[:5], np.inf, -np.inf], 0.04), (q, np.inf)):
        with pytest.raises(ValueError, match="finite"):
            policy.observation_tensors(Observation(image, "pick", joints, gripper, stamp=0.0))


def test_keypoints_equal_an_image_wide_spatial_softmax(policy: Policy) -> None:
    """The per-patch log-masses and offsets, combined over patches, are exactly the spatial softmax
    over every sub-cell of the image."""
    images, text, _ = make_batch(2, seed=4)
    target, c = policy.target, policy.config
    with torch.inference_mode():
        patches = target.patchify(images)
        keypoints = target.keypoint_positions(target.encode_patches(patches, text))
        encoder = target.patch_encoder
        b, p, g, s = 2, c.n_patches, encoder.grid, encoder.SUB
        x = patches.reshape(b, p, 3, g, s, g, s).permute(0, 1, 3, 5, 2, 4, 6).reshape(b, p, g * g, 3 * s * s)
        x = torch.nn.functional.gelu(encoder.stem(x))
        gamma, beta = encoder.film(target.instruction_condition(text))[:, None, None, :].chunk(2, dim=-1)
        logits = encoder.keypoint_logits(x * (1 + gamma) + beta) * encoder.keypoint_log_scale.exp()  # (B, P, g*g, K)
        side = c.image_size // c.patch_size
        cell = torch.arange(g) + 0.5
        xs = (torch.arange(side)[:, None] * g + cell[None, :]).flatten() / (side * g) * 2 - 1  # sub-cell centres
        # sub-cell (patch row py, col px, sub row sy, sub col sx) -> image coordinates
        py, px, sy, sx = torch.meshgrid(torch.arange(side), torch.arange(side), torch.arange(g), torch.arange(g),
                                        indexing="ij")
        cx, cy = xs.view(side, g)[px, sx].flatten(), xs.view(side, g)[py, sy].flatten()
        weights = torch.softmax(logits.reshape(b, p * g * g, -1), dim=1)
        expected = torch.stack([(weights * cx[None, :, None]).sum(1), (weights * cy[None, :, None]).sum(1)], -1)
    torch.testing.assert_close(keypoints, expected, atol=1e-5, rtol=0)


def test_keypoint_finds_a_red_blob() -> None:
    """A keypoint whose logit is the sub-cell's redness lands on a red square, wherever it is."""
    target = make_policy().target
    encoder = target.patch_encoder
    with torch.no_grad():  # stem channel 0 = mean red minus mean green/blue; keypoint 0 reads it sharply
        encoder.stem.weight.zero_()
        encoder.stem.bias.zero_()
        w = encoder.stem.weight[0].view(3, 4, 4)
        w[0], w[1], w[2] = 1 / 16, -1 / 32, -1 / 32
        encoder.keypoint_logits.weight.zero_()
        encoder.keypoint_logits.weight[0, 0] = 40.0
        encoder.keypoint_log_scale.zero_()
    for row, col in ((4, 20), (24, 8), (12, 12)):
        image = torch.zeros(1, 32, 32, 3, dtype=torch.uint8)
        image[0, row : row + 4, col : col + 4, 0] = 255
        with torch.inference_mode():
            keypoint = target.keypoint_positions(target.encode_patches(target.patchify(image)))[0, 0]
        centre = torch.tensor([col + 2, row + 2], dtype=torch.float32) / 32 * 2 - 1
        torch.testing.assert_close(keypoint, centre, atol=0.02, rtol=0)


def test_patchify_keeps_colour(policy: Policy) -> None:
    red = torch.zeros(1, 32, 32, 3, dtype=torch.uint8)
    red[..., 0] = 255
    patches = policy.target.patchify(red)
    assert patches.shape == (1, 16, 3, 8, 8)
    assert torch.all(patches[:, :, 0] == 1.0) and torch.all(patches[:, :, 1:] == -1.0)
    with pytest.raises(ValueError):
        policy.target.patchify(torch.zeros(1, 16, 16, 3, dtype=torch.uint8))


def test_prefill_observation_and_local_tokens(policy: Policy) -> None:
    rng = np.random.default_rng(0)
    obs = Observation(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "red",
                      rng.normal(size=7).astype(np.float32), 0.02)
    prefix = policy.prefill(obs)
    assert isinstance(prefix, Prefix) and prefix.batch_size == 1
    assert prefix.hidden_last.shape == (1, 32) and prefix.pooled.shape == (1, 32)
    images, text, proprio = policy.observation_tensors(obs)
    reused = policy.prefill_tensors(*policy.observation_tensors(obs),
                                    local_tokens=policy.encode_local(images, text)).prefix
    torch.testing.assert_close(reused.hidden_last, prefix.hidden_last, atol=TOL, rtol=0)
    other = policy.prefill(Observation(obs.image, "blue", obs.joint_pos, obs.gripper))
    assert not torch.allclose(other.hidden_last, prefix.hidden_last)  # the instruction matters
    p = policy.contact_probability(prefix)
    assert 0.0 < p < 1.0
    action = policy.tokens_to_action(policy.greedy_decode(prefix)[0])
    assert action.shape == (7,) and np.all(np.abs(action) <= 1.0)
    with pytest.raises(ValueError, match="image"):
        policy.prefill(Observation(np.zeros((16, 16, 3), np.uint8), "x", obs.joint_pos, 0.0))
    with pytest.raises(ValueError, match="proprio"):
        policy.prefill(Observation(obs.image, "x", np.full(7, np.nan, np.float32), 0.0))


def test_instruction_film_is_cached_until_ids_or_weights_change() -> None:
    policy = make_policy()
    encoder = policy.target.patch_encoder
    torch.nn.init.normal_(encoder.film.weight, std=0.5)  # a FiLM that is not the identity
    red = torch.from_numpy(encode_instruction("red", policy.config.max_text_len)).unsqueeze(0)
    blue = torch.from_numpy(encode_instruction("blue", policy.config.max_text_len)).unsqueeze(0)
    expected = encoder.film_params(policy.target.instruction_condition(red))
    first = policy.instruction_film(red)
    assert policy.instruction_film(red.clone()) is first  # equal ids: served from the cache
    torch.testing.assert_close(first, expected, atol=0, rtol=0)
    assert not torch.equal(policy.instruction_film(blue)[0], first[0])
    with torch.no_grad():  # an in-place weight update (as an optimiser step makes) invalidates it
        policy.target.text_emb.weight.add_(0.1)
    updated = policy.instruction_film(red)
    assert updated is not first
    torch.testing.assert_close(updated, encoder.film_params(policy.target.instruction_condition(red)), atol=0, rtol=0)
    assert not torch.equal(updated[1], first[1])


def test_prefill_scored_is_score_after_prefill_in_one_pass(policy: Policy, batch) -> None:
    """Action tokens verified inside the prefill give what scoring them after it gives: the same
    logits at every position and a prefix that truncates to the observation prefix."""
    images, text, proprio = batch
    tokens = random_tokens(2, 6)
    two_passes = policy.score(policy.prefill_tensors(images, text, proprio).prefix, tokens)
    one_pass = policy.prefill_tensors(images, text, proprio, tokens)
    torch.testing.assert_close(one_pass.logits, two_passes.logits, atol=TOL, rtol=0)
    assert one_pass.prefix.base == 0 and one_pass.prefix.n_tokens == 6
    assert one_pass.prefix.prefix_len == two_passes.prefix.prefix_len
    torch.testing.assert_close(one_pass.prefix.pooled, two_passes.prefix.pooled, atol=TOL, rtol=0)
    kept = one_pass.prefix.truncate(2)  # the accepted prefix continues like any scored prefix
    after = policy.score(kept, tokens[:, 2:3])
    torch.testing.assert_close(after.logits, policy.score(two_passes.prefix.truncate(2), tokens[:, 2:3]).logits,
                               atol=TOL, rtol=0)
    rng = np.random.default_rng(0)
    obs = Observation(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "red", rng.normal(size=7), 0.02)
    single = policy.prefill_batch([obs], tokens[:1])
    torch.testing.assert_close(single.logits, policy.score(policy.prefill(obs), tokens[:1]).logits, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="lie in"):
        policy.prefill_batch([obs], torch.tensor([[N_BINS]]))
    with pytest.raises(ValueError, match="int64"):
        policy.prefill_batch([obs], torch.tensor([[1.0]]))


@pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN linear")
def test_dense_takes_onednn_for_large_products_and_follows_weight_updates() -> None:
    layer = torch.nn.Linear(128, 512)
    x = torch.randn(1, 99, 128)  # 6.5 M multiply-adds: oneDNN's kernel at inference
    assert 99 * 128 * 512 >= ONEDNN_MIN_MACS
    with torch.inference_mode():
        torch.testing.assert_close(dense(x, layer), layer(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(dense(x, layer, gelu=True), torch.nn.functional.gelu(layer(x)), atol=1e-5, rtol=1e-5)
        assert "_onednn_weight" in layer.__dict__  # the weight in oneDNN's layout, kept on the layer
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # an in-place update (an optimiser step) must not leave a stale copy
    with torch.inference_mode():
        torch.testing.assert_close(dense(x, layer), layer(x), atol=1e-4, rtol=1e-5)
    small = torch.randn(1, 1, 128)  # a decode step's token: the usual kernel, and autograd works too
    torch.testing.assert_close(dense(small, layer), layer(small), atol=0, rtol=0)
    dense(x.requires_grad_(), layer).sum().backward()
    assert layer.weight.grad is not None
