"""OpenVLA-OFT on tiny models: the parallel pass (the empty action embeddings, the bidirectional
mask, the hidden states the head reads from the 29871 position), the L1 head, the scaling of
actions and state, the ``.pt`` conversion, the chunk through the runtime, and bad input as one line."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.cli import main
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.load import load_policy, recognise
from vla_accel_ros.models.oft.checkpoint import load_oft
from vla_accel_ros.models.oft.modules import HeadShape, L1ActionHead
from vla_accel_ros.models.oft.policy import bidirectional_mask
from vla_accel_ros.models.oft.weights import convert_directory, read_pickled_state_dict

FIXTURES = Path(__file__).parents[1] / "fixtures" / "oft"
_spec = importlib.util.spec_from_file_location("oft_layout", FIXTURES / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)
STATE = np.array([0.05, -0.1, 0.6, 2.7, 0.0, -0.05, 0.02, -0.02])


@pytest.fixture(scope="module")
def oft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = layout.write_oft_dir(tmp_path_factory.mktemp("oft") / "model")
    convert_directory(directory, report=lambda line: None)
    return directory


@pytest.fixture(scope="module")
def policy(oft_dir: Path):
    return load_policy(oft_dir, dtype="float32")


def observation(n_images: int = 2, seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (112, 112, 3), dtype=np.uint8) for _ in range(n_images)]
    return Observation(image=images[0], extra_images=tuple(images[1:]), instruction="pick up the red cube",
                       joint_pos=np.zeros(7), gripper=0.02, state=STATE)


def inputs(policy, obs: Observation):
    return policy.pixel_values(obs.images), policy.prompt_ids(obs.instruction), policy.state_input(obs)


# --- the pass ---------------------------------------------------------------------------------
def test_sequence_holds_bos_patches_state_prompt_empty_actions_and_stop(policy) -> None:
    obs = observation()
    pixels, ids, state = inputs(policy, obs)
    assert pixels.shape == (1, 12, 112, 112)
    assert ids[0, 0].item() == policy.bos_id and ids[0, -1].item() == 29871
    with torch.inference_mode():
        embeddings, start = policy.sequence(pixels, ids, state)
        embed = policy.modules.embed_ids
        patches = policy.modules.vision.n_patches
        n = layout.CHUNK_SIZE * layout.ACTION_DIM
        assert embeddings.shape[1] == 1 + 2 * patches + 1 + (ids.shape[1] - 1) + n + 1
        torch.testing.assert_close(embeddings[0, 0], embed(ids[:, :1])[0, 0])
        second = policy.modules.image_features(pixels[:, 6:])[0]
        torch.testing.assert_close(embeddings[0, 1 + patches:1 + 2 * patches], second)
        torch.testing.assert_close(embeddings[0, 1 + 2 * patches], policy.projector(state)[0])
        # the head's slice starts at the 29871 token; the action positions after it are zeros
        assert start == 1 + 2 * patches + 1 + ids.shape[1] - 2
        torch.testing.assert_close(embeddings[0, start], embed(ids[:, -1:])[0, 0])
        assert torch.count_nonzero(embeddings[0, start + 1:start + 1 + n]) == 0
        torch.testing.assert_close(embeddings[0, -1], embed(torch.tensor([[policy.stop_id]]))[0, 0])
        assert policy.stop_id == 2


def test_attention_is_bidirectional_and_the_head_reads_from_the_29871_position(policy) -> None:
    pixels, ids, state = inputs(policy, observation())
    modules = policy.modules
    with torch.inference_mode():
        embeddings, start = policy.sequence(pixels, ids, state)
        length = embeddings.shape[1]
        positions = torch.arange(length)[None]
        changed = embeddings.clone()
        changed[0, -1] += 1.0  # the stop token

        def run(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            return modules.forward_embeddings(x, modules.new_cache(), positions, mask) if mask is not None else \
                modules.llama.text_forward(x, modules.new_cache(), positions[0])

        full = bidirectional_mask(length, policy.device)
        bidirectional, causal = run(embeddings, full), run(embeddings, None)
        # every position sees the stop token at the end, BOS included; a causal pass would not
        assert (run(changed, full)[0, 0] - bidirectional[0, 0]).abs().max() > 1e-3
        torch.testing.assert_close(run(changed, None)[0, :-1], causal[0, :-1])
        normalized, action_hidden = policy.forward(pixels, ids, state)
        n = layout.CHUNK_SIZE * layout.ACTION_DIM
        torch.testing.assert_close(action_hidden, bidirectional[:, start:start + n])
        torch.testing.assert_close(normalized, policy.head(bidirectional[:, start:start + n]))
        assert normalized.shape == (1, layout.CHUNK_SIZE, layout.ACTION_DIM)
        for wrong in (policy.head(bidirectional[:, start + 1:start + 1 + n]), policy.head(causal[:, start:start + n])):
            assert (wrong - normalized).abs().max() > 1e-3


def test_l1_head_is_an_mlp_resnet_over_each_steps_hidden_states() -> None:
    torch.manual_seed(0)
    head = L1ActionHead(HeadShape(action_dim=3, width=4, hidden=5, blocks=2)).eval()
    for parameter in head.parameters():
        torch.nn.init.normal_(parameter)
    hidden = torch.randn(1, 2 * 3, 4)
    model = head.model
    x = torch.relu(model.fc1(torch.nn.functional.layer_norm(hidden.reshape(1, 2, 12), (12,), model.layer_norm1.weight,
                                                             model.layer_norm1.bias)))
    for block in model.mlp_resnet_blocks:
        norm, linear = block.ffn[0], block.ffn[1]
        x = x + torch.relu(linear(norm(x)))
    expected = model.fc2(model.layer_norm2(x))
    torch.testing.assert_close(head(hidden), expected)
    with pytest.raises(ValueError, match="hidden states"):
        head(torch.randn(1, 7, 4))


# --- actions and state ------------------------------------------------------------------------
def test_chunk_is_unnormalised_with_the_range_plus_1e8_and_the_state_normalised(policy) -> None:
    obs = observation()
    prediction = policy.predict_chunk(obs)
    stats = layout.STATISTICS[layout.DATASET]
    low, high, mask = (np.array(stats["action"][k]) for k in ("q01", "q99", "mask"))
    n = prediction.normalized
    np.testing.assert_allclose(prediction.actions, np.where(mask, 0.5 * (n + 1) * (high - low + 1e-8) + low, n),
                               rtol=0, atol=1e-15)
    p_low, p_high = np.array(stats["proprio"]["q01"]), np.array(stats["proprio"]["q99"])
    expected = np.clip(2 * (STATE - p_low) / (p_high - p_low + 1e-8) - 1, -1, 1)
    torch.testing.assert_close(policy.state_input(obs)[0], torch.from_numpy(expected).float())


def test_min_max_bounds_and_one_image(oft_dir) -> None:
    policy = load_oft(oft_dir, dtype="float32", bounds="min_max")
    prediction = policy.predict_chunk(observation(n_images=1))
    stats = layout.STATISTICS[layout.DATASET]["action"]
    low, high = np.array(stats["min"]), np.array(stats["max"])
    n = prediction.normalized
    expected = np.where(stats["mask"], 0.5 * (n + 1) * (high - low + 1e-8) + low, n)
    np.testing.assert_allclose(prediction.actions, expected, rtol=0, atol=1e-15)
    assert prediction.actions.shape == (layout.CHUNK_SIZE, layout.ACTION_DIM)


# --- the runtime ------------------------------------------------------------------------------
def test_chunk_decoder_hands_the_whole_chunk_and_token_decoders_are_refused(policy) -> None:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.decoding import make_decoder
    from vla_accel_ros.runtime.runner import PolicyRunner

    kin = ArmKinematics(default_urdf())
    for name in ("kerv", "ar", "flow10"):
        with pytest.raises(ValueError, match="does not apply.*decoder 'chunk'") as refused:
            PolicyRunner(policy, make_decoder(name), kin, action_dt_s=0.05, period_s=1.0)
        assert "\n" not in str(refused.value)
    runner = PolicyRunner(policy, make_decoder("chunk"), kin, action_dt_s=0.05, period_s=float("inf"))
    obs = observation()
    result = runner(obs)
    expected = policy.predict_chunk(obs)
    assert result.chunk is not None and result.chunk.shape == (layout.CHUNK_SIZE, 7)
    np.testing.assert_allclose(result.chunk[:, :6], expected.actions[:, :6])
    # the gripper in the package's convention (1 = open, [0, 1]) from the spec's (OpenVLA's by default)
    np.testing.assert_allclose(result.chunk[:, 6], np.clip(expected.actions[:, 6], 0, 1))
    np.testing.assert_array_equal(result.action, result.chunk[0])
    assert result.target_passes == 0 and result.tokens.shape == (7,)


# --- conversion -------------------------------------------------------------------------------
def test_convert_round_trip_strips_module_and_leaves_converted_files(tmp_path) -> None:
    from safetensors.torch import load_file

    directory = layout.write_oft_dir(tmp_path / "model")
    pickled = torch.load(directory / "action_head--100_checkpoint.pt", weights_only=True)
    assert all(name.startswith("module.") for name in pickled)
    assert main(["convert", str(directory)]) == 0
    converted = load_file(directory / "action_head--100_checkpoint.safetensors")
    assert set(converted) == {name.removeprefix("module.") for name in pickled}
    for name, tensor in pickled.items():
        assert torch.equal(converted[name.removeprefix("module.")], tensor)
        assert converted[name.removeprefix("module.")].dtype == torch.bfloat16
    assert load_file(directory / "proprio_projector--100_checkpoint.safetensors")["fc1.weight"].dtype == torch.float32
    assert convert_directory(directory, report=lambda line: None) == []  # converted once


class Executes:
    """A pickled object whose unpickling would run code."""

    def __reduce__(self):
        return (print, ("ran",))


@pytest.mark.parametrize("content", [{"module.fc1.weight": torch.zeros(2), "step": 3}, Executes(),
                                     [torch.zeros(2)]])
def test_convert_refuses_anything_but_a_dict_of_tensors_in_one_line(tmp_path, capsys, content) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "openvla"}))
    torch.save(content, directory / "action_head--1_checkpoint.pt")
    with pytest.raises(ValueError, match="refused"):
        read_pickled_state_dict(directory / "action_head--1_checkpoint.pt")
    assert main(["convert", str(directory)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("convert: error: ") and "refused" in err and err.count("\n") == 1
    assert not (directory / "action_head--1_checkpoint.safetensors").exists()


# --- bad input --------------------------------------------------------------------------------
def test_pt_only_is_refused_naming_the_convert_command(tmp_path) -> None:
    directory = layout.write_oft_dir(tmp_path / "model")
    assert recognise(directory).name == "oft"
    with pytest.raises(ValueError, match="never loaded; convert it once to safetensors: vla-accel convert") as error:
        load_policy(directory)
    assert str(error.value).endswith(f"vla-accel convert {directory}") and "\n" not in str(error.value)


@pytest.mark.parametrize(("spec", "message"), [
    ({"chunk_size": 8, "action_dim": 14}, "action_dim 14 contradicts the action head, whose fc2 gives 7"),
    ({"chunk_size": 0}, "chunk_size must be a positive integer"),
    ({"chunk_size": 8, "bounds": "mean_std"}, "bounds must be one of"),
    ({"chunk_size": 4096}, "does not fit in the language model's"),
])
def test_chunk_settings_contradicting_the_head_are_one_line(oft_dir, tmp_path, spec, message) -> None:
    directory = tmp_path / "model"
    shutil.copytree(oft_dir, directory)
    (directory / "vla_spec.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=message) as error:
        load_oft(directory, dtype="float32")
    assert "\n" not in str(error.value)


def test_image_count_and_state_are_checked(oft_dir) -> None:
    policy = load_oft(oft_dir, dtype="float32", n_images=2)
    with pytest.raises(ValueError, match="takes 2 images"):
        policy.predict_chunk(observation(n_images=1))
    obs = observation()
    with pytest.raises(ValueError, match="state of 8 values"):
        policy.predict_chunk(Observation(image=obs.image, extra_images=obs.extra_images, instruction="x",
                                         joint_pos=np.zeros(7), gripper=0.0, state=np.zeros(5)))


# --- vla-accel predict ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from PIL import Image

    folder = tmp_path_factory.mktemp("frames")
    obs = observation()
    for name, image in (("primary.png", obs.image), ("wrist.png", obs.extra_images[0])):
        Image.fromarray(image).save(folder / name)
    return folder / "primary.png", folder / "wrist.png"


def test_predict_json_prints_the_whole_chunk(capsys, oft_dir, frames, policy, tmp_path) -> None:
    np.save(tmp_path / "state.npy", STATE)
    for state in (str(tmp_path / "state.npy"), ",".join(str(v) for v in STATE)):
        assert main(["predict", "--checkpoint", str(oft_dir), "--image", str(frames[0]), "--image", str(frames[1]),
                     "--state", state, "--instruction", "pick up the red cube", "--unnorm-key", layout.DATASET,
                     "--dtype", "float32", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        expected = policy.predict_chunk(observation())
        assert out["family"] == "oft" and out["decoder"] == "chunk" and out["n_images"] == 2
        assert (out["chunk_size"], out["action_dim"]) == (layout.CHUNK_SIZE, layout.ACTION_DIM)
        np.testing.assert_allclose(out["actions"], expected.actions, rtol=0, atol=1e-12)
        np.testing.assert_allclose(out["actions_normalized"], expected.normalized, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("extra", "message"), [
    (["--decoder", "kerv"], "--decoder kerv: decoder 'kerv' does not apply"),
    (["--state", "1,2,x"], "--state: not a comma list of numbers nor a .npy file"),
    (["--chunk-size", "0"], "chunk_size must be a positive integer"),
    (["--logits"], "no action tokens"),
])
def test_predict_bad_input_is_one_line(capsys, oft_dir, frames, extra, message) -> None:
    assert main(["predict", "--checkpoint", str(oft_dir), "--image", str(frames[0]), "--instruction", "x",
                 "--json", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_predict_names_the_convert_command_for_pt_only(capsys, tmp_path, frames) -> None:
    directory = layout.write_oft_dir(tmp_path / "model")
    assert main(["predict", "--checkpoint", str(directory), "--image", str(frames[0]), "--instruction", "x"]) == 2
    err = capsys.readouterr().err
    assert f"vla-accel convert {directory}" in err and err.count("\n") == 1


def test_the_nodes_runner_refuses_a_token_decoder_at_configure_in_one_line(oft_dir) -> None:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner

    kin = ArmKinematics(default_urdf())
    with pytest.raises(ValueError, match="decoder 'kerv' does not apply: the policy has no action tokens") as error:
        build_runner(RunnerConfig(checkpoint=str(oft_dir)), kin)  # the node's default decoder
    assert "\n" not in str(error.value)
    runner = build_runner(RunnerConfig(checkpoint=str(oft_dir), decoder="chunk", period_s=10.0), kin)
    assert runner.decoder_name == "chunk"
