"""An OpenVLA-OFT directory as published stores no chunk size: it is taken from the platform its
statistics' dataset names, as OFT's ``prismatic/vla/constants.py`` picks it (LIBERO 8, ALOHA 25 with
min/max bounds, BRIDGE 5), and a warning says so; ``vla_spec.json`` or the parameter still win, and a
dataset that names no platform is refused in one line. The kept-back reference directory, without
its ``vla_spec.json``, gives OFT's chunk through ``vla-accel predict`` with no extra flag."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from vla_accel_ros.cli import main
from vla_accel_ros.models.load import load_policy
from vla_accel_ros.models.oft.weights import convert_directory

FIXTURES = Path(__file__).parents[1] / "fixtures" / "oft"
_spec = importlib.util.spec_from_file_location("oft_layout_platform", FIXTURES / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)  # type: ignore[union-attr]
CHUNK_ATOL = 1e-4  # test_oft_reference.py's: the original against itself


def _published(path: Path, dataset: str, spec: dict[str, int] | None = None) -> Path:
    """A small OFT directory whose statistics belong to ``dataset``, without a chunk size unless
    ``spec`` gives one."""
    directory = layout.write_oft_dir(path, spec=spec or {})
    if spec is None:
        (directory / "vla_spec.json").unlink()
    statistics = json.loads((directory / "dataset_statistics.json").read_text())
    (directory / "dataset_statistics.json").write_text(json.dumps({dataset: statistics[layout.DATASET]}))
    config = json.loads((directory / "config.json").read_text())
    config.pop("norm_stats", None)
    (directory / "config.json").write_text(json.dumps(config))
    convert_directory(directory, report=lambda line: None)
    return directory


@pytest.mark.parametrize(("dataset", "chunk", "bounds"), [
    ("libero_spatial_no_noops", 8, "q01_q99"), ("aloha_fold_shirt", 25, "min_max"), ("Bridge_orig", 5, "q01_q99")])
def test_the_chunk_is_the_platforms_of_the_dataset(tmp_path: Path, caplog: pytest.LogCaptureFixture, dataset: str,
                                                   chunk: int, bounds: str) -> None:
    directory = _published(tmp_path / "oft", dataset)
    with caplog.at_level(logging.WARNING):
        policy = load_policy(directory)
    assert (policy.chunk.chunk_size, policy.chunk.bounds) == (chunk, bounds)
    said = [r.getMessage() for r in caplog.records if "no chunk size stored" in r.getMessage()]
    assert len(said) == 1 and f"a chunk of {chunk} actions (bounds {bounds})" in said[0], said
    assert f"dataset '{dataset}'" in said[0]


def test_vla_spec_still_sets_the_chunk(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = _published(tmp_path / "oft", "aloha_fold_shirt", spec={"chunk_size": 3})
    with caplog.at_level(logging.WARNING):
        policy = load_policy(directory)
    assert (policy.chunk.chunk_size, policy.chunk.bounds) == (3, "q01_q99")
    assert not [r for r in caplog.records if "no chunk size stored" in r.getMessage()]


def test_a_dataset_of_no_known_platform_is_refused_in_one_line(tmp_path: Path) -> None:
    directory = _published(tmp_path / "oft", "kitchen_pick")
    with pytest.raises(ValueError, match="does not store its chunk size") as caught:
        load_policy(directory)
    assert "\n" not in str(caught.value)


def test_the_kept_back_directory_gives_ofts_chunk_with_predict_and_no_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """The Bar: the reference directory as published (no vla_spec.json), ``predict`` with no
    ``--chunk-size``: a chunk of 8 (LIBERO's; its dataset is ``tiny_libero_no_noops``), the chunk the
    original computed on it."""
    directory = layout.write_reference_dir(tmp_path / "model")
    (directory / "vla_spec.json").unlink()
    convert_directory(directory, report=lambda line: None)
    recorded = dict(np.load(FIXTURES / "reference" / "recorded.npz"))
    frames = layout.openvla.reference_images()
    (slots, instruction, state), case = layout.REFERENCE_CASES[0], 0
    from PIL import Image

    images = []
    for slot in slots:
        Image.fromarray(frames[slot]).save(tmp_path / f"frame{slot}.png")
        images += ["--image", str(tmp_path / f"frame{slot}.png")]
    argv = ["predict", "--checkpoint", str(directory), *images, "--instruction",
            layout.openvla.REFERENCE_INSTRUCTIONS[instruction],
            "--state=" + ",".join(repr(v) for v in layout.REFERENCE_STATES[state]), "--dtype", "float32", "--json"]
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chunk_size"] == 8 and np.asarray(out["actions"]).shape == (8, 7)
    assert any("a chunk of 8 actions" in r.getMessage() and "LIBERO" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(out["actions_normalized"], recorded["actions_normalized"][case], rtol=0,
                               atol=CHUNK_ATOL)
