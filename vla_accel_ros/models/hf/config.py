"""A Llava-style Hugging Face VLA's ``config.json``: what makes one (a ``vision_config`` and an image
token), checked before anything loads (:func:`llava_config`), and the transformers config made of
the parsed file (:func:`transformers_config`), which the loader hands to transformers so that it
never reads the file again. Torch-free: transformers is imported when a config is made."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vla_accel_ros.core.robot_record import META_FILE as OWN_META_FILE
from vla_accel_ros.models.files import CONFIG_FILE

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


def is_llava_style(config: dict[str, Any] | None) -> bool:
    """Whether a parsed ``config.json`` is a Llava-style VLA's: a ``vision_config`` and an image token."""
    return (config is not None and isinstance(config.get("vision_config"), dict)
            and (config.get("image_token_id") is not None or config.get("image_token_index") is not None))


def llava_config(directory: Path, config: dict[str, Any] | None) -> dict[str, Any]:
    """``config``, the ``config.json`` of ``directory`` as parsed (None: there is none), once it is a
    Llava-style VLA's that transformers loads without remote code; ValueError naming the file
    otherwise (an own-family directory says so)."""
    path = directory / CONFIG_FILE
    if config is None:
        if (directory / OWN_META_FILE).is_file():
            raise ValueError(f"{directory}: a checkpoint of the own family ({OWN_META_FILE}), where this command "
                             f"needs a Hugging Face VLA ({CONFIG_FILE})")
        raise ValueError(f"{path}: missing; not a Hugging Face model directory")
    if not is_llava_style(config):
        raise ValueError(f"{path}: not a VLA this loader runs: no vision_config and image token "
                         "(image_token_index); the model must load as AutoModelForImageTextToText (e.g. Llava) "
                         "without remote code")
    return config


def transformers_config(directory: Path, config: dict[str, Any], dtype: torch.dtype | None = None) -> PretrainedConfig:
    """The transformers config of ``model_type`` made of the parsed ``config.json`` of ``directory``,
    as ``AutoConfig.from_pretrained(directory, dtype=dtype)`` makes it from the file (``config`` is
    left as it is); ValueError naming the file when transformers has no such model type."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(f"{directory}: the model cannot be loaded as an image-text-to-text model ({CONFIG_FILE}: "
                         f"model_type {model_type!r} is not one transformers knows)")
    config_class = CONFIG_MAPPING[model_type]
    extra: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    made: PretrainedConfig = config_class.from_dict(copy.deepcopy(config), name_or_path=str(directory), **extra)
    return made
