"""The own family's registration: a directory with ``model.json`` (the package's VLA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.core.errors import SettingError
from vla_accel_ros.models.api import Family
from vla_accel_ros.models.configuration import TRAINED_HERE
from vla_accel_ros.models.files import check_safetensors, read_json_object
from vla_accel_ros.models.own.config import VLAConfig, expected_shapes
from vla_accel_ros.models.weights_check import check_shapes, file_shapes

META_FILE = "model.json"
WEIGHTS_FILE = "model.safetensors"


def recognises(directory: Path, config: dict[str, Any] | None) -> bool:
    return (directory / META_FILE).is_file()


def check_files(directory: Path, config: dict[str, Any] | None, unnorm_key: str = "") -> None:
    """``model.json`` a JSON object, every safetensors file complete, and ``model.safetensors``
    holding the shapes its ``config`` implies (read from the header, before a network is built;
    a config that does not parse is named by the loader)."""
    if unnorm_key:
        raise SettingError(f"{directory}: the package's own VLA has one set of statistics; unnorm_key does not apply",
                           "unnorm_key")
    meta = read_json_object(directory / META_FILE)
    for path in sorted(directory.glob("*.safetensors")):
        check_safetensors(path)
    weights = directory / WEIGHTS_FILE
    try:
        vla_config = VLAConfig.from_dict(meta["config"])
    except (KeyError, TypeError, ValueError):
        return
    if weights.is_file():
        check_shapes(file_shapes([weights]), expected_shapes(vla_config, directory / META_FILE), weights)


FAMILY = Family(
    name="own", marker=META_FILE, recognises=recognises, order=10,
    loader="vla_accel_ros.models.own.checkpoint:load_resolved",
    checker="vla_accel_ros.models.own.family:check_files",
    capabilities=("token_scoring", "draft_head", "parallel_draft_head", "contact_head", "flow_head",
                  "incremental_prefill", "batched_passes"),
    run_defaults=TRAINED_HERE,
)
