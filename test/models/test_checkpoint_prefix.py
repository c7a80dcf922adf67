"""The checkpoint reference users expect: a plain directory path works for every family, ``hf:``
stays an alias of the Llava-style family, and a prefix that declares the wrong family is refused in
one line naming the family the directory is (OpenVLA, OpenVLA-OFT as published)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from vla_accel_ros.cli import main
from vla_accel_ros.models.load import load_policy, recognise, resolve_checkpoint


@pytest.fixture(scope="module")
def openvla_dir(tmp_path_factory: pytest.TempPathFactory, fixture_layout) -> Path:
    directory: Path = fixture_layout("openvla").write_openvla_dir(tmp_path_factory.mktemp("prefix") / "openvla-tiny")
    (directory / "vla_spec.json").write_text(json.dumps({"dtype": "float32"}))
    return directory


def test_hf_on_an_openvla_directory_names_the_openvla_family(openvla_dir: Path) -> None:
    with pytest.raises(ValueError) as refused:
        resolve_checkpoint(f"hf:{openvla_dir}")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{openvla_dir} is a checkpoint of the openvla family (config.json with model_type")
    assert message.endswith("give the directory without hf:")
    with pytest.raises(ValueError, match="openvla family"):
        load_policy(f"hf:{openvla_dir}")


def test_predict_with_hf_on_an_openvla_directory_exits_2_naming_the_family(
        openvla_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np
    from PIL import Image

    image = tmp_path / "frame.png"
    Image.fromarray(np.zeros((48, 64, 3), dtype=np.uint8)).save(image)
    args = ["--image", str(image), "--instruction", "pick up the red cube", "--json"]
    assert main(["predict", "--checkpoint", f"hf:{openvla_dir}", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "openvla family" in err and "without hf:" in err
    assert main(["predict", "--checkpoint", str(openvla_dir), *args]) == 0
    assert json.loads(capsys.readouterr().out)["family"] == "openvla"


def test_a_plain_openvla_directory_runs_an_eval_episode(openvla_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(openvla_dir), "--decoder", "ar", "--episodes", "1", "--max-steps", "2",
                 "--out", str(out)]) == 0
    assert (out / "summary.json").is_file()


def test_hf_on_an_oft_directory_names_the_oft_family(tmp_path: Path, fixture_layout) -> None:
    directory: Path = fixture_layout("oft").write_oft_dir(tmp_path / "oft-tiny")
    with pytest.raises(ValueError, match=rf"^{directory} is a checkpoint of the oft family .*without hf:$"):
        resolve_checkpoint(f"hf:{directory}")


def test_hf_stays_an_alias_and_a_plain_path_works_for_every_local_family(
        tiny_hf_vla: Callable[..., Path], tiny_checkpoint: Callable[..., Path], openvla_dir: Path,
        tmp_path: Path) -> None:
    hf = tiny_hf_vla(tmp_path / "hf")
    assert recognise(f"hf:{hf}").name == recognise(str(hf)).name == "hf"
    assert recognise(str(tiny_checkpoint(tmp_path / "own"))).name == "own"
    assert recognise(str(openvla_dir)).name == "openvla"


def test_hf_on_a_directory_no_family_recognises_keeps_the_hf_checks_message(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    with pytest.raises(ValueError, match="not a Llava-style VLA"):
        resolve_checkpoint(f"hf:{tmp_path}")
