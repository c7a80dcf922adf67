"""The one place that picks a LeRobot policy's networks by its ``type``: SmolVLA's
(:mod:`.smolvla`), π0's (:mod:`.pi0`) or π0.5's (:mod:`.pi05`), built to the checkpoint's sizes
(:func:`build_model`), its weights put in place (:func:`load_model`), and a flow step's velocity
through whichever it is (:func:`model_velocity`).

SmolVLA's sizes come from ``config.json`` and SmolVLM2's config (which the directory does not hold:
it is read from the tokenizer's folder or the Hugging Face cache); π0's and π0.5's vision tower,
projector and vocabulary from the weights' shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vla_accel_ros.models.lerobot.config import LeRobotConfig
from vla_accel_ros.models.lerobot.processor import pretrained_source
from vla_accel_ros.models.lerobot.weights import WEIGHTS_FILE, assign, pi0_float32_names, read_tensors


def vlm_config(config: LeRobotConfig, tokenizer_dir: Path | None) -> Any:
    """SmolVLM's config (not in the policy directory): from ``tokenizer_dir`` or the hub cache."""
    from transformers import AutoConfig

    source, kwargs = pretrained_source(config.vlm_model_name, tokenizer_dir, "VLM config")
    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"VLM config {config.vlm_model_name!r}: cannot load it from {source} "
                         f"({str(error).splitlines()[0]})") from None


def paligemma_family_model(config: Any, paligemma_config: Any, expert_config: Any) -> Any:
    """π0's or π0.5's networks, as ``config.type`` names them."""
    from vla_accel_ros.models.lerobot.pi0 import Pi0Model
    from vla_accel_ros.models.lerobot.pi05 import Pi05Model

    model_class = Pi05Model if config.type == "pi05" else Pi0Model
    return model_class(config, paligemma_config, expert_config)


def build_model(config: LeRobotConfig, tensors: dict[str, torch.Tensor], tokenizer_dir: Path | None) -> Any:
    """The family's model with random weights, its sizes from the config (and for π0 and π0.5 the
    weights)."""
    if config.type == "smolvla":
        from vla_accel_ros.models.lerobot.smolvla import SmolVLAModel

        return SmolVLAModel(config, vlm_config(config, tokenizer_dir))
    from vla_accel_ros.models.lerobot.pi0 import VisionShape, build_configs

    path = config.path.parent / WEIGHTS_FILE
    tower = "paligemma.vision_tower.vision_model."
    try:
        patch = tensors[f"{tower}embeddings.patch_embedding.weight"]
        fc1 = tensors[f"{tower}encoder.layers.0.mlp.fc1.weight"]
        positions = tensors[f"{tower}embeddings.position_embedding.weight"].shape[0]
        projector = tensors["paligemma.multi_modal_projector.linear.weight"]
        vocab = tensors["paligemma.language_model.embed_tokens.weight"].shape[0]
    except KeyError as error:
        raise ValueError(f"{path}: no tensor {error.args[0]}") from None
    layers = len({name.split(".")[5] for name in tensors if name.startswith(f"{tower}encoder.layers.")})
    side = int(round(positions ** 0.5)) * int(patch.shape[2])
    if side != config.image_resolution[0]:
        raise ValueError(f"{path}: the vision tower takes {side} px images; config.json's image_resolution is "
                         f"{config.image_resolution[0]}")
    vision = VisionShape(int(patch.shape[0]), layers, int(fc1.shape[0]), int(patch.shape[2]), side,
                         int(projector.shape[0]))
    return paligemma_family_model(config, *build_configs(config, vision, int(vocab)))


def load_model(directory: Path, config: LeRobotConfig, dtype: torch.dtype | None, tokenizer_dir: Path | None) -> Any:
    """The model of the policy directory ``directory`` with its weights, in ``dtype`` (None: as
    saved) but for the parts the original keeps in float32; ValueError naming the file at fault."""
    tensors = read_tensors(directory, config.type)
    model = build_model(config, tensors, tokenizer_dir)
    keep = model.float32_names() if config.type == "smolvla" else pi0_float32_names(model)
    assign(model, tensors, directory, dtype, keep)
    if config.paligemma:
        model.round_rope_like_lerobot()
    return model


def model_velocity(model: Any, prefix: Any, state: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A SmolVLA, π0 or π0.5 model's velocity over a computed prefix (π0 reads the state in the suffix)."""
    if model.config.type == "smolvla":
        return model.velocity(prefix, x, t)
    return model.velocity(prefix, state, x, t)
