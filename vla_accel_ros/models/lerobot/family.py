"""The LeRobot family's registration: a policy directory, ``config.json`` with a policy ``type``
beside ``policy_preprocessor.json`` (SmolVLA, π0, π0.5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.core.errors import SettingError
from vla_accel_ros.models.api import Family
from vla_accel_ros.models.files import CONFIG_FILE

WEIGHTS_FILE = "model.safetensors"


def recognises(directory: Path, config: dict[str, Any] | None) -> bool:
    return config is not None and "type" in config and (directory / "policy_preprocessor.json").is_file()


def check_files(directory: Path, config: dict[str, Any] | None, unnorm_key: str = "") -> None:
    """``config.json`` of a supported type, ``model.safetensors`` complete and holding the shapes
    the config implies (read from its header: refused before a network of the config's size is
    built)."""
    from vla_accel_ros.models.lerobot.config import parse_config
    from vla_accel_ros.models.lerobot.shapes import check_weight_shapes

    if unnorm_key:
        raise SettingError(f"{directory}: a LeRobot policy has one set of statistics; unnorm_key does not apply",
                           "unnorm_key")
    parsed = parse_config(directory / CONFIG_FILE, config or {})
    if not (directory / WEIGHTS_FILE).is_file():
        raise ValueError(f"{directory / WEIGHTS_FILE}: missing (the policy's weights)")
    check_weight_shapes(parsed, directory / WEIGHTS_FILE)  # reads the header, so a truncated file is named too


FAMILY = Family(
    name="lerobot", marker="config.json with a policy type beside policy_preprocessor.json (SmolVLA, pi0, pi05)",
    recognises=recognises, order=50,
    loader="vla_accel_ros.models.lerobot.checkpoint:load_resolved",
    checker="vla_accel_ros.models.lerobot.family:check_files",
    devices=("cpu", "cuda"), dtypes=("float32", "bfloat16"),
    capabilities=("flow_head", "flow_chunks", "chunk_guidance", "incremental_prefill"),
    options=("tokenizer_dir",),
)
