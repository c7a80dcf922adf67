"""Defaults per model and inputs that match it, through the commands: a checkpoint trained elsewhere
(an OpenVLA directory as published) runs greedy unless told otherwise, so ``predict`` and ``eval``
pick the same tokens for one frame; the package's own policies keep their temperature and bounds;
an OFT directory declaring two images refuses to run on one camera in ``eval`` and ``sim``, in one
line naming ``--cameras``, runs with two, and runs with one and ``--stand-in-images`` (recorded in
the summary); an error that asks for a setting names the command's flag, the node's its parameter."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from vla_accel_ros.cli import main
from vla_accel_ros.models.api import ResolvedCheckpoint
from vla_accel_ros.models.configuration import DEFAULT_TEMPERATURE, TRAINED_HERE, RunDefaults
from vla_accel_ros.models.load import resolve_checkpoint
from vla_accel_ros.runtime.builder import RunnerConfig, run_defaults
from vla_accel_ros.runtime.runner import PolicyRunner

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _layout(family: str):
    spec = importlib.util.spec_from_file_location(f"{family}_layout", FIXTURES / family / "layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


openvla_layout, oft_layout = _layout("openvla"), _layout("oft")


@pytest.fixture(scope="module")
def openvla_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return openvla_layout.write_openvla_dir(tmp_path_factory.mktemp("defaults") / "openvla")


@pytest.fixture(scope="module")
def two_image_oft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vla_accel_ros.models.oft.weights import convert_directory

    directory = oft_layout.write_oft_dir(tmp_path_factory.mktemp("defaults") / "oft",
                                         spec={"chunk_size": 8, "n_images": 2})
    convert_directory(directory, report=lambda line: None)
    return directory


def runner_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any, PolicyRunner]]:
    """Each runner call a command makes from now on, as (observation, result, runner)."""
    calls: list[tuple[Any, Any, PolicyRunner]] = []
    call = PolicyRunner.__call__

    def recorded(self: PolicyRunner, obs: Any, **kwargs: Any) -> Any:
        result = call(self, obs, **kwargs)
        calls.append((obs, result, self))
        return result

    monkeypatch.setattr(PolicyRunner, "__call__", recorded)
    return calls


def text_ids(call: tuple[Any, Any, PolicyRunner]) -> list[int]:
    """The text ids of the action tokens a token VLA's runner call picked."""
    _, result, runner = call
    return np.asarray(runner.policy.action_ids)[np.asarray(result.tokens, dtype=np.int64).reshape(-1)].tolist()


def eval_summary(out: Path, *args: str) -> dict:
    assert main(["eval", *args, "--episodes", "1", "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


# --- defaults per model -----------------------------------------------------------------------
def test_a_model_trained_elsewhere_runs_greedy_so_predict_and_one_eval_step_agree(
        openvla_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = runner_calls(monkeypatch)
    summary = eval_summary(tmp_path / "eval", "--checkpoint", str(openvla_dir), "--decoder", "ar", "--max-steps", "1")
    assert summary["temperature"] == 0.0 and len(calls) == 1
    obs = calls[0][0]
    frame = tmp_path / "frame.png"
    Image.fromarray(obs.image).save(frame)  # lossless: predict reads the very pixels eval's step saw
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(openvla_dir), "--image", str(frame), "--instruction", obs.instruction,
                 "--joints", *map(str, obs.joint_pos), "--gripper", str(obs.gripper), "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)["action_token_ids"]
    assert predicted == text_ids(calls[0])
    # at the package's temperature the same step samples other tokens: the agreement is the greedy default's
    calls.clear()
    eval_summary(tmp_path / "sampled", "--checkpoint", str(openvla_dir), "--decoder", "ar", "--max-steps", "1",
                 "--temperature", str(DEFAULT_TEMPERATURE))
    assert text_ids(calls[0]) != predicted


def test_kerv_takes_the_bounds_for_a_poorly_predicted_model_and_the_spec_overrides_them(
        openvla_dir: Path, tmp_path: Path) -> None:
    resolved = resolve_checkpoint(openvla_dir)
    assert run_defaults(resolved) == RunDefaults(temperature=0.0, kinematic_r_bounds=(2, 6), kf_fill_check=True)
    config = RunnerConfig(decoder="kerv").for_model(run_defaults(resolved))
    assert (config.temperature, config.kinematic_r_bounds, config.kf_fill_check) == (0.0, (2, 6), True)
    chosen = RunnerConfig(decoder="kerv", temperature=0.3, kinematic_r_bounds=(3, 9)).for_model(run_defaults(resolved))
    assert (chosen.temperature, chosen.kinematic_r_bounds, chosen.kf_fill_check) == (0.3, (3, 9), False)
    plain = RunnerConfig(decoder="ar").for_model(run_defaults(resolved))  # no kinematic threshold, no fill check
    assert (plain.kinematic_r_bounds, plain.kf_fill_check) == (None, False)
    spec = openvla_dir / "vla_spec.json"
    try:
        spec.write_text(json.dumps({"temperature": 0.7, "kinematic_r_bounds": [4, 12], "kf_fill_check": False}))
        assert run_defaults(resolved) == RunDefaults(temperature=0.7, kinematic_r_bounds=(4, 12), kf_fill_check=False)
        spec.write_text(json.dumps({"kinematic_r_bounds": [9, 3]}))
        with pytest.raises(ValueError, match=r"vla_spec.json: kinematic_r_bounds must be \[r_min, r_max\]"):
            run_defaults(resolved)
    finally:
        spec.unlink()


def test_the_package_s_policies_keep_their_temperature_and_bounds(tiny_checkpoint, tmp_path: Path) -> None:
    from vla_accel_ros.core.resources import share_dir

    own = resolve_checkpoint(tiny_checkpoint(tmp_path / "own"))
    hf_small = resolve_checkpoint(share_dir() / "checkpoints" / "hf_small")
    for resolved in (own, hf_small):
        assert run_defaults(resolved) == TRAINED_HERE
        config = RunnerConfig(decoder="kerv").for_model(run_defaults(resolved))
        assert (config.temperature, config.kinematic_r_bounds, config.kf_fill_check) == (DEFAULT_TEMPERATURE, None,
                                                                                          False)
    assert RunnerConfig.from_json(RunnerConfig().to_json()).temperature is None  # unset travels to the child
    assert isinstance(ResolvedCheckpoint.from_json(own.to_json()), ResolvedCheckpoint)


def test_a_hugging_face_vla_trained_here_declares_the_package_s_defaults(tmp_path: Path) -> None:
    from vla_accel_ros.models.configuration import declared_run_defaults
    from vla_accel_ros.training.hf_vla import write_side_files

    write_side_files(tmp_path, {"sim": {}}, image_size=64)
    assert declared_run_defaults(RunDefaults(), tmp_path) == TRAINED_HERE
    assert declared_run_defaults(RunDefaults(), tmp_path / "elsewhere") == RunDefaults()  # no vla_spec.json


# --- inputs that match the model ----------------------------------------------------------------
def test_an_oft_directory_declaring_two_images_refuses_one_camera_in_one_line_and_runs_with_two(
        two_image_oft_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    common = ["--checkpoint", str(two_image_oft_dir), "--decoder", "chunk", "--max-steps", "2"]
    capsys.readouterr()
    assert main(["eval", *common, "--cameras", "1", "--episodes", "1", "--out", str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "reads 2 images per observation" in err
    assert "give 2 with --cameras" in err and "--stand-in-images" in err and "image_topics" not in err
    assert not (tmp_path / "one" / "summary.json").exists()

    calls = runner_calls(monkeypatch)
    two = eval_summary(tmp_path / "two", *common, "--cameras", "2")
    assert (two["episodes"], two["cameras"], two["stand_in_images"]) == (1, 2, 0)
    scene, wrist = calls[0][0].images
    assert not np.array_equal(scene, wrist)  # the sim's wrist camera, not a copy

    calls.clear()
    stand_in = eval_summary(tmp_path / "stand_in", *common, "--cameras", "1", "--stand-in-images")
    assert (stand_in["cameras"], stand_in["stand_in_images"]) == (1, 1)


def test_sim_refuses_one_camera_naming_its_flag_and_runs_with_a_stand_in(
        two_image_oft_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["sim", "--checkpoint", str(two_image_oft_dir), "--decoder", "chunk", "--episodes", "1",
              "--duration-s", "2", "--domain-id", "226", "--inference-mode", "thread"]
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "reads 2 images per observation" in err
    assert "give 2 with --cameras" in err and "--stand-in-images" in err and "image_topics" not in err
    rc = main([*common, "--stand-in-images", "--out", str(tmp_path / "stand_in")])
    assert rc != 2, capsys.readouterr().err  # it ran (its exit status says whether the policy drove the arm)
    summary = json.loads((tmp_path / "stand_in" / "summary.json").read_text())
    assert summary["options"]["stand_in_images"] is True
    log = (tmp_path / "stand_in" / "vla_accel_node.log").read_text()
    assert "the other 1 get a copy of the first camera's image (allow_stand_in_images)" in log


def test_the_runner_fills_missing_image_slots_only_when_stand_ins_are_allowed(two_image_oft_dir: Path) -> None:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.core.resources import default_urdf

    kin = ArmKinematics(default_urdf())
    image = np.random.default_rng(0).integers(0, 256, (112, 112, 3), dtype=np.uint8)
    obs = Observation(image=image, instruction="pick up the red cube", joint_pos=np.zeros(7), gripper=0.02,
                      state=oft_layout_state())
    config = RunnerConfig(str(two_image_oft_dir), "chunk", temperature=0.0)
    with pytest.raises(ValueError, match="takes 2 images"):
        from vla_accel_ros.runtime.builder import build_runner

        build_runner(config, kin)(obs)
    runner = build_runner(RunnerConfig(str(two_image_oft_dir), "chunk", temperature=0.0, stand_in_images=True), kin)
    filled = runner.with_stand_ins(obs)
    assert len(filled.images) == 2 and filled.images[1] is image
    assert runner(obs).action is not None


def oft_layout_state() -> np.ndarray:
    """A state of the OFT fixture's size (its proprio statistics)."""
    return np.zeros(oft_layout.STATE_DIM)


# --- errors name the flag -----------------------------------------------------------------------
def test_an_error_asking_for_a_setting_names_the_flag_in_a_command_and_the_parameter_in_the_node(
        openvla_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vla_accel_ros.core.settings import ConfigError
    from vla_accel_ros.ros.node_cameras import check_image_slots

    several = tmp_path / "several"
    dataset = openvla_layout.STATISTICS[openvla_layout.DATASET]
    openvla_layout.write_openvla_dir(several, statistics={"bridge": dataset, "libero": dataset})
    frame = tmp_path / "frame.png"
    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(frame)
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(several), "--image", str(frame), "--instruction", "x"]) == 2
    err = capsys.readouterr().err
    assert "pick one with --unnorm-key" in err and "unnorm_key" not in err.replace(str(several), "")
    with pytest.raises(ValueError, match="pick one with unnorm_key"):  # what the node shows
        resolve_checkpoint(several)
    with pytest.raises(ConfigError, match="give 2 with image_topics.*allow_stand_in_images"):
        check_image_slots(1, 2, allow_stand_in=False)
    assert "allow_stand_in_images" in check_image_slots(1, 2, allow_stand_in=True)
    assert check_image_slots(2, 2, allow_stand_in=False) == ""
