"""OpenVLA as published, on small random models in its layout (test/fixtures/openvla/layout.py): the
loader recognises the family, maps the names, keeps the stored dtype, never imports the ``.py``
files beside the weights, and refuses bad directories in one line; the prompt, the decoding, the
one-pass scoring with rollback and the incremental prefill behave as the shared passes promise.
The agreement with OpenVLA's original code is test_openvla_reference.py's."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.load import load_policy, recognise
from vla_accel_ros.models.openvla.checkpoint import load_openvla
from vla_accel_ros.models.openvla.config import read_image_processing
from vla_accel_ros.models.openvla.policy import OpenVLAPolicy
from vla_accel_ros.models.openvla.weights import our_name

FIXTURES = Path(__file__).parents[1] / "fixtures" / "openvla"
_spec = importlib.util.spec_from_file_location("openvla_layout", FIXTURES / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)

INSTRUCTION = "pick up the red cube"


def observation(seed: int, shape: tuple[int, int] = (96, 128), instruction: str = INSTRUCTION) -> Observation:
    image = np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)
    return Observation(image=image, instruction=instruction, joint_pos=np.zeros(7), gripper=0.04)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return layout.write_openvla_dir(tmp_path_factory.mktemp("openvla") / "tiny")


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> OpenVLAPolicy:
    return load_openvla(model_dir, dtype="float32")


def copy_of(model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(model_dir, target)
    return target


# --- recognition, names, dtype ------------------------------------------------------------------
def test_the_loader_recognises_the_family_and_keeps_the_stored_dtype(model_dir: Path) -> None:
    assert recognise(model_dir).name == "openvla"
    policy = load_policy(model_dir)
    assert isinstance(policy, OpenVLAPolicy) and policy.dtype == torch.bfloat16
    assert policy.capabilities().incremental_prefill and not policy.capabilities().draft_head
    # stored tensors stay views into the memory-mapped shards
    embed = policy.model.language_model.model.embed_tokens.weight
    assert not embed.untyped_storage().resizable()
    assert load_policy(model_dir, dtype="float32").dtype == torch.float32


def test_every_published_name_maps_to_the_model_at_openvla_7b_shape() -> None:
    """The kept reference's index (the original's save_pretrained) against the model the loader
    builds from its config at full tower size, on the meta device (no weights)."""
    from vla_accel_ros.models.openvla.checkpoint import empty_model
    from vla_accel_ros.models.openvla.config import read_directory_config

    index = json.loads((FIXTURES / "reference" / "model.safetensors.index.json").read_text())
    shapes = json.loads((FIXTURES / "reference" / "weights.json").read_text())["shapes"]
    assert set(index["weight_map"]) == set(shapes)
    mapped = {our_name(name): tuple(shape) for name, shape in shapes.items()}
    unread = sorted(name for name in shapes if our_name(name) is None)
    assert unread and all(".norm." in n or ".attn_pool." in n for n in unread)
    assert "vision.towers.0.blocks.0.ls1.gamma" in mapped and "vision.towers.1.patch_embed.weight" in mapped
    config = read_directory_config(FIXTURES / "reference")
    shapes_by_our_name = {k: v for k, v in mapped.items() if k is not None}
    model = empty_model(config, shapes_by_our_name, 224)
    vision = model.vision
    towers = [(t.config.width, t.config.depth, t.config.heads, t.config.mlp_width, t.config.prefix_tokens,
               t.config.layer_scale) for t in vision.towers]
    assert towers == [(1024, 24, 16, 4096, 5, True), (1152, 27, 16, 4304, 0, False)]
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    last = {name for name in shapes_by_our_name if ".blocks.23." in name and "towers.0" in name
            or ".blocks.26." in name and "towers.1" in name}
    assert expected == {k: v for k, v in shapes_by_our_name.items() if k not in last}


def test_the_py_files_beside_the_weights_are_never_imported(model_dir: Path, tmp_path: Path) -> None:
    directory = copy_of(model_dir, tmp_path)
    marker = tmp_path / "imported"
    for name in ("modeling_prismatic.py", "configuration_prismatic.py", "processing_prismatic.py"):
        (directory / name).write_text(f"open({str(marker)!r}, 'w').write('{name}')\nraise SystemExit('imported')\n")
    before = set(sys.modules)
    policy = load_policy(directory)
    policy.prefill(observation(0))
    assert not marker.exists()
    assert not any("prismatic" in name for name in set(sys.modules) - before)


# --- prompt, image, decoding --------------------------------------------------------------------
def test_the_prompt_is_openvlas_with_29871_after_the_patches(policy: OpenVLAPolicy) -> None:
    ids = policy.prompt_ids("Pick up the Red cube")[0].tolist()
    n = policy.config.n_image_tokens
    assert ids[0] == 1 and ids[1:1 + n] == [layout.PAD_ID] * n and ids[-1] == 29871
    text = policy.text_tokenizer("In: What action should the robot take to pick up the red cube?\nOut:")["input_ids"]
    assert ids[1 + n:] == text[1:] + [29871]  # after BOS, lower-cased, 29871 appended once


def test_the_image_is_resized_by_pil_and_normalised_per_tower(policy: OpenVLAPolicy, model_dir: Path) -> None:
    from PIL import Image

    image = observation(3, (60, 90)).image
    processing = read_image_processing(model_dir, 2)
    resized = np.asarray(Image.fromarray(image).resize((112, 112), Image.Resampling.BICUBIC), dtype=np.float32) / 255
    pixels = policy.pixel_values(image)[0].numpy()
    for tower, (mean, std) in enumerate(zip(processing.means, processing.stds)):
        expected = ((resized - np.float32(mean)) / np.float32(std)).transpose(2, 0, 1)
        np.testing.assert_array_equal(pixels[3 * tower:3 * tower + 3], expected)
    assert processing.means[0] == (0.484375, 0.455078125, 0.40625)  # the stored, bfloat16-rounded stats


def test_decoding_of_all_256_ids_and_the_mask(policy: OpenVLAPolicy) -> None:
    stats = layout.STATISTICS[layout.DATASET]["action"]
    q01, q99, mask = (np.array(stats[k], dtype=float) for k in ("q01", "q99", "mask"))
    centres = (np.linspace(-1, 1, 256)[:-1] + np.linspace(-1, 1, 256)[1:]) / 2
    tokenizer = policy.tokenizer
    for hf_id in range(31744, 32000):
        normalized = centres[np.clip(32000 - hf_id - 1, 0, 254)]  # OpenVLA's predict_action
        expected = np.where(mask, 0.5 * (normalized + 1) * (q99 - q01) + q01, normalized)
        ours = int(np.nonzero(policy.action_ids == hf_id)[0][0])
        np.testing.assert_allclose(tokenizer.unnormalise(np.full(7, tokenizer.centres[min(ours, 254)])), expected,
                                   rtol=0, atol=1e-12)
        ours_action = policy.tokens_to_action(np.full(7, ours))
        np.testing.assert_allclose(ours_action[:6], expected[:6], rtol=0, atol=1e-12)
        assert ours_action[6] == np.clip(expected[6], 0.0, 1.0)  # the masked gripper, in our [0, 1]


# --- passes -------------------------------------------------------------------------------------
def test_scoring_k_tokens_equals_k_steps_and_rollback_a_fresh_cache(policy: OpenVLAPolicy) -> None:
    obs = observation(1)
    tokens = torch.tensor([[5, 200, 17, 99, 3, 250, 128]])
    prefix = policy.prefill(obs)
    scored = policy.score(prefix, tokens)
    stepped, current = [policy.action_logits(prefix.hidden_last)[:, None]], prefix
    for i in range(7):
        out = policy.score(current, tokens[:, i:i + 1])
        stepped.append(out.logits[:, 1:])
        current = out.prefix
    torch.testing.assert_close(scored.logits, torch.cat(stepped, dim=1), rtol=0, atol=1e-4)
    # roll back to 3 tokens, extend otherwise: the same as a fresh prefix extended so
    again = policy.score(scored.prefix.truncate(3), torch.tensor([[7, 8]]))
    fresh = policy.score(policy.prefill(obs), torch.tensor([[5, 200, 17, 7, 8]]))
    torch.testing.assert_close(again.logits, fresh.logits[:, 3:], rtol=0, atol=1e-4)
    # the proposal rides along in the prefill's pass
    inside = policy.prefill_batch([obs], tokens[:, :6])
    torch.testing.assert_close(inside.logits, scored.logits[:, :7], rtol=0, atol=1e-4)


def test_incremental_prefill_with_every_patch_changed_equals_the_full_prefill(policy: OpenVLAPolicy) -> None:
    settings = VisionReuseConfig(threshold=0.0, max_drift=255.0, feature_threshold=0.0, reuse_kv=True,
                                 refresh_steps=100)
    incremental = policy.incremental_prefill(settings)
    incremental.prefill_batch([observation(10)])
    second = observation(11)
    reused = incremental.prefill_batch([second])
    assert not incremental.last.refreshed and incremental.last.recomputed == policy.config.n_image_tokens
    full = policy.prefill_batch([second])
    torch.testing.assert_close(reused.logits, full.logits, rtol=0, atol=1e-4)
    # an unchanged frame recomputes only the text
    incremental.prefill_batch([second])
    assert incremental.last.recomputed == 0


def test_tower_reuse_over_every_patch_equals_the_full_tower_pass(policy: OpenVLAPolicy) -> None:
    vision = policy.direct
    with torch.inference_mode():
        first = vision.tower_pass(policy.pixel_values(observation(20).image))
        pixels = policy.pixel_values(observation(21).image)
        full = vision.tower_pass(pixels)
        every = vision.tower_pass(pixels, torch.arange(policy.config.n_image_tokens), first)
        torch.testing.assert_close(every.features, full.features, rtol=0, atol=1e-4)
        torch.testing.assert_close(full.features, policy.image_features(pixels), rtol=0, atol=1e-5)
        settings = VisionReuseConfig(reuse_kv=True, reuse_tower=True)
        incremental = policy.incremental_prefill(settings)
        incremental.prefill_batch([observation(20)])
        incremental.prefill_batch([observation(20)])
        assert incremental.last_tower.recomputed == 0


# --- bad input ----------------------------------------------------------------------------------
def _edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


BAD = {
    "a missing shard": (lambda d: (d / "model-00002-of-00002.safetensors").unlink(),
                        r"model-00002-of-00002.safetensors: missing \(named by model.safetensors.index.json\)"),
    "an index naming a missing file": (
        lambda d: _edit_json(d / "model.safetensors.index.json", weight_map={
            **json.loads((d / "model.safetensors.index.json").read_text())["weight_map"],
            "projector.fc1.weight": "model-00003-of-00002.safetensors"}),
        r"model-00003-of-00002.safetensors: missing"),
    "a truncated shard": (lambda d: _truncate(d / "model-00001-of-00002.safetensors"),
                          r"model-00001-of-00002.safetensors: truncated"),
    "an unsupported vision backbone": (lambda d: _edit_json(d / "config.json", vision_backbone_id="siglip-vit-so400m"),
                                       r"config.json: vision_backbone_id 'siglip-vit-so400m' is not supported; "
                                       r"supported: dinosiglip-vit-so-224px"),
    "an unsupported projector": (lambda d: _edit_json(d / "config.json", arch_specifier="gelu-mlp"),
                                 r"arch_specifier 'gelu-mlp' is not supported; supported: no-align\+fused-gelu-mlp"),
    "statistics of another action dimension": (
        lambda d: (d / "dataset_statistics.json").write_text(json.dumps({"six": {"action": {
            "q01": [-1.0] * 6, "q99": [1.0] * 6, "mask": [True] * 6}}})),
        r"dataset_statistics.json: dataset 'six' has action q01 of shape \(6,\); this policy's actions are 7-D"),
    "pickles only": (lambda d: _pickles_only(d), r"holds only pickle weights \(pytorch_model.bin\)"),
}


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _pickles_only(directory: Path) -> None:
    for path in directory.glob("model*.safetensors*"):
        path.unlink()
    (directory / "pytorch_model.bin").write_bytes(b"not loaded")


@pytest.mark.parametrize("case", list(BAD))
def test_each_bad_directory_is_one_line_naming_the_file_or_key(model_dir: Path, tmp_path: Path, case: str) -> None:
    directory = copy_of(model_dir, tmp_path)
    damage, message = BAD[case]
    damage(directory)
    with pytest.raises(ValueError, match=message) as error:
        load_policy(directory)
    assert "\n" not in str(error.value)


def test_unnorm_key_missing_or_ambiguous_lists_the_keys(model_dir: Path, tmp_path: Path) -> None:
    directory = copy_of(model_dir, tmp_path)
    two = {**layout.STATISTICS, "other": layout.STATISTICS[layout.DATASET]}
    (directory / "dataset_statistics.json").write_text(json.dumps(two))
    with pytest.raises(ValueError, match=r"holds the statistics of 2 datasets \['other', 'tiny_dataset'\]; pick one"):
        load_policy(directory)
    holds = r"no dataset 'bridge_orig' \(unnorm_key\); it holds \['other', 'tiny_dataset'\]"
    with pytest.raises(ValueError, match=holds):
        load_policy(directory, unnorm_key="bridge_orig")
    assert load_policy(directory, unnorm_key="other").statistics.key == "other"
    # without the file, the statistics in config.json (norm_stats)
    (directory / "dataset_statistics.json").unlink()
    assert load_policy(directory).statistics.source.name == "config.json"
