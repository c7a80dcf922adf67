"""The OpenVLA family's registration: ``config.json`` with ``model_type: "openvla"`` (openvla-7b and
its fine-tunes, as published)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.api import Family
from vla_accel_ros.models.token_vla.checks import TOKEN_VLA_CAPABILITIES, TOKEN_VLA_OPTIONS


def recognises(directory: Path, config: dict[str, Any] | None) -> bool:
    return config is not None and config.get("model_type") == "openvla"


FAMILY = Family(
    name="openvla", marker='config.json with model_type "openvla" (openvla-7b and its fine-tunes)',
    recognises=recognises, order=40,
    loader="vla_accel_ros.models.openvla.checkpoint:load_resolved",
    checker="vla_accel_ros.models.token_vla.checks:check_token_vla_files",
    devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"),
    capabilities=TOKEN_VLA_CAPABILITIES, options=TOKEN_VLA_OPTIONS,
)
