"""What the token VLA families share in their registrations: capabilities, options, and the checks of
their files that need no model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.files import check_weights

TOKEN_VLA_CAPABILITIES = ("token_scoring", "draft_head", "incremental_prefill")
TOKEN_VLA_OPTIONS = ("unnorm_key", "draft", "draft_head")


def check_token_vla_files(directory: Path, config: dict[str, Any] | None, unnorm_key: str = "") -> None:
    """Safetensors weights, every shard their index names present and each file complete, holding
    the shapes ``config`` implies (from the headers, before a module is built), and the action
    statistics of ``unnorm_key`` (empty: the file's only dataset)."""
    from vla_accel_ros.models.token_vla.shapes import check_token_vla_shapes
    from vla_accel_ros.models.token_vla.spec import load_spec, with_overrides
    from vla_accel_ros.models.token_vla.statistics import load_action_statistics

    check_weights(directory)
    check_token_vla_shapes(directory, config)
    spec = with_overrides(load_spec(directory, config), unnorm_key=unnorm_key or None)
    load_action_statistics(directory, spec, config)
