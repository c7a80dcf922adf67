"""π0.5 as LeRobot 0.6.1 runs it, beyond what it shares with SmolVLA and π0 (``test_lerobot.py``
runs the shared checks on all three): the state reaches the model only through the prompt, binned
as LeRobot's preprocessor bins it; the flow time conditions the expert's norms; the state changing
every frame leaves incremental vision's reuse alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vla_accel_ros.models.lerobot.checkpoint import load_lerobot  # noqa: E402
from vla_accel_ros.models.lerobot.config import parse_config  # noqa: E402
from vla_accel_ros.models.lerobot.processor import state_bins, state_prompt  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
DIRECTORY = FIXTURES / "pi05"
TOKENIZER = FIXTURES / "tokenizers" / "paligemma"


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    return load_lerobot(DIRECTORY, tokenizer_dir=TOKENIZER)


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURES / "pi05_reference.npz"))


def test_the_prompt_is_lerobots_tokens_for_every_state(policy, ref) -> None:  # type: ignore[no-untyped-def]
    """The recorded observations' prompts, and prompts of states on and around the bins' edges and
    outside q01..q99 (below -1 LeRobot writes bin -1), tokenize to LeRobot's ids and masks."""
    for i in range(len(ref["tasks"])):
        inputs = policy.inputs([ref["front"][i], ref["wrist"][i]], ref["state"][i], str(ref["tasks"][i]))
        np.testing.assert_array_equal(inputs.lang_tokens[0].numpy(), ref["lang_tokens"][i])
        np.testing.assert_array_equal(inputs.lang_masks[0].numpy(), ref["lang_masks"][i])
    states = policy.statistics.state.normalise(torch.as_tensor(ref["binning_states"]))
    assert float(states.min()) < -1.0 and float(states.max()) > 1.0
    ids, masks = policy.prompt_tokens(["stack_the blocks\n"] * len(states), states, policy.token_settings)
    np.testing.assert_array_equal(ids.numpy(), ref["binning_tokens"])
    np.testing.assert_array_equal(masks.numpy(), ref["binning_masks"])
    assert ids.shape[1] == policy.config.tokenizer_max_length == 200  # π0.5's default, from the processor file


def test_the_prompts_words_and_bins() -> None:
    state = torch.tensor([-1.5, -1.0, 0.0, 0.9921875, 1.0, 0.5, -1.0 + 2 / 256 - 1e-6])
    np.testing.assert_array_equal(state_bins(state), [-1, 0, 128, 255, 255, 192, 0])
    assert state_prompt(" pick_up\nthe cube ", state[:3]) == "Task: pick up the cube, State: -1 0 128;\nAction: "


def test_the_state_reaches_the_model_only_through_its_bins(policy, ref) -> None:  # type: ignore[no-untyped-def]
    """A state moved within its bins gives the same chunk exactly; one moved to other bins another."""
    images, task, noise = [ref["front"][0], ref["wrist"][0]], str(ref["tasks"][0]), ref["noise"][0]
    state = torch.as_tensor(ref["state"][0])
    bins = state_bins(policy.statistics.state.normalise(state))
    centres = torch.as_tensor(-1.0 + (2.0 * bins + 1.0) / 256, dtype=torch.float32)  # each bin's centre
    moved = policy.statistics.state.unnormalise(centres)
    assert not torch.equal(moved, state)
    np.testing.assert_array_equal(state_bins(policy.statistics.state.normalise(moved)), bins)
    chunk = policy.predict_chunk(images, state.numpy(), task, noise=noise)
    np.testing.assert_array_equal(policy.predict_chunk(images, moved.numpy(), task, noise=noise).actions, chunk.actions)
    other = policy.statistics.state.unnormalise(centres + 0.25)
    assert np.abs(policy.predict_chunk(images, other.numpy(), task, noise=noise).normalized
                  - chunk.normalized).max() > 1e-3


def test_the_flow_time_conditions_every_expert_norm(policy) -> None:  # type: ignore[no-untyped-def]
    """No state projection and no action-time MLP: the time MLP, and adaptive norms (a projection
    to scale, shift and gate, no weight of their own) in every expert layer and at its end."""
    names = {name for name, _ in policy.model.named_parameters()}
    assert {"time_mlp_in.weight", "time_mlp_out.weight", "expert.norm.dense.weight"} <= names
    assert not any(n.startswith(("state_proj.", "action_time_mlp_")) for n in names)
    for index in range(len(policy.model.expert.layers)):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            assert f"expert.layers.{index}.{norm}.dense.weight" in names
            assert f"expert.layers.{index}.{norm}.weight" not in names
    assert "paligemma.language_model.layers.0.input_layernorm.weight" in names  # the VLM's norms are π0's
    _, cond = policy.model.embed_suffix(torch.zeros(1, 32), torch.zeros(1, 50, 32), torch.ones(1))
    assert cond is not None and cond.shape == (1, policy.model.expert_width)


def test_a_new_state_every_frame_keeps_the_image_tokens_reused(policy, ref) -> None:  # type: ignore[no-untyped-def]
    """π0.5's language changes with the state on every frame: only the language rows run again, and
    only a new instruction refreshes the whole prefix."""
    from vla_accel_ros.models.configuration import VisionReuseConfig

    incremental = policy.incremental_vision(VisionReuseConfig(threshold=8.0, refresh_steps=100, max_drift=2.0,
                                                              reuse_kv=True))
    images, task = [ref["front"][0], ref["wrist"][0]], str(ref["tasks"][0])
    with torch.inference_mode():
        incremental.prefix(policy.inputs(images, ref["state"][0], task))
        assert incremental.last.refreshed
        second = policy.inputs(images, ref["state"][1], task)
        assert not torch.equal(second.lang_tokens, policy.inputs(images, ref["state"][0], task).lang_tokens)
        reused = incremental.prefix(second)
        assert not incremental.last.refreshed and incremental.last.recomputed == 0
        full = policy.prefix(second)
        torch.testing.assert_close(reused.pad_masks, full.pad_masks, rtol=0, atol=0)
        # the language rows were computed afresh: their first layer's keys are the full prefix's
        language = slice(full.length - policy.config.tokenizer_max_length, None)
        torch.testing.assert_close(reused.cache.layers[0].keys[:, :, language],
                                   full.cache.layers[0].keys[:, :, language], rtol=0, atol=0)
        incremental.prefix(policy.inputs(images, ref["state"][1], "open the drawer"))
        assert incremental.last.refreshed and incremental.last.reason == "instruction changed"


def copy_directory(tmp_path: Path) -> Path:
    target = tmp_path / "pi05"
    shutil.copytree(DIRECTORY, target)
    return target


def test_a_config_without_the_prompt_length_takes_pi05s_default(tmp_path: Path) -> None:
    raw = json.loads((DIRECTORY / "config.json").read_text())
    raw.pop("tokenizer_max_length")
    assert parse_config(tmp_path / "config.json", raw).tokenizer_max_length == 200
    assert parse_config(tmp_path / "config.json", {**raw, "type": "pi0"}).tokenizer_max_length == 48


def test_an_expert_without_adaptive_norms_is_refused_in_one_line(tmp_path: Path) -> None:
    """A π0-style expert (a norm weight, no projection) under ``type: pi05`` names the missing tensor."""
    from safetensors.torch import load_file, save_file

    directory = copy_directory(tmp_path)
    tensors = load_file(str(directory / "model.safetensors"))
    prefix = "model.paligemma_with_expert.gemma_expert.model.layers.1.input_layernorm."
    tensors[prefix + "weight"] = torch.zeros(64)
    del tensors[prefix + "dense.weight"], tensors[prefix + "dense.bias"]
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(ValueError) as caught:
        load_lerobot(directory, tokenizer_dir=TOKENIZER)
    message = str(caught.value)
    assert "\n" not in message and "model.safetensors" in message
    assert "expert.layers.1.input_layernorm.dense.weight" in message
