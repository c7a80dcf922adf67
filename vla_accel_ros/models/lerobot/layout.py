"""Writes a SmolVLA policy directory in LeRobot's published layout: ``config.json``, the weights in
``model.safetensors`` under LeRobot's names, and the processor pipelines with their statistics
(``policy_preprocessor.json`` + its normaliser's safetensors, ``policy_postprocessor.json`` + its
unnormaliser's). What :func:`~vla_accel_ros.models.lerobot.checkpoint.load_lerobot` reads back.

The pipelines hold the steps LeRobot's SmolVLA writes, in its order: the tokenizer step names the
tokenizer (``tokenizer_name``), the normaliser the features and their modes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from vla_accel_ros.models.lerobot.processor import POSTPROCESSOR, PREPROCESSOR
from vla_accel_ros.models.lerobot.weights import PREFIXES, SIGLIP_TOWER, WEIGHTS_FILE

NORMALIZER_FILE = "policy_preprocessor_step_5_normalizer_processor.safetensors"
UNNORMALIZER_FILE = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"


def published_state_dict(model: torch.nn.Module, kind: str = "smolvla") -> dict[str, torch.Tensor]:
    """``model``'s tensors under the names LeRobot saves (the inverse of :func:`.weights.read_tensors`)."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name.startswith(SIGLIP_TOWER) and not name.startswith(SIGLIP_TOWER + "vision_model."):
            name = SIGLIP_TOWER + "vision_model." + name[len(SIGLIP_TOWER):]  # the SigLIP wrapper LeRobot's names keep
        for published, ours in PREFIXES[kind]:
            if name.startswith(ours):
                name = published + name[len(ours):]
                break
        out["model." + name] = tensor.detach().contiguous()
    return out


def _pipelines(config: dict[str, Any], tokenizer_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    features = {**config["input_features"], **config["output_features"]}
    norm_map = config["normalization_mapping"]
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    pre = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "smolvla_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor", "config": {
            "max_length": config["tokenizer_max_length"], "task_key": "task", "padding_side": "right",
            "padding": config.get("pad_language_to", "longest"), "truncation": True,
            "tokenizer_name": tokenizer_name}},
        device,
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8, "features": features, "norm_map": norm_map},
         "state_file": NORMALIZER_FILE}]}
    post = {"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor", "config": {
            "eps": 1e-8, "features": {"action": config["output_features"]["action"]}, "norm_map": norm_map},
         "state_file": UNNORMALIZER_FILE},
        device]}
    return pre, post


def write_policy_directory(directory: Path, config: dict[str, Any], model: torch.nn.Module,
                           statistics: dict[str, dict[str, torch.Tensor]], tokenizer_name: str) -> Path:
    """``directory`` holding ``config`` (a SmolVLA ``config.json``), ``model``'s weights and the
    pipelines with ``statistics`` ({feature: {stat: tensor}}, e.g. ``observation.state`` ->
    ``mean``/``std``)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    save_file(published_state_dict(model, config["type"]), str(directory / WEIGHTS_FILE))
    flat = {f"{feature}.{stat}": value.to(torch.float32).contiguous()
            for feature, stats in statistics.items() for stat, value in stats.items()}
    pre, post = _pipelines(config, tokenizer_name)
    save_file(flat, str(directory / NORMALIZER_FILE))
    save_file({k: v for k, v in flat.items() if k.startswith("action.")}, str(directory / UNNORMALIZER_FILE))
    (directory / PREPROCESSOR).write_text(json.dumps(pre, indent=1))
    (directory / POSTPROCESSOR).write_text(json.dumps(post, indent=1))
    return directory
