"""HFTokenVLA on tiny random OpenVLA-layout Hugging Face models (the ``tiny_hf_vla`` fixture):
one-pass scoring against one-token steps, rollback, the prefill-scored pass, decoding through the
runner, OpenVLA's action decoding and every input the loader refuses."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding.ar import ARDecoder
from vla_accel_ros.decoding.kerv import KervDecoder
from vla_accel_ros.decoding.protocol import PREFILL_VERIFIED, DecodeContext
from vla_accel_ros.models.api import PolicyCapabilities, as_contact_sensing, as_token_scoring
from vla_accel_ros.models.hf.checkpoint import load_hf_vla
from vla_accel_ros.models.token_vla.policy import HFTokenVLA
from vla_accel_ros.runtime.runner import run_policy_step

torch.set_num_threads(1)
INSTRUCTION = "pick up the red cube"
TOKENS = torch.tensor([[3, 100, 200, 254, 0, 17, 128]])
ATOL = 1e-5


def observation(seed: int = 0, size: tuple[int, int] = (32, 32), instruction: str = INSTRUCTION) -> Observation:
    image = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    return Observation(image=image, instruction=instruction, joint_pos=np.zeros(7), gripper=0.04)


@pytest.fixture(scope="module")
def vla_dir(tiny_hf_vla: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_vla(tmp_path_factory.mktemp("hf_vla") / "tiny")


@pytest.fixture(scope="module")
def policy(vla_dir: Path) -> HFTokenVLA:
    return load_hf_vla(vla_dir)


def variant(vla_dir: Path, tmp_path: Path, spec: dict[str, Any] | None = None,
            statistics: dict[str, Any] | None = None) -> Path:
    """A copy of the tiny VLA with a vla_spec.json and/or other statistics."""
    target = tmp_path / "variant"
    shutil.copytree(vla_dir, target)
    if spec is not None:
        (target / "vla_spec.json").write_text(json.dumps(spec))
    if statistics is not None:
        (target / "dataset_statistics.json").write_text(json.dumps(statistics))
    return target


def single_steps(policy: HFTokenVLA, prefix: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Logits (1, k+1, 256) of k one-token passes after ``prefix``."""
    logits = [policy.score(prefix, tokens[:, :0]).logits[:, 0]]
    for i in range(tokens.shape[1]):
        out = policy.score(prefix, tokens[:, i : i + 1])
        prefix = out.prefix
        logits.append(out.logits[:, 1])
    return torch.stack(logits, dim=1)


# --- what the policy is -----------------------------------------------------------------------
def test_a_policy_without_heads(policy: HFTokenVLA) -> None:
    assert as_token_scoring(policy) is policy
    assert policy.capabilities() == PolicyCapabilities(token_scoring=True, incremental_prefill=True,
                                                       resizes_images=True)
    assert (policy.config.d_model, policy.config.image_size, policy.image_size) == (32, 32, 32)
    assert (policy.n_action_tokens, policy.config.n_action_tokens, policy.config.n_image_tokens) == (7, 7, 16)
    assert policy.flow is None and policy.parallel_draft is None
    assert policy.statistics is not None and policy.statistics.key == "tiny_dataset"
    prefix = policy.prefill(observation())
    with pytest.raises(ValueError, match="no draft head"):
        policy.draft_tokens(prefix, 3)
    with pytest.raises(ValueError, match="does not declare a contact head"):
        as_contact_sensing(policy)


def test_prompt_is_bos_image_tokens_then_the_openvla_prompt(policy: HFTokenVLA) -> None:
    ids = policy.prompt_ids("Pick up the RED cube")[0].tolist()
    n = policy.config.n_image_tokens
    assert ids[: n + 1] == [policy.bos_id] + [policy.image_token_id] * n
    text = policy.text_tokenizer("In: What action should the robot take to pick up the red cube?\nOut:",
                                 add_special_tokens=False)["input_ids"]
    assert ids[n + 1 :] == list(text)  # no appended id: this vocabulary has no id 29871
    assert policy.appended_ids == ()


def test_action_ids_are_the_top_of_the_text_vocabulary(policy: HFTokenVLA) -> None:
    vocab = policy.text_tokenizer.vocab_size
    assert vocab == 384 < policy.model.get_output_embeddings().weight.shape[0]  # padded embedding
    np.testing.assert_array_equal(policy.action_ids, vocab - 1 - np.arange(256))


# --- passes -----------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 7])
def test_scoring_k_tokens_in_one_pass_equals_k_single_steps(policy: HFTokenVLA, k: int) -> None:
    prefix = policy.prefill(observation())
    out = policy.score(prefix, TOKENS[:, :k])
    assert out.logits.shape == (1, k + 1, 256) and out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits, single_steps(policy, prefix, TOKENS[:, :k]), rtol=0, atol=ATOL)
    assert out.prefix.tokens.tolist() == TOKENS[:, :k].tolist() and out.prefix.base == 0
    assert out.prefix.length == prefix.prefix_len + k


def test_logits_are_the_full_lm_heads_at_the_action_ids(policy: HFTokenVLA) -> None:
    obs = observation(1)
    ids = torch.cat([policy.prompt_ids(obs.instruction), torch.from_numpy(policy.action_ids)[TOKENS]], dim=1)
    with torch.inference_mode():
        full = policy.model(input_ids=ids, pixel_values=policy.pixel_values(obs.image)).logits
    expected = full[:, -8:][..., torch.from_numpy(policy.action_ids)]
    torch.testing.assert_close(policy.prefill_batch([obs], TOKENS).logits, expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize(("m", "more"), [(0, [5, 6]), (3, [9]), (3, [4, 4, 4, 4]), (7, [])])
def test_truncate_then_score_equals_a_fresh_prefill_and_score(policy: HFTokenVLA, m: int, more: list[int]) -> None:
    obs = observation(2)
    extended = policy.score(policy.prefill(obs), TOKENS).prefix
    again = policy.score(extended.truncate(m), torch.tensor([more], dtype=torch.long))
    fresh = policy.score(policy.prefill(obs), torch.tensor([TOKENS[0, :m].tolist() + more], dtype=torch.long))
    torch.testing.assert_close(again.logits, fresh.logits[:, m:], rtol=0, atol=ATOL)
    assert again.prefix.tokens.tolist() == fresh.prefix.tokens.tolist()
    with pytest.raises(ValueError, match="truncate"):
        extended.truncate(8)


def test_a_prefix_stays_valid_after_another_prefix_used_the_cache(policy: HFTokenVLA) -> None:
    obs = observation(3)
    start = policy.prefill(obs)
    first = policy.score(start, TOKENS[:, :3]).prefix
    policy.score(start, torch.tensor([[9, 9, 9, 9, 9]]))  # overwrites the shared cache's action rows
    later = policy.score(first, TOKENS[:, 3:])
    fresh = policy.score(policy.prefill(obs), TOKENS)
    torch.testing.assert_close(later.logits, fresh.logits[:, 3:], rtol=0, atol=ATOL)


def test_prefill_scored_equals_prefill_then_score(policy: HFTokenVLA) -> None:
    obs = observation(4)
    scored = policy.prefill_batch([obs], TOKENS[:, :6])
    prefix = policy.prefill(obs)
    apart = policy.score(prefix, TOKENS[:, :6])
    torch.testing.assert_close(scored.logits, apart.logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(scored.prefix.pooled, prefix.pooled, rtol=0, atol=ATOL)
    assert scored.prefix.prefix_len == prefix.prefix_len and scored.prefix.base == 0
    on = policy.score(scored.prefix.truncate(2), torch.tensor([[7, 8]]))
    off = policy.score(apart.prefix.truncate(2), torch.tensor([[7, 8]]))
    torch.testing.assert_close(on.logits, off.logits, rtol=0, atol=ATOL)


@pytest.mark.parametrize("tokens", [torch.tensor([1, 2]), torch.tensor([[1.0, 2.0]]), torch.tensor([[256]]),
                                    torch.tensor([[1], [2]])])
def test_bad_tokens_are_refused(policy: HFTokenVLA, tokens: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="tokens"):
        policy.score(policy.prefill(observation()), tokens)


# --- decoding through the runner --------------------------------------------------------------
def greedy(policy: HFTokenVLA, obs: Observation) -> np.ndarray:
    """The model's own greedy tokens (7,), bin 255 included (ARDecoder reports it as 254)."""
    prefix, tokens = policy.prefill(obs), []
    for _ in range(7):
        tokens.append(int(policy.score(prefix, torch.tensor([tokens], dtype=torch.long)).logits[0, -1].argmax()))
    return np.array(tokens)


@pytest.mark.parametrize("seed", [1, 5])  # seed 5's greedy action holds a bin 255
def test_kerv_at_r0_verifying_in_the_prefill_returns_ar_tokens(policy: HFTokenVLA, seed: int) -> None:
    obs = observation(seed)
    ar = run_policy_step(policy, obs, ARDecoder(), DecodeContext())
    assert ar.target_passes == 7
    own = greedy(policy, obs)
    np.testing.assert_array_equal(ar.tokens, np.minimum(own, 254))
    np.testing.assert_array_equal(ar.action, policy.tokens_to_action(own))
    kerv = KervDecoder(r_min=0, r_max=0, prefill_verify=True)
    # The previous action proposes every position (no Kalman filter): the model's own tokens all pass ...
    same = run_policy_step(policy, obs, kerv, DecodeContext(step=1, token_history=own[None]))
    assert same.mode == PREFILL_VERIFIED and same.target_passes == 1 and same.accepted_len == 7
    np.testing.assert_array_equal(same.tokens, ar.tokens)
    # ... and one off by a bin at position 3 is rejected at r = 0, the target's token taking its place.
    proposal = own.copy()
    proposal[3] = proposal[3] + 1 if proposal[3] < 254 else proposal[3] - 1
    off = run_policy_step(policy, obs, kerv, DecodeContext(step=1, token_history=proposal[None]))
    assert off.accepted_len == 3
    np.testing.assert_array_equal(off.tokens[:4], ar.tokens[:4])
    np.testing.assert_array_equal(off.tokens[4:], np.minimum(proposal[4:], 254))  # no filter to fill the rest


def test_kerv_at_r0_without_a_draft_head_returns_ar_tokens(policy: HFTokenVLA) -> None:
    obs = observation(5)
    ar = run_policy_step(policy, obs, ARDecoder(), DecodeContext())
    kerv = KervDecoder(r_min=0, r_max=0)
    first = run_policy_step(policy, obs, kerv, DecodeContext())  # no previous action: token by token
    assert first.mode == "first_step_ar" and first.target_passes == 7
    np.testing.assert_array_equal(first.tokens, ar.tokens)
    later = run_policy_step(policy, obs, kerv, DecodeContext(step=1, token_history=greedy(policy, obs)[None]))
    assert later.target_passes == 1 and later.draft_passes == 0 and later.accepted_len == 7
    np.testing.assert_array_equal(later.tokens, ar.tokens)


# --- actions ----------------------------------------------------------------------------------
def openvla_predict_action(hf_ids: np.ndarray, vocab_size: int, q01: np.ndarray, q99: np.ndarray,
                           mask: np.ndarray) -> np.ndarray:
    """OpenVLA's predict_action arithmetic on generated ids (N,) for every dimension -> (N, 7)."""
    bins = np.linspace(-1, 1, 256)
    bin_centers = (bins[:-1] + bins[1:]) / 2.0
    discretized = vocab_size - hf_ids
    discretized = np.clip(discretized - 1, a_min=0, a_max=bin_centers.shape[0] - 1)
    normalized = np.repeat(bin_centers[discretized][:, None], 7, axis=1)
    return np.where(mask, 0.5 * (normalized + 1) * (q99 - q01) + q01, normalized)


@pytest.mark.parametrize(("gripper", "ours"), [
    (None, lambda g: np.clip(g, 0, 1)),  # the default, 0_1_open_high
    ("minus1_1_open_high", lambda g: (g + 1) / 2),
    ("minus1_1_open_low", lambda g: (1 - g) / 2),
])
def test_tokens_to_action_is_openvla_decoding_on_all_256_ids(
        vla_dir: Path, tmp_path: Path, gripper: str | None, ours: Callable[[np.ndarray], np.ndarray]) -> None:
    directory = vla_dir if gripper is None else variant(vla_dir, tmp_path, spec={"gripper": gripper})
    policy = load_hf_vla(directory)
    stats = policy.statistics
    assert stats is not None and not stats.mask[6] and stats.mask[:6].all()
    vocab = policy.config.vocab_size
    hf_ids = np.arange(vocab - 256, vocab)
    expected = openvla_predict_action(hf_ids, vocab, stats.q01, stats.q99, stats.mask)
    expected[:, 6] = ours(expected[:, 6])
    bin_of = {int(hf): b for b, hf in enumerate(policy.action_ids)}
    got = np.array([policy.tokens_to_action(np.full(7, bin_of[int(hf)])) for hf in hf_ids])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-15)


# --- inputs -----------------------------------------------------------------------------------
def test_pixel_values_are_the_normalised_image_and_other_sizes_are_resized(policy: HFTokenVLA) -> None:
    image = observation(6).image
    mean, std = np.array(policy.spec.image_mean), np.array(policy.spec.image_std)
    expected = ((image / 255.0 - mean) / std).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(policy.pixel_values(image).numpy(), expected, rtol=0, atol=1e-5)
    assert policy.pixel_values(observation(6, size=(40, 56)).image).shape == (1, 3, 32, 32)
    assert policy.prefill(observation(6, size=(40, 56))).prefix_len == policy.prompt_ids(INSTRUCTION).shape[1]


@pytest.mark.parametrize("image", [np.zeros((32, 32), np.uint8), np.zeros((32, 32, 4), np.uint8),
                                   np.zeros((32, 32, 3), np.float32), np.zeros((0, 32, 3), np.uint8),
                                   [[[0, 0, 0]]]])
def test_an_image_of_the_wrong_shape_or_type_is_refused(policy: HFTokenVLA, image: Any) -> None:
    obs = Observation(image=image, instruction=INSTRUCTION, joint_pos=np.zeros(7), gripper=0.04)
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8"):
        policy.prefill(obs)


def test_an_instruction_too_long_for_the_context_is_refused(policy: HFTokenVLA) -> None:
    obs = observation(instruction="pick up the red cube and then " * 4)
    for call in (lambda: policy.prefill(obs), lambda: policy.prefill_batch([obs], TOKENS[:, :6])):
        with pytest.raises(ValueError, match="instruction too long.*max_position_embeddings=128.*config.json"):
            call()


# --- vla_spec.json ----------------------------------------------------------------------------
def test_vla_spec_json_sets_the_prompt_and_the_appended_ids(policy: HFTokenVLA, vla_dir: Path, tmp_path: Path) -> None:
    space = policy.text_tokenizer.convert_tokens_to_ids("▁")
    custom = load_hf_vla(variant(vla_dir, tmp_path, spec={"prompt": "Task: {instruction}\nOut:",
                                                          "lowercase_instruction": False, "appended_ids": [space]}))
    ids = custom.prompt_ids("Pick it")[0].tolist()
    text = custom.text_tokenizer("Task: Pick it\nOut:", add_special_tokens=False)["input_ids"]
    assert ids[custom.config.n_image_tokens + 1 :] == [*text, space]
    assert custom.prefill(observation(instruction="Pick it")).prefix_len == len(ids)


def test_the_unnorm_key_picks_the_statistics(vla_dir: Path, tmp_path: Path) -> None:
    table = json.loads((vla_dir / "dataset_statistics.json").read_text())["tiny_dataset"]
    wide = json.loads(json.dumps(table))
    wide["action"]["q99"] = [1.0] * 7
    directory = variant(vla_dir, tmp_path, spec={"unnorm_key": "wide"}, statistics={"narrow": table, "wide": wide})
    by_spec = load_hf_vla(directory)
    assert by_spec.statistics is not None and by_spec.statistics.key == "wide"
    assert by_spec.tokens_to_action(np.full(7, 254))[0] == pytest.approx(1.0 - (1.0 - table["action"]["q01"][0]) / 510)
    by_argument = load_hf_vla(directory, unnorm_key="narrow")
    assert by_argument.statistics is not None and by_argument.statistics.key == "narrow"


@pytest.mark.parametrize(("overrides", "spec", "message"), [
    ({"pickle": True}, None, r"only pickle weights \(pytorch_model.bin\)"),
    ({"vision": None}, None, "config.json: not a VLA"),
    ({"text_vocab": 200}, None, "not an OpenVLA-style VLA: a text vocabulary of 200 tokens is too small"),
    ({"statistics": {"d": {"action": {"q01": [0.0] * 6, "q99": [1.0] * 6}}}}, None, "7-D"),
    ({"statistics": {"a": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 7}},
                     "b": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 7}}}}, None, "pick one with unnorm_key"),
    ({}, {"unnorm_key": "bridge_orig"}, r"no dataset 'bridge_orig' \(unnorm_key\)"),
    ({}, {"prompt_template": "{instruction}"}, "vla_spec.json: unknown key 'prompt_template'"),
    ({}, {"image_size": 64}, "differs from the vision tower's 32"),
    ({}, {"action_id_first": 255}, r"include BOS \(1\)"),
])
def test_bad_directories_are_refused_naming_the_problem(tiny_hf_vla: Callable[..., Path], tmp_path: Path,
                                                        overrides: dict[str, Any], spec: dict[str, Any] | None,
                                                        message: str) -> None:
    directory = tiny_hf_vla(tmp_path / "bad", **overrides)
    if spec is not None:
        (directory / "vla_spec.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=message):
        load_hf_vla(directory)


def test_missing_directories_and_files_are_refused(vla_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_hf_vla(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="config.json: missing"):
        load_hf_vla(tmp_path)
    no_stats = variant(vla_dir, tmp_path)
    (no_stats / "dataset_statistics.json").unlink()
    with pytest.raises(ValueError, match="dataset_statistics.json: no action statistics"):
        load_hf_vla(no_stats)


# --- other layouts and settings ---------------------------------------------------------------
def test_an_hf_path_a_siglip_tower_and_bfloat16_weights(tiny_hf_vla: Callable[..., Path], vla_dir: Path,
                                                        tmp_path: Path) -> None:
    assert load_hf_vla(f"hf:{vla_dir}").config.vocab_size == 384
    siglip = load_hf_vla(tiny_hf_vla(tmp_path / "siglip", vision="siglip"))
    assert siglip.config.n_image_tokens == 16 and siglip.spec.image_mean == (0.5, 0.5, 0.5)
    torch.testing.assert_close(siglip.score(siglip.prefill(observation()), TOKENS).logits,
                               single_steps(siglip, siglip.prefill(observation()), TOKENS), rtol=0, atol=ATOL)
    half = load_hf_vla(vla_dir, dtype="bfloat16")
    assert half.model.dtype == torch.bfloat16
    result = run_policy_step(half, observation(), ARDecoder(), DecodeContext())
    assert result.tokens.shape == (7,) and np.isfinite(result.action).all()


# --- proprioception in the prompt ----------------------------------------------------------------
PROPRIO_PROMPT = "In: {instruction}?{image}{proprio}\nOut:"


def proprio_variant(vla_dir: Path, tmp_path: Path) -> HFTokenVLA:
    """The tiny VLA with the joints and gripper in its prompt (8 proprio values: 7 joints, gripper)."""
    table = json.loads((vla_dir / "dataset_statistics.json").read_text())
    table["tiny_dataset"]["proprio"] = {"q01": [-1.0] * 7 + [0.0], "q99": [1.0] * 7 + [0.04]}
    return load_hf_vla(variant(vla_dir, tmp_path, spec={"prompt": PROPRIO_PROMPT}, statistics=table))


def test_the_proprio_tokens_are_the_action_ids_of_their_bins(vla_dir: Path, tmp_path: Path) -> None:
    policy = proprio_variant(vla_dir, tmp_path)
    joints = np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, -2.0])
    ids = policy.prompt_ids(INSTRUCTION, np.append(joints, 0.04))[0].tolist()
    n = policy.config.n_image_tokens
    before = policy.text_tokenizer(f"In: {INSTRUCTION}?", add_special_tokens=False)["input_ids"]
    after = policy.text_tokenizer("\nOut:", add_special_tokens=False)["input_ids"]
    start = 1 + len(before) + n
    assert ids[: start] == [policy.bos_id, *before] + [policy.image_token_id] * n
    bins = [0, 63, 127, 191, 254, 254, 0, 254]
    assert ids[start : start + 8] == policy.action_ids[bins].tolist() and ids[start + 8 :] == list(after)
    obs = Observation(image=observation().image, instruction=INSTRUCTION, joint_pos=joints, gripper=0.0)
    moved = Observation(image=obs.image, instruction=INSTRUCTION, joint_pos=joints, gripper=0.04)
    assert policy.prefill(obs).prefix_len == len(ids)
    assert not torch.equal(policy.prefill(obs).action_hidden, policy.prefill(moved).action_hidden)


def test_a_proprio_prompt_needs_the_proprio_and_its_statistics(vla_dir: Path, tmp_path: Path) -> None:
    policy = proprio_variant(vla_dir, tmp_path / "with")
    with pytest.raises(ValueError, match="give the joints and the gripper"):
        policy.prompt_ids(INSTRUCTION)
    with pytest.raises(ValueError, match="reads 8 proprioception values"):
        policy.prefill(Observation(image=observation().image, instruction=INSTRUCTION, joint_pos=np.zeros(6),
                                   gripper=0.0))
    table = json.loads((vla_dir / "dataset_statistics.json").read_text())
    del table["tiny_dataset"]["proprio"]
    with pytest.raises(ValueError, match="no proprio q01/q99 to bin it with"):
        load_hf_vla(variant(vla_dir, tmp_path / "without", spec={"prompt": PROPRIO_PROMPT}, statistics=table))
