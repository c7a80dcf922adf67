"""VLASpec and its files (vla_spec.json, the processor configs, the action statistics) and the
OpenVLA action tokenizer's mask and gripper conventions. Torch-free: plain JSON files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vla_accel_ros.models.token_vla.spec import (
    CLIP_MEAN,
    CLIP_STD,
    GRIPPER_CONVENTIONS,
    OPENVLA_PROMPT,
    VLASpec,
    load_spec,
)
from vla_accel_ros.models.token_vla.statistics import OpenVLAActionTokenizer, load_action_statistics

Q01 = [-0.02, -0.01, -0.03, -0.1, -0.1, -0.2, 0.0]
Q99 = [0.02, 0.03, 0.01, 0.1, 0.2, 0.2, 1.0]
MASK = [True] * 6 + [False]
BIN_CENTRES = (np.linspace(-1, 1, 256)[:-1] + np.linspace(-1, 1, 256)[1:]) / 2


def write(directory: Path, name: str, data: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(data))
    return directory / name


def statistics(*keys: str, dim: int = 7) -> dict[str, Any]:
    return {key: {"action": {"q01": Q01[:dim], "q99": Q99[:dim], "mask": MASK[:dim]}, "proprio": {}} for key in keys}


# --- the spec ---------------------------------------------------------------------------------
def test_defaults_are_openvla() -> None:
    spec = VLASpec()
    assert spec.prompt == OPENVLA_PROMPT
    assert spec.format_prompt("Pick up the Cube") == (
        "", "In: What action should the robot take to pick up the cube?\nOut:", "")
    assert spec.resolved_appended_ids(32000) == (29871,)
    assert spec.resolved_appended_ids(384) == ()  # a vocabulary without id 29871
    ids = spec.action_ids(32000)
    assert ids.shape == (256,) and ids[0] == 31999 and ids[254] == 31745 and ids[255] == 31744
    assert (spec.gripper, spec.device, spec.dtype, spec.unnorm_key) == ("0_1_open_high", "cpu", "float32", None)


def test_ascending_action_ids_and_ids_outside_the_vocabulary() -> None:
    np.testing.assert_array_equal(VLASpec(action_id_first=10, action_id_step=1).action_ids(300), 10 + np.arange(256))
    with pytest.raises(ValueError, match="leave the text vocabulary"):
        VLASpec(action_id_first=100, action_id_step=1).action_ids(300)
    with pytest.raises(ValueError, match="too small for 256 action ids"):
        VLASpec().action_ids(200)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("prompt", "no field here", "one '{instruction}' field"),
    ("prompt", "{instruction} and {other}", "not a valid template"),
    ("appended_ids", [1, -2], "appended_ids"),
    ("action_id_step", 2, "action_id_step"),
    ("image_size", 0, "image_size"),
    ("image_mean", [0.5, 0.5], "image_mean"),
    ("image_std", [0.5, 0.0, 0.5], "image_std must be positive"),
    ("gripper", "open_is_one", "gripper must be one of"),
    ("dtype", "float64", "dtype must be one of"),
    ("resample", "lanczos", "resample must be one of"),
    ("lowercase_instruction", "yes", "lowercase_instruction must be a bool"),
])
def test_bad_fields_are_refused(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VLASpec(**{field: value})


# --- load_spec: the processor's image settings, then vla_spec.json --------------------------
@pytest.mark.parametrize(("files", "size", "mean", "resample"), [
    ({}, 224, CLIP_MEAN, "bicubic"),  # nothing: OpenVLA/CLIP defaults
    ({"config.json": {"vision_config": {"image_size": 48}}}, 48, CLIP_MEAN, "bicubic"),
    ({"config.json": {"vision_config": {"image_size": 48}},
      "preprocessor_config.json": {"crop_size": {"height": 64, "width": 64}, "size": {"shortest_edge": 80},
                                   "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2}},
     64, (0.5, 0.5, 0.5), "bilinear"),
    ({"processor_config.json": {"image_processor": {"do_center_crop": False, "size": {"height": 40, "width": 40},
                                                    "image_mean": [0.1, 0.2, 0.3], "image_std": [1, 1, 1]}}},
     40, (0.1, 0.2, 0.3), "bicubic"),
    ({"preprocessor_config.json": {"size": {"shortest_edge": 36}, "do_normalize": False}},
     36, (0.0, 0.0, 0.0), "bicubic"),
])
def test_image_settings_come_from_the_processor_files(tmp_path: Path, files: dict[str, Any], size: int,
                                                      mean: tuple[float, ...], resample: str) -> None:
    for name, data in files.items():
        write(tmp_path, name, data)
    spec = load_spec(tmp_path)
    assert (spec.image_size, spec.image_mean, spec.resample) == (size, mean, resample)
    if not files:
        assert spec.image_std == CLIP_STD


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"prompt": "Task: {instruction}. Act:"}, {"prompt": "Task: {instruction}. Act:"}),
    ({"appended_ids": [259, 7]}, {"appended_ids": (259, 7)}),
    ({"appended_ids": []}, {"appended_ids": ()}),
    ({"unnorm_key": "bridge_orig"}, {"unnorm_key": "bridge_orig"}),
    ({"gripper": "minus1_1_open_low"}, {"gripper": "minus1_1_open_low"}),
    ({"image_size": 64, "image_mean": [0, 0, 0]}, {"image_size": 64, "image_mean": (0.0, 0.0, 0.0)}),
    ({"action_id_first": 0, "action_id_step": 1, "device": "cuda:1", "dtype": "bfloat16"},
     {"action_id_first": 0, "action_id_step": 1, "device": "cuda:1", "dtype": "bfloat16"}),
])
def test_vla_spec_json_overrides(tmp_path: Path, overrides: dict[str, Any], expected: dict[str, Any]) -> None:
    write(tmp_path, "preprocessor_config.json", {"crop_size": {"height": 32, "width": 32}})
    write(tmp_path, "vla_spec.json", overrides)
    spec = load_spec(tmp_path)
    assert {key: getattr(spec, key) for key in expected} == expected
    if "image_size" not in overrides:
        assert spec.image_size == 32  # the processor's, where the spec file says nothing


@pytest.mark.parametrize(("content", "message"), [
    ({"promt": "typo {instruction}"}, "unknown key 'promt'"),
    ({"gripper": "sideways"}, "gripper must be one of"),
    (["not", "an", "object"], "not a JSON object"),
])
def test_bad_vla_spec_json_is_refused_naming_the_file(tmp_path: Path, content: Any, message: str) -> None:
    write(tmp_path, "vla_spec.json", content)
    with pytest.raises(ValueError, match=message) as caught:
        load_spec(tmp_path)
    assert "vla_spec.json" in str(caught.value)


def test_unreadable_vla_spec_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vla_spec.json").write_text("{not json")
    with pytest.raises(ValueError, match="vla_spec.json: cannot read it as JSON"):
        load_spec(tmp_path)


# --- action statistics ------------------------------------------------------------------------
def test_the_only_dataset_is_picked_and_the_mask_read(tmp_path: Path) -> None:
    write(tmp_path, "dataset_statistics.json", statistics("bridge_orig"))
    stats = load_action_statistics(tmp_path, VLASpec())
    assert stats.key == "bridge_orig" and stats.source.name == "dataset_statistics.json"
    np.testing.assert_array_equal(stats.q01, Q01)
    np.testing.assert_array_equal(stats.mask, MASK)


def test_a_missing_mask_means_every_dimension_is_unnormalised(tmp_path: Path) -> None:
    write(tmp_path, "dataset_statistics.json", {"d": {"action": {"q01": Q01, "q99": Q99}}})
    assert load_action_statistics(tmp_path, VLASpec()).mask.all()


def test_statistics_in_config_norm_stats(tmp_path: Path) -> None:
    write(tmp_path, "config.json", {"norm_stats": statistics("a", "b")})
    stats = load_action_statistics(tmp_path, VLASpec(unnorm_key="b"))
    assert stats.key == "b" and stats.source.name == "config.json"


@pytest.mark.parametrize(("table", "unnorm_key", "message"), [
    (statistics("a", "b"), None, r"2 datasets \['a', 'b'\]; pick one with unnorm_key"),
    (statistics("a", "b"), "c", r"no dataset 'c' \(unnorm_key\); it holds \['a', 'b'\]"),
    (statistics("a", dim=6), None, "action q01 of shape \\(6,\\); this policy's actions are 7-D"),
    ({"a": {"proprio": {}}}, None, "dataset 'a' has no action q01/q99"),
    ({"a": {"action": {"q01": Q01, "q99": Q99, "mask": MASK[:5]}}}, None, "action mask of shape"),
])
def test_bad_statistics_are_refused_naming_the_file(tmp_path: Path, table: dict[str, Any], unnorm_key: str | None,
                                                    message: str) -> None:
    write(tmp_path, "dataset_statistics.json", table)
    with pytest.raises(ValueError, match=message) as caught:
        load_action_statistics(tmp_path, VLASpec(unnorm_key=unnorm_key))
    assert "dataset_statistics.json" in str(caught.value)


def test_missing_statistics_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dataset_statistics.json: no action statistics"):
        load_action_statistics(tmp_path, VLASpec())


# --- the OpenVLA action tokenizer -------------------------------------------------------------
def openvla_gripper(value: np.ndarray, convention: str) -> np.ndarray:
    """The gripper conventions, written out: the policy's value -> ours (1 = open), in [0, 1]."""
    ours = {"0_1_open_high": value, "0_1_open_low": 1 - value,
            "minus1_1_open_high": (value + 1) / 2, "minus1_1_open_low": (1 - value) / 2}[convention]
    return np.clip(ours, 0, 1)


@pytest.mark.parametrize("gripper", GRIPPER_CONVENTIONS)
def test_decoding_is_openvla_predict_action_then_the_gripper_convention(gripper: str) -> None:
    tokenizer = OpenVLAActionTokenizer(np.array(Q01), np.array(Q99), np.array(MASK), gripper)
    tokens = np.repeat(np.arange(256)[:, None], 7, axis=1)
    normalised = BIN_CENTRES[np.clip(tokens, 0, 254)]
    low, high = np.array(Q01), np.array(Q99)
    expected = np.where(MASK, 0.5 * (normalised + 1) * (high - low) + low, normalised)
    expected[:, 6] = openvla_gripper(expected[:, 6], gripper)
    np.testing.assert_allclose(tokenizer.decode(tokens), expected, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(tokenizer.decode_checked(tokens[:255]), tokenizer.decode(tokens[:255]))


@pytest.mark.parametrize("gripper", GRIPPER_CONVENTIONS)
def test_encode_inverts_decode_where_the_convention_reaches(gripper: str) -> None:
    tokenizer = OpenVLAActionTokenizer(np.array(Q01), np.array(Q99), np.array(MASK), gripper)
    tokens = np.repeat(np.arange(255)[:, None], 7, axis=1)
    decoded = tokenizer.decode(tokens)
    reached = (tokens[:, 6] >= 128) if gripper.startswith("0_1") else np.ones(255, bool)  # [0, 1] of [-1, 1]
    encoded = tokenizer.encode(decoded)
    np.testing.assert_array_equal(encoded[:, :6], tokens[:, :6])
    np.testing.assert_array_equal(encoded[reached, 6], tokens[reached, 6])
    for row in decoded[::7]:
        np.testing.assert_array_equal(tokenizer.encode_one(row), tokenizer.encode(row))
    width = tokenizer.bin_width
    np.testing.assert_allclose(width[:6], (np.array(Q99) - np.array(Q01))[:6] / 255)
    assert width[6] == pytest.approx(2 / 255 if gripper.startswith("0_1") else 1 / 255)


def test_a_constant_axis_decodes_to_its_value_and_a_dict_round_trips() -> None:
    q01, q99 = np.array(Q01), np.array(Q99)
    q01[2] = q99[2] = 0.5  # OpenVLA statistics of an axis the data never moves
    tokenizer = OpenVLAActionTokenizer(q01, q99, np.array(MASK), "minus1_1_open_high")
    assert np.all(tokenizer.decode(np.repeat(np.arange(255)[:, None], 7, axis=1))[:, 2] == 0.5)
    assert tokenizer.encode_one(tokenizer.decode(np.full(7, 9)))[2] == tokenizer.encode(np.full(7, 0.5))[2]
    again = OpenVLAActionTokenizer.from_dict(json.loads(json.dumps(tokenizer.to_dict())))
    np.testing.assert_array_equal(again.decode(np.arange(7)), tokenizer.decode(np.arange(7)))
    assert again.gripper == "minus1_1_open_high" and again.mask.tolist() == MASK


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"q01": np.zeros(6)}, "shape"),
    ({"mask": np.ones(8, bool)}, "shape"),
    ({"q99": np.full(7, -1.0)}, "q99 must not be below q01"),
    ({"q01": np.full(7, np.nan)}, "finite"),
    ({"gripper": "0_1"}, "gripper must be one of"),
])
def test_bad_tokenizer_statistics_are_refused(kwargs: dict[str, Any], message: str) -> None:
    arguments = {"q01": np.array(Q01), "q99": np.array(Q99), "mask": np.array(MASK),
                 "gripper": "0_1_open_high"} | kwargs
    with pytest.raises(ValueError, match=message):
        OpenVLAActionTokenizer(**arguments)


def test_a_robot_entry_is_the_robot_record_and_not_a_spec_setting(tmp_path, tiny_hf_vla):
    import json

    from vla_accel_ros.core.robot_record import read_robot_record
    from vla_accel_ros.models.token_vla.spec import load_spec

    directory = tiny_hf_vla(tmp_path / "vla")
    assert read_robot_record(directory) is None  # nothing recorded: the node says so and runs
    robot = {"dof": 7, "joint_names": [f"fr3_joint{i}" for i in range(1, 8)], "tcp_frame": "fr3_hand_tcp",
             "control_rate_hz": 15.0}
    (directory / "vla_spec.json").write_text(json.dumps({"robot": robot, "gripper": "0_1_open_low"}))
    assert load_spec(directory).gripper == "0_1_open_low"
    record = read_robot_record(directory)
    assert record is not None and record.joint_names[0] == "fr3_joint1" and record.control_rate_hz == 15.0
    (directory / "vla_spec.json").write_text(json.dumps({"robot": {"dof": 7}}))
    with pytest.raises(ValueError, match="vla_spec.json"):
        read_robot_record(directory)


def test_an_image_field_places_the_image_tokens() -> None:
    spec = VLASpec(prompt="In: {instruction}?{image}\nOut:")
    assert spec.format_prompt("Pick up the Cube") == ("In: pick up the cube?", "\nOut:", "")
    with pytest.raises(ValueError, match="at most one"):
        VLASpec(prompt="{image}{instruction}{image}")


# --- proprioception in the prompt ----------------------------------------------------------------
PROPRIO_PROMPT = "In: {instruction}?{image}{proprio}\nOut:"


def test_a_proprio_field_splits_the_text_after_the_image() -> None:
    spec = VLASpec(prompt=PROPRIO_PROMPT)
    assert spec.reads_proprio and not VLASpec().reads_proprio
    assert spec.format_prompt("Pick up the Cube") == ("In: pick up the cube?", "", "\nOut:")
    assert VLASpec(prompt="{instruction}:{proprio}.").format_prompt("x") == ("", "x:", ".")  # image first


@pytest.mark.parametrize(("prompt", "message"), [
    ("{proprio}{instruction}{image}", "must come after its '{image}' field"),
    ("{instruction}{proprio}{proprio}", "at most one '{proprio}' field"),
])
def test_bad_proprio_fields_are_refused(prompt: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VLASpec(prompt=prompt)


def test_proprio_bins_are_the_action_binning_on_the_proprio_quantiles(tmp_path: Path) -> None:
    table = statistics("a")
    table["a"]["proprio"] = {"q01": [-1.0, 0.0, 2.0], "q99": [1.0, 0.04, 2.0]}  # a constant last axis
    write(tmp_path, "dataset_statistics.json", table)
    stats = load_action_statistics(tmp_path, VLASpec())
    np.testing.assert_array_equal(stats.proprio_q99, [1.0, 0.04, 2.0])
    np.testing.assert_array_equal(stats.proprio_bins(np.array([-5.0, 0.02, 7.0])), [0, 127, 127])
    np.testing.assert_array_equal(stats.proprio_bins(np.array([1.0, 0.04, 2.0])), [254, 254, 127])
    with pytest.raises(ValueError, match="reads 3 proprioception values.*got 2"):
        stats.proprio_bins(np.zeros(2))
    with pytest.raises(ValueError, match="NaN or inf"):
        stats.proprio_bins(np.array([0.0, np.nan, 0.0]))


@pytest.mark.parametrize(("proprio", "message"), [
    ({"q01": [0.0, 1.0], "q99": [1.0]}, "proprio q01/q99 of shapes \\(2,\\) and \\(1,\\)"),
    ({"q01": [0.0, "a"], "q99": [1.0, 2.0]}, "malformed proprio statistics"),
])
def test_bad_proprio_statistics_are_refused(tmp_path: Path, proprio: dict[str, Any], message: str) -> None:
    table = statistics("a")
    table["a"]["proprio"] = proprio
    write(tmp_path, "dataset_statistics.json", table)
    with pytest.raises(ValueError, match=message):
        load_action_statistics(tmp_path, VLASpec())


def test_statistics_without_proprio_quantiles_cannot_bin_it(tmp_path: Path) -> None:
    write(tmp_path, "dataset_statistics.json", statistics("a"))
    stats = load_action_statistics(tmp_path, VLASpec())
    assert stats.proprio_q01 is None
    with pytest.raises(ValueError, match="no proprio q01/q99"):
        stats.proprio_bins(np.zeros(8))
