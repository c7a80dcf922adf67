"""The draft head of a Hugging Face VLA (``models/hf_draft.py``) on the tiny random HF model: its
files beside the weights, what ``load_hf_vla`` refuses, ``draft_tokens``' contract (shapes, the
first proposal, ``last_token``, sampling noise) and the speculative decoders at r = 0 against AR."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.protocol import DecodeContext
from vla_accel_ros.models.api import as_sequential_drafting
from vla_accel_ros.models.hf.checkpoint import load_hf_vla
from vla_accel_ros.models.sampling import SamplingConfig, pick_tokens
from vla_accel_ros.models.token_vla.draft import (
    DRAFT_META_FILE,
    DRAFT_WEIGHTS_FILE,
    HFDraftConfig,
    HFDraftHead,
    save_hf_draft,
)
from vla_accel_ros.models.token_vla.policy import HFTokenVLA
from vla_accel_ros.models.tokenizer import BOS
from vla_accel_ros.runtime.runner import run_policy_step

torch.set_num_threads(1)


def observation(seed: int = 0) -> Observation:
    image = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    return Observation(image=image, instruction="pick up the red cube", joint_pos=np.zeros(7), gripper=0.04)


def random_head(hidden_size: int = 32, vocab_size: int = 384, seed: int = 0) -> HFDraftHead:
    """An untrained head with weights large enough that its proposals vary with the input."""
    torch.manual_seed(seed)
    head = HFDraftHead(HFDraftConfig(hidden_size=hidden_size, vocab_size=vocab_size, width=24, blocks=1))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)
    return head.eval()


def save_head(directory: Path, head: HFDraftHead, action_ids: tuple[int, int] = (383, 128)) -> None:
    save_hf_draft(head, directory, action_ids, recipe={"test": "random"}, metrics={})


@pytest.fixture(scope="module")
def plain_dir(tiny_hf_vla: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_vla(tmp_path_factory.mktemp("hf_draft") / "plain")


@pytest.fixture(scope="module")
def with_head(plain_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hf_draft") / "with_head"
    shutil.copytree(plain_dir, directory)
    save_head(directory, random_head())
    return directory


@pytest.fixture(scope="module")
def policy(with_head: Path) -> HFTokenVLA:
    return load_hf_vla(with_head)


def copy_of(directory: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(directory, target)
    return target


# --- files and loading ------------------------------------------------------------------------
def test_loading_attaches_the_head_saved_beside_the_model(policy: HFTokenVLA, with_head: Path,
                                                          plain_dir: Path) -> None:
    assert as_sequential_drafting(policy) is policy
    assert policy.capabilities().draft_head and not policy.capabilities().parallel_draft_head
    assert policy.draft is not None and not policy.draft.training
    assert policy.n_parameters()["draft"] == sum(p.numel() for p in policy.draft.parameters())
    saved = random_head()
    for name, tensor in saved.state_dict().items():
        torch.testing.assert_close(policy.draft.state_dict()[name], tensor, rtol=0, atol=0)
    meta = json.loads((with_head / DRAFT_META_FILE).read_text())
    assert meta["format_version"] == 1 and meta["config"]["hidden_size"] == 32 and meta["recipe"] == {"test": "random"}
    assert meta["target"]["action_ids"] == [int(policy.action_ids[0]), int(policy.action_ids[-1])]
    assert not load_hf_vla(plain_dir).capabilities().draft_head
    assert not load_hf_vla(with_head, draft=False).capabilities().draft_head


@pytest.mark.parametrize(("head", "ids", "match"), [
    (lambda: random_head(hidden_size=16), (383, 128), "hidden states of size 16"),
    (lambda: random_head(vocab_size=512), (383, 128), "vocabulary of 512"),
    (lambda: random_head(), (128, 383), "action ids 128..383"),
])
def test_a_head_made_for_another_model_is_refused_naming_the_file(
        plain_dir: Path, tmp_path: Path, head: Callable[[], HFDraftHead], ids: tuple[int, int], match: str) -> None:
    directory = copy_of(plain_dir, tmp_path)
    save_head(directory, head(), ids)
    with pytest.raises(ValueError, match=match) as error:
        load_hf_vla(directory)
    assert str(directory / DRAFT_META_FILE) in str(error.value)


def test_broken_head_files_are_refused_naming_the_file(with_head: Path, tmp_path: Path) -> None:
    directory = copy_of(with_head, tmp_path)
    (directory / DRAFT_WEIGHTS_FILE).unlink()
    with pytest.raises(ValueError, match=f"{DRAFT_WEIGHTS_FILE}: missing"):
        load_hf_vla(directory)
    save_head(directory, random_head())
    meta = json.loads((directory / DRAFT_META_FILE).read_text())
    (directory / DRAFT_META_FILE).write_text(json.dumps(meta | {"config": meta["config"] | {"width": 8}}))
    with pytest.raises(ValueError, match=f"{DRAFT_WEIGHTS_FILE}: tensor .* has shape"):
        load_hf_vla(directory)
    (directory / DRAFT_META_FILE).write_text(json.dumps(meta | {"format_version": 99}))
    with pytest.raises(ValueError, match=f"{DRAFT_META_FILE}: unknown format_version"):
        load_hf_vla(directory)
    (directory / DRAFT_META_FILE).write_text(json.dumps(meta))
    (directory / DRAFT_WEIGHTS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match=f"{DRAFT_WEIGHTS_FILE}: truncated or not safetensors"):
        load_hf_vla(directory)


def test_attach_draft_refuses_a_head_of_another_size(plain_dir: Path) -> None:
    plain = load_hf_vla(plain_dir)
    with pytest.raises(ValueError, match="hidden states of size 16"):
        plain.attach_draft(random_head(hidden_size=16))
    plain.attach_draft(random_head())
    assert plain.capabilities().draft_head
    plain.attach_draft(None)
    assert not plain.capabilities().draft_head


# --- draft_tokens -----------------------------------------------------------------------------
def test_draft_tokens_shapes_and_the_first_proposal_is_the_targets_token(policy: HFTokenVLA) -> None:
    prefix = policy.prefill(observation(1))
    none, none_logits = policy.draft_tokens(prefix, 0)
    assert none.shape == (1, 0) and none_logits.shape == (1, 0, 256)
    tokens, logits = policy.draft_tokens(prefix, 7)
    assert tokens.shape == (1, 7) and tokens.dtype == torch.long and logits.shape == (1, 7, 256)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(tokens, logits.argmax(-1), rtol=0, atol=0)  # greedy without noise
    target = policy.score(prefix, tokens[:, :0]).logits[:, 0]
    torch.testing.assert_close(logits[:, 0], target, rtol=0, atol=1e-5)
    assert len(set(tokens[0].tolist())) > 1  # the head's proposals depend on their inputs
    one, _ = policy.draft_tokens(prefix, 1)
    assert one.tolist() == tokens[:, :1].tolist()
    again, _ = policy.draft_tokens(prefix, 7)
    assert again.tolist() == tokens.tolist()  # no state: the same prefix drafts the same tokens


def test_draft_tokens_continues_from_a_prefix_holding_tokens(policy: HFTokenVLA) -> None:
    prefix = policy.prefill(observation(2))
    held = policy.score(prefix, torch.tensor([[5, 60, 200]])).prefix
    tokens, logits = policy.draft_tokens(held, 4, torch.tensor([200]))
    assert tokens.shape == (1, 4)
    target = policy.score(held, tokens[:, :0]).logits[:, 0]  # the target's token after the 3
    torch.testing.assert_close(logits[:, 0], target, rtol=0, atol=1e-5)
    truncated = held.truncate(1)
    again, _ = policy.draft_tokens(truncated, 2, torch.tensor([5]))
    assert again[0, 0] == int(policy.score(truncated, tokens[:, :0]).logits[0, 0].argmax())


def test_last_token_must_be_the_prefixs_last(policy: HFTokenVLA) -> None:
    prefix = policy.prefill(observation(3))
    held = policy.score(prefix, torch.tensor([[5, 60]])).prefix
    assert policy.draft_tokens(prefix, 3, torch.tensor([BOS]))[0].shape == (1, 3)  # BOS: the start
    with pytest.raises(ValueError, match="last_token=None means the start"):
        policy.draft_tokens(held, 3)
    with pytest.raises(ValueError, match="the prefix consumed last"):
        policy.draft_tokens(held, 3, torch.tensor([5]))
    with pytest.raises(ValueError, match="the prefix consumed last"):
        policy.draft_tokens(prefix, 3, torch.tensor([5]))
    with pytest.raises(ValueError, match=r"last_token must be \(B=1,\)"):
        policy.draft_tokens(held, 3, torch.tensor([[60]]))
    with pytest.raises(ValueError, match="n must be >= 0"):
        policy.draft_tokens(prefix, -1)


def test_noise_makes_each_proposal_the_sampled_token_of_its_dimension(policy: HFTokenVLA) -> None:
    noise = SamplingConfig(temperature=1.0, seed=3).token_noise(0, 0)
    assert noise is not None
    prefix = policy.prefill(observation(4))
    held = policy.score(prefix, torch.tensor([[9, 9]])).prefix
    tokens, logits = policy.draft_tokens(held, 5, torch.tensor([9]), noise=noise)
    # dimensions 2..6 then the last one again, as the target would sample them
    positions = [2, 3, 4, 5, 6]
    torch.testing.assert_close(tokens, (logits + noise[positions]).argmax(-1), rtol=0, atol=0)
    first = pick_tokens(policy.score(held, tokens[:, :0]).logits, noise, 2)
    assert tokens[0, 0] == first[0, 0]
    greedy, _ = policy.draft_tokens(held, 5, torch.tensor([9]))
    assert greedy.tolist() != tokens.tolist()


# --- the decoders that draft ------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("name", "settings"), [("sd", {"r": 0}), ("deadline", {"r_min": 0, "r_max": 0})])
def test_speculative_decoders_at_r0_return_ar_tokens(policy: HFTokenVLA, name: str, settings: dict[str, int],
                                                     temperature: float) -> None:
    noise = SamplingConfig(temperature=temperature, seed=1).token_noise(0, 0)
    ar = run_policy_step(policy, observation(5), make_decoder("ar"), DecodeContext(token_noise=noise))
    decoder = make_decoder(name, **settings)
    decoder.check_policy(policy)  # not refused: the policy has a draft head
    result = run_policy_step(policy, observation(5), decoder, DecodeContext(token_noise=noise))
    np.testing.assert_array_equal(result.tokens, ar.tokens)
    np.testing.assert_array_equal(result.action, ar.action)
    assert result.draft_passes > 0 and result.target_passes <= ar.target_passes


@pytest.mark.parametrize("name", ["kerv", "world_aware"])
def test_one_round_decoders_draft_with_the_head(policy: HFTokenVLA, name: str) -> None:
    ar = run_policy_step(policy, observation(6), make_decoder("ar"), DecodeContext())
    result = run_policy_step(policy, observation(6), make_decoder(name, r_min=0, r_max=0), DecodeContext())
    assert result.draft_passes > 0 and result.target_passes == 1  # one verify pass, never a second round
    verified = result.accepted_len + 1  # the accepted prefix and the target's token at the first rejection
    np.testing.assert_array_equal(result.tokens[:verified], ar.tokens[:verified])
