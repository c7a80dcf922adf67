"""The tensor shapes a token VLA's ``config.json`` implies, compared with its safetensors headers
before transformers or OpenVLA's loader builds a module (torch-free;
:mod:`vla_accel_ros.models.weights_check`).

- The language model (every token VLA): ``text_config``'s ``hidden_size``, ``intermediate_size``,
  ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``vocab_size`` and
  ``num_hidden_layers``, on the Llama-style stack whose ``embed_tokens`` the headers hold
  (``model.language_model.``, ``language_model.model.`` ...). A field the file leaves out is not
  compared (transformers' default for it is a model's own, not this one's).
- A Llava-style vision tower (``vision_config``): its width, MLP width, patch and depth, and the
  projector between it and the language model.
- OpenVLA's projector: its output is the language model's width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.files import CONFIG_FILE
from vla_accel_ros.models.weights_check import ExpectedShapes, StoredShapes, check_shapes, directory_shapes


def _int_field(section: dict[str, Any], key: str) -> int | None:
    value = section.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _prefix_of(stored: StoredShapes, suffix: str, containing: str) -> str | None:
    """The prefix of the first stored name ending with ``suffix`` whose prefix contains ``containing``."""
    for name in sorted(stored.shapes):
        if name.endswith(suffix) and containing in name[: -len(suffix)]:
            return name[: -len(suffix)]
    return None


def language_model_shapes(expected: ExpectedShapes, stored: StoredShapes, config: dict[str, Any]) -> int | None:
    """Add the language model's expected shapes (module docstring); its width when the config gives it."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return None
    prefix = _prefix_of(stored, "embed_tokens.weight", "language_model")
    if prefix is None:
        return None  # the loader names the missing embedding
    hidden = _int_field(text, "hidden_size")
    heads = _int_field(text, "num_attention_heads")
    kv_heads = _int_field(text, "num_key_value_heads") or heads
    head_dim = _int_field(text, "head_dim") or (hidden // heads if hidden and heads else None)
    mlp = _int_field(text, "intermediate_size")
    layers = _int_field(text, "num_hidden_layers")
    vocab = _int_field(text, "vocab_size")
    if vocab is not None:
        expected.add(prefix + "embed_tokens.weight", (vocab, None), "text_config.vocab_size")
    if hidden is not None:
        expected.add(prefix + "embed_tokens.weight", (None, hidden), "text_config.hidden_size")
    if layers is not None:
        expected.add_depth(prefix + "layers.", layers, "text_config.num_hidden_layers")
    q_out = heads * head_dim if heads and head_dim else None
    kv_out = kv_heads * head_dim if kv_heads and head_dim else None
    for i in range(stored.count(prefix + "layers.")):
        layer = f"{prefix}layers.{i}."
        for name, rows, rows_field in (("self_attn.q_proj", q_out, "text_config.num_attention_heads"),
                                       ("self_attn.k_proj", kv_out, "text_config.num_key_value_heads"),
                                       ("self_attn.v_proj", kv_out, "text_config.num_key_value_heads"),
                                       ("mlp.gate_proj", mlp, "text_config.intermediate_size"),
                                       ("mlp.up_proj", mlp, "text_config.intermediate_size")):
            expected.add(layer + name + ".weight", (rows, None), rows_field, required=False)
            expected.add(layer + name + ".weight", (None, hidden), "text_config.hidden_size", required=False)
        expected.add(layer + "mlp.down_proj.weight", (hidden, mlp), "text_config.hidden_size/intermediate_size",
                     required=False)
    return hidden


def vision_tower_shapes(expected: ExpectedShapes, stored: StoredShapes, config: dict[str, Any],
                        text_hidden: int | None) -> None:
    """Add a Llava-style vision tower's and projector's expected shapes (module docstring)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return
    prefix = _prefix_of(stored, "embeddings.patch_embedding.weight", "vision_tower")
    hidden = _int_field(vision, "hidden_size")
    if prefix is not None:
        patch = _int_field(vision, "patch_size")
        expected.add(prefix + "embeddings.patch_embedding.weight", (hidden, None, patch, patch),
                     "vision_config.hidden_size/patch_size")
        layers = _int_field(vision, "num_hidden_layers")
        if layers is not None:
            expected.add_depth(prefix + "encoder.layers.", layers, "vision_config.num_hidden_layers")
        mlp = _int_field(vision, "intermediate_size")
        expected.add(prefix + "encoder.layers.0.mlp.fc1.weight", (mlp, hidden),
                     "vision_config.hidden_size/intermediate_size", required=False)
    projector = _prefix_of(stored, "linear_1.weight", "multi_modal_projector")
    if projector is not None:
        expected.add(projector + "linear_2.weight", (text_hidden, None), "text_config.hidden_size", required=False)


def openvla_projector_shapes(expected: ExpectedShapes, stored: StoredShapes, text_hidden: int | None) -> None:
    """OpenVLA's projector (``projector.fc*``): its last layer's output is the language model's width."""
    last = max((name for name in stored.shapes if name.startswith("projector.fc") and name.endswith(".weight")),
               default=None)
    if last is not None:
        expected.add(last, (text_hidden, None), "text_config.hidden_size")


def token_vla_shapes(directory: Path, config: dict[str, Any] | None) -> tuple[StoredShapes, ExpectedShapes, int | None]:
    """The weights' stored shapes, the shapes ``config`` implies for them, and the language model's
    width (None where the config does not give it)."""
    stored = directory_shapes(directory)
    expected = ExpectedShapes(directory / CONFIG_FILE)
    if config is None:
        return stored, expected, None
    hidden = language_model_shapes(expected, stored, config)
    vision_tower_shapes(expected, stored, config, hidden)
    openvla_projector_shapes(expected, stored, hidden)
    return stored, expected, hidden


def check_token_vla_shapes(directory: Path, config: dict[str, Any] | None) -> None:
    """ValueError in one line (the tensor, both shapes, the config field) unless the weights in
    ``directory`` hold the shapes ``config`` implies."""
    stored, expected, _ = token_vla_shapes(directory, config)
    check_shapes(stored, expected, directory)
