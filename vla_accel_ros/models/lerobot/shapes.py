"""The tensor shapes a LeRobot policy's ``config.json`` implies, compared with ``model.safetensors``'s
header before any network is built (torch-free; :mod:`vla_accel_ros.models.weights_check`).

Names are the file's without LeRobot's ``model.`` prefix (files converted from openpi lack it).
π0 and π0.5: the Gemma sizes ``paligemma_variant`` and ``action_expert_variant`` name (every
layer's attention and MLP projections, the embedding's width, the projector's output), the
tower's position count at ``image_resolution``, and the policy's projections (``max_state_dim``,
``max_action_dim``). SmolVLA: the VLM's width is the file's own (its config is not in the
directory); the layers ``num_vlm_layers`` and ``num_expert_layers`` count, the expert's width
(``expert_width_multiplier``), which expert layers cross-attend (``attention_mode``,
``self_attn_every_n_layers``), and the projections.
"""

from __future__ import annotations

from pathlib import Path

from vla_accel_ros.models.lerobot.config import GEMMA_VARIANTS, GemmaVariant, LeRobotConfig, intermediate_size
from vla_accel_ros.models.weights_check import ExpectedShapes, StoredShapes, check_shapes, file_shapes

PALIGEMMA = "paligemma_with_expert.paligemma.model."
GEMMA_EXPERT = "paligemma_with_expert.gemma_expert.model."
SIGLIP = PALIGEMMA + "vision_tower.vision_model."
SMOL_TEXT = "vlm_with_expert.vlm.model.text_model."
SMOL_EXPERT = "vlm_with_expert.lm_expert."


def check_weight_shapes(config: LeRobotConfig, weights: Path) -> None:
    """ValueError in one line (the tensor, both shapes, the config field) unless ``weights``'s
    header holds the shapes ``config`` implies."""
    stored = file_shapes([weights]).renamed(strip="model.")
    expected = paligemma_shapes(config, stored) if config.paligemma else smolvla_shapes(config, stored)
    check_shapes(stored, expected, weights)


def _gemma_layers(expected: ExpectedShapes, prefix: str, variant: GemmaVariant, config_field: str) -> None:
    expected.add_depth(f"{prefix}layers.", variant.depth, config_field)
    width, heads, kv = variant.width, variant.num_heads * variant.head_dim, variant.num_kv_heads * variant.head_dim
    for i in range(variant.depth):
        layer = f"{prefix}layers.{i}."
        for name, shape in (("self_attn.q_proj", (heads, width)), ("self_attn.k_proj", (kv, width)),
                            ("self_attn.v_proj", (kv, width)), ("self_attn.o_proj", (width, heads)),
                            ("mlp.gate_proj", (variant.mlp_dim, width)), ("mlp.up_proj", (variant.mlp_dim, width)),
                            ("mlp.down_proj", (width, variant.mlp_dim))):
            expected.add(f"{layer}{name}.weight", shape, config_field)


def paligemma_shapes(config: LeRobotConfig, stored: StoredShapes) -> ExpectedShapes:
    """π0's and π0.5's expected shapes (module docstring); the patch size is the file's own."""
    vlm, expert = GEMMA_VARIANTS[config.paligemma_variant], GEMMA_VARIANTS[config.action_expert_variant]
    vlm_field = f"paligemma_variant {config.paligemma_variant!r}"
    expert_field = f"action_expert_variant {config.action_expert_variant!r}"
    expected = ExpectedShapes(config.path)
    patch = stored.shapes.get(SIGLIP + "embeddings.patch_embedding.weight", (0, 0, 0))[2:3]
    if patch and patch[0] > 0:
        side = config.image_resolution[0] // patch[0]
        expected.add(SIGLIP + "embeddings.position_embedding.weight", (side * side, None),
                     f"image_resolution {list(config.image_resolution)} (patch {patch[0]})")
    expected.add(PALIGEMMA + "language_model.embed_tokens.weight", (None, vlm.width), vlm_field, required=False)
    expected.add(PALIGEMMA + "multi_modal_projector.linear.weight", (vlm.width, None), vlm_field)
    width = expert.width
    expected.add("action_in_proj.weight", (width, None), expert_field)
    expected.add("action_in_proj.weight", (None, config.max_action_dim), "max_action_dim")
    expected.add("action_out_proj.weight", (config.max_action_dim, None), "max_action_dim")
    expected.add("action_out_proj.weight", (None, width), expert_field)
    if config.type == "pi05":
        expected.add("time_mlp_in.weight", (width, width), expert_field)
    else:
        expected.add("state_proj.weight", (width, None), expert_field)
        expected.add("state_proj.weight", (None, config.max_state_dim), "max_state_dim")
        expected.add("action_time_mlp_in.weight", (width, 2 * width), expert_field)
    _gemma_layers(expected, PALIGEMMA + "language_model.", vlm, vlm_field)
    _gemma_layers(expected, GEMMA_EXPERT, expert, expert_field)
    return expected


def smolvla_shapes(config: LeRobotConfig, stored: StoredShapes) -> ExpectedShapes:
    """SmolVLA's expected shapes (module docstring): the VLM's width and key/value width are the
    file's own, read from its embedding and first layer."""
    expected = ExpectedShapes(config.path)
    embedding = stored.shapes.get(SMOL_TEXT + "embed_tokens.weight")
    first_k = stored.shapes.get(SMOL_TEXT + "layers.0.self_attn.k_proj.weight")
    if embedding is None or first_k is None or len(embedding) != 2:
        return expected  # the loader names the missing tensor; nothing here to size the rest by
    width, kv_width = embedding[1], first_k[0]
    vlm_layers = config.num_vlm_layers if config.num_vlm_layers > 0 else stored.count(SMOL_TEXT + "layers.")
    expected.add(f"{SMOL_TEXT}layers.{vlm_layers - 1}.self_attn.q_proj.weight", (None, width),
                 f"num_vlm_layers {config.num_vlm_layers}")
    expert_width = int(width * config.expert_width_multiplier)
    width_field = f"expert_width_multiplier {config.expert_width_multiplier}"
    expert_layers = config.num_expert_layers if config.num_expert_layers > 0 else vlm_layers
    layers_field = f"num_expert_layers {config.num_expert_layers}"
    expected.add("state_proj.weight", (None, config.max_state_dim), "max_state_dim")
    expected.add("action_in_proj.weight", (expert_width, None), width_field)
    expected.add("action_in_proj.weight", (None, config.max_action_dim), "max_action_dim")
    expected.add("action_out_proj.weight", (config.max_action_dim, expert_width), "max_action_dim")
    expected.add("action_time_mlp_in.weight", (expert_width, 2 * expert_width), width_field)
    expected.add(f"{SMOL_EXPERT}layers.{expert_layers - 1}.input_layernorm.weight", (expert_width,), layers_field)
    expected.add_depth(f"{SMOL_TEXT}layers.", vlm_layers, f"num_vlm_layers {config.num_vlm_layers}")
    expected.add_depth(f"{SMOL_EXPERT}layers.", expert_layers, layers_field)
    n = config.self_attn_every_n_layers
    cross = "cross" in config.attention_mode
    for i in range(expert_layers):
        layer = f"{SMOL_EXPERT}layers.{i}."
        expected.add(f"{layer}mlp.gate_proj.weight", (intermediate_size(expert_width), expert_width),
                     width_field)
        reads_vlm = cross and not (n > 0 and i % n == 0)
        expected.add(f"{layer}self_attn.k_proj.weight", (kv_width, kv_width if reads_vlm else expert_width),
                     f"attention_mode {config.attention_mode!r} with self_attn_every_n_layers {n}")
    return expected
