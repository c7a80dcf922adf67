"""The OpenVLA-OFT family's registration: an OpenVLA directory with an action head beside it
(``action_head--<step>_checkpoint.*``), tried before the OpenVLA family it extends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.api import Family
from vla_accel_ros.models.files import check_safetensors, check_weights
from vla_accel_ros.models.oft.weights import find_components, has_action_head


def recognises(directory: Path, config: dict[str, Any] | None) -> bool:
    return config is not None and config.get("model_type") == "openvla" and has_action_head(directory)


def check_files(directory: Path, config: dict[str, Any] | None, unnorm_key: str = "") -> None:
    """Safetensors weights, every shard their index names present and complete, and the components
    converted to safetensors (:mod:`.weights`)."""
    check_weights(directory)
    for path in find_components(directory).values():
        check_safetensors(path)


FAMILY = Family(
    name="oft", marker='config.json with model_type "openvla" and an action_head--<step>_checkpoint file (OpenVLA-OFT)',
    recognises=recognises, order=30,
    loader="vla_accel_ros.models.oft.checkpoint:load_resolved",
    checker="vla_accel_ros.models.oft.family:check_files",
    devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"),
    capabilities=("action_chunk",), options=("unnorm_key",),
)
