"""A LeRobot policy's ``model.safetensors``, its names mapped onto this package's modules.

LeRobot saves the policy's state dict under ``model.``; ours drops the wrappers:

- SmolVLA: ``model.vlm_with_expert.vlm.model.*`` (SmolVLM's vision tower, connector, text layers)
  -> ``vlm.*``; ``model.vlm_with_expert.lm_expert.*`` -> ``expert.*``; the projections
  (``model.state_proj`` ...) keep their names; the VLM's ``lm_head`` is never read.
- π0 and π0.5: ``model.paligemma_with_expert.paligemma.model.*`` -> ``paligemma.*``;
  ``model.paligemma_with_expert.gemma_expert.model.*`` -> ``expert.*``; both ``lm_head``\\ s are never
  read, except that PaliGemma's stands in for the tied embedding when the file kept only it.
  Files converted from openpi without the ``model.`` prefix are read the same way.

Every tensor keeps the dtype it was saved in (a bfloat16 VLM beside float32 projections computes
as LeRobot computes it) unless a dtype is asked for; a missing tensor or a shape that differs from
what the config implies is refused, naming the file and the tensor.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vla_accel_ros.models.lerobot.config import PALIGEMMA_TYPES

WEIGHTS_FILE = "model.safetensors"
_PALIGEMMA_PREFIXES = (("paligemma_with_expert.paligemma.model.", "paligemma."),
                       ("paligemma_with_expert.gemma_expert.model.", "expert."))
PREFIXES = {
    "smolvla": (("vlm_with_expert.vlm.model.", "vlm."), ("vlm_with_expert.lm_expert.", "expert.")),
    "pi0": _PALIGEMMA_PREFIXES,
    "pi05": _PALIGEMMA_PREFIXES,
}
PI0_TIED = ("paligemma_with_expert.paligemma.lm_head.weight", "paligemma.language_model.embed_tokens.weight")
SIGLIP_TOWER = "paligemma.vision_tower."
# LeRobot's bfloat16 rule for π0: these stay float32
PI0_FLOAT32_PARTS = ("vision_tower", "multi_modal_projector", "input_layernorm", "post_attention_layernorm", "norm.")


def read_tensors(directory: Path, kind: str) -> dict[str, torch.Tensor]:
    """The file's tensors under our names (module docstring); ValueError naming the file."""
    from safetensors import safe_open

    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise ValueError(f"{path}: missing (the policy's weights)")
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for stored in handle.keys():
                name = stored.removeprefix("model.")
                if name == PI0_TIED[0] and kind in PALIGEMMA_TYPES:
                    tensors.setdefault(PI0_TIED[1], handle.get_tensor(stored))
                    continue
                for published, ours in PREFIXES[kind]:
                    if name.startswith(published):
                        name = ours + name[len(published):]
                        break
                tensors[name] = handle.get_tensor(stored)
    except (OSError, RuntimeError) as error:  # safetensors' own errors are plain exceptions
        raise ValueError(f"{path}: cannot read it as safetensors ({error})") from None
    return tensors


def target_dtype(name: str, stored: torch.dtype, dtype: torch.dtype | None, keep_float32: set[str]) -> torch.dtype:
    """The dtype a parameter runs in: as stored, or ``dtype`` except where LeRobot keeps float32
    (``keep_float32``: the policy's projections, and the model's own exceptions)."""
    if dtype is None:
        return stored
    if dtype != torch.float32 and (name in keep_float32 or not name.startswith(("vlm.", "expert.", "paligemma."))):
        return torch.float32
    return dtype


def pi0_float32_names(model: nn.Module) -> set[str]:
    """π0's and π0.5's parameters LeRobot keeps in float32 in a bfloat16 model: the tower, the
    projector, the norms (π0.5's adaptive ones with their projections)."""
    return {name for name, _ in model.named_parameters() if any(part in name for part in PI0_FLOAT32_PARTS)}


def assign(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None,
           keep_float32: set[str]) -> None:
    """Every parameter of ``model`` from ``tensors`` (shape-checked, in its target dtype)."""
    for name, parameter in model.named_parameters():
        tensor = tensors.get(name)
        if tensor is None and name.startswith(SIGLIP_TOWER):  # transformers releases differ in the wrapper
            tensor = tensors.get(SIGLIP_TOWER + "vision_model." + name[len(SIGLIP_TOWER):])
        if tensor is None:
            raise ValueError(f"{path / WEIGHTS_FILE}: no tensor for {name} (expected shape "
                             f"{tuple(parameter.shape)})")
        if tuple(tensor.shape) != tuple(parameter.shape):
            raise ValueError(f"{path / WEIGHTS_FILE}: {name} has shape {tuple(tensor.shape)}; the config implies "
                             f"{tuple(parameter.shape)}")
        parameter.data = tensor.to(target_dtype(name, tensor.dtype, dtype, keep_float32))
    model.eval()
    model.requires_grad_(False)
