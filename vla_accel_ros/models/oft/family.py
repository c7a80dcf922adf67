"""The OpenVLA-OFT family's registration: an OpenVLA directory with an action head beside it
(``action_head--<step>_checkpoint.*``), tried before the OpenVLA family it extends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.api import Family
from vla_accel_ros.models.files import CONFIG_FILE, check_safetensors, check_weights
from vla_accel_ros.models.oft.weights import ACTION_HEAD, find_components, has_action_head
from vla_accel_ros.models.weights_check import ExpectedShapes, StoredShapes, check_shapes, file_shapes


def component_shapes(component: str, stored: StoredShapes, hidden: int, directory: Path) -> ExpectedShapes:
    """What the language model's width (``text_config.hidden_size``) implies for a component: the
    action head reads each action dimension's last hidden state side by side (its input is the width
    times the action dimensions its ``fc2`` gives), the proprio projector writes one token of that width."""
    expected = ExpectedShapes(directory / CONFIG_FILE)
    if component == ACTION_HEAD:
        action_dim = stored.shapes.get("model.fc2.weight", (0,))[0]
        expected.add("model.fc1.weight", (None, hidden * action_dim if action_dim else None), "text_config.hidden_size")
    else:
        expected.add("fc2.weight", (hidden, None), "text_config.hidden_size")
    return expected


def recognises(directory: Path, config: dict[str, Any] | None) -> bool:
    return config is not None and config.get("model_type") == "openvla" and has_action_head(directory)


def check_files(directory: Path, config: dict[str, Any] | None, unnorm_key: str = "") -> None:
    """Safetensors weights, every shard their index names present and complete, and the components
    converted to safetensors (:mod:`.weights`); the language model's and the components' shapes
    as ``config.json`` implies them, from the headers (before a module is built)."""
    from vla_accel_ros.models.token_vla.shapes import token_vla_shapes

    check_weights(directory)
    components = find_components(directory)
    for path in components.values():
        check_safetensors(path)
    stored, expected, hidden = token_vla_shapes(directory, config)
    check_shapes(stored, expected, directory)
    if hidden is None:
        return
    for component, path in components.items():
        stored = file_shapes([path])
        check_shapes(stored, component_shapes(component, stored, hidden, directory), path)


FAMILY = Family(
    name="oft", marker='config.json with model_type "openvla" and an action_head--<step>_checkpoint file (OpenVLA-OFT)',
    recognises=recognises, order=30,
    loader="vla_accel_ros.models.oft.checkpoint:load_resolved",
    checker="vla_accel_ros.models.oft.family:check_files",
    devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"),
    capabilities=("action_chunk",), options=("unnorm_key",),
)
