"""LeRobot's flow VLAs at their published shapes with random weights, made directly on the device:
what ``vla-accel cost`` times for ``smolvla``, ``pi0`` and ``pi05``.

SmolVLA = SmolVLM2-500M's vision tower (768 wide, 12 layers, 512 px, patch 16, pixel shuffle 4: 64
tokens per camera) and its first 16 text layers (960 wide, 15 heads, 5 kv heads, head_dim 64), an
expert 0.75 x as wide; π0 = SigLIP so400m/14 at 224 px, Gemma 2B and a Gemma-300M expert (18 layers
each), π0.5 the same with its adaptive expert norms. All take 3 cameras and a chunk of 50; SmolVLA
and π0 48 language tokens, π0.5 200 (its default, the prompt carrying the state). The text stacks
(VLM and expert) in ``dtype``, the towers, projections and norms in float32, as the policies run
them; ``layers`` builds that many text layers (0: the real depth), ``tower_layers`` that many
vision-tower layers (0: the published depth; fewer make a model small enough for a quick check).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vla_accel_ros.models.lerobot.config import GEMMA_VARIANTS, SUPPORTED_TYPES, parse_config

FLOW_FAMILIES = SUPPORTED_TYPES
SMOLVLA_LAYERS = 16
N_CAMERAS = 3


def raw_config(kind: str, layers: int) -> dict[str, Any]:
    """The policy's ``config.json`` content at the published shape (the type's prompt length)."""
    cameras = {f"observation.images.camera{i + 1}": {"type": "VISUAL", "shape": [3, 256, 256]}
               for i in range(N_CAMERAS)}
    raw: dict[str, Any] = {"type": kind, "input_features": {"observation.state": {"type": "STATE", "shape": [6]},
                                                            **cameras},
                           "output_features": {"action": {"type": "ACTION", "shape": [6]}}}
    if kind == "smolvla":
        raw.update(num_vlm_layers=layers or SMOLVLA_LAYERS, num_expert_layers=0, pad_language_to="max_length",
                   prefix_length=0)
    return raw


def smolvlm2_500m_config(text_layers: int, tower_layers: int = 0) -> Any:
    """SmolVLM2-500M's config at its published sizes (the hub is not read)."""
    from transformers import SmolVLMConfig

    return SmolVLMConfig(
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=tower_layers or 12,
                           num_attention_heads=12,
                           patch_size=16, image_size=512),
        text_config=dict(model_type="llama", hidden_size=960, intermediate_size=2560, num_hidden_layers=text_layers,
                         num_attention_heads=15, num_key_value_heads=5, head_dim=64, vocab_size=49280,
                         rms_norm_eps=1e-5),
        scale_factor=4)


def real_depth(kind: str) -> int:
    return SMOLVLA_LAYERS if kind == "smolvla" else GEMMA_VARIANTS["gemma_2b"].depth


def build(kind: str, layers: int, device: torch.device, dtype: torch.dtype,
          tower_layers: int | None = None) -> tuple[Any, Any, int]:
    """(model, config, the real text depth): random weights made on ``device``, the text stacks in
    ``dtype`` (module docstring)."""
    tower_layers = tower_layers or 0
    if kind not in FLOW_FAMILIES:
        raise ValueError(f"family {kind!r}: LeRobot's flow families are {', '.join(FLOW_FAMILIES)}")
    depth = real_depth(kind)
    if not 0 <= layers <= depth:
        raise ValueError(f"--layers must be between 1 and {depth} for {kind} (0: all), got {layers}")
    config = parse_config(Path(f"<{kind} published shape>") / "config.json", raw_config(kind, layers))
    with torch.device(device):
        if kind == "smolvla":
            from vla_accel_ros.models.lerobot.smolvla import SmolVLAModel

            model: Any = SmolVLAModel(config, smolvlm2_500m_config(config.num_vlm_layers, tower_layers))
        else:
            from vla_accel_ros.models.lerobot.modules import paligemma_family_model
            from vla_accel_ros.models.lerobot.pi0 import VisionShape, build_configs

            vision = VisionShape(1152, tower_layers or 27, 4304, 14, 224, GEMMA_VARIANTS["gemma_2b"].width)
            model = paligemma_family_model(config, *build_configs(config, vision, 257_152, depth=layers))
    for name, parameter in model.named_parameters():
        if name.startswith(("vlm.", "expert.", "paligemma.")) and not (
                config.paligemma and any(p in name for p in ("vision_tower", "multi_modal_projector", "norm"))):
            parameter.data = parameter.data.to(dtype)
    model.eval().requires_grad_(False)
    return model, config, depth
