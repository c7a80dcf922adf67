"""The Hugging Face family's registration: ``config.json`` of a Llava-style VLA (a ``vision_config``
and an image token) with OpenVLA's action tokens; ``hf:DIR`` declares it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.api import Family
from vla_accel_ros.models.files import CONFIG_FILE
from vla_accel_ros.models.token_vla.checks import TOKEN_VLA_CAPABILITIES, TOKEN_VLA_OPTIONS, check_token_vla_files


def recognises(directory: Path, config: dict[str, Any] | None) -> bool:
    return (config is not None and isinstance(config.get("vision_config"), dict)
            and (config.get("image_token_id") is not None or config.get("image_token_index") is not None))


def check_files(directory: Path, config: dict[str, Any] | None, unnorm_key: str = "") -> None:
    """A Llava-style ``config.json``, then the token VLA's checks."""
    if not recognises(directory, config):
        read = f"model_type {config.get('model_type')!r}" if config else "none"
        raise ValueError(f"{directory / CONFIG_FILE}: not a Llava-style VLA (a vision_config and an image token; "
                         f"read: {read})")
    check_token_vla_files(directory, config, unnorm_key)


FAMILY = Family(
    name="hf", marker="config.json of a Llava-style VLA (a vision_config and an image token)",
    recognises=recognises, order=20,
    loader="vla_accel_ros.models.hf.checkpoint:load_resolved",
    checker="vla_accel_ros.models.hf.family:check_files",
    devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"),
    capabilities=TOKEN_VLA_CAPABILITIES, options=TOKEN_VLA_OPTIONS,
)
