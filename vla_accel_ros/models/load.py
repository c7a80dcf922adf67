"""One loader for every kind of policy checkpoint: the package's own (safetensors + JSON) or,
named ``hf:DIR``, a Hugging Face VLA with OpenVLA's action tokens (:mod:`.hf_vla`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.configuration import checkpoint_directory, is_hf_checkpoint


def load_policy(source: str | Path, *, unnorm_key: str = "") -> Any:
    """The policy ``source`` names: a :class:`~vla_accel_ros.models.own.policy.Policy` or an
    :class:`~vla_accel_ros.models.hf.hf_vla.HFTokenVLA` (``unnorm_key``: its statistics' dataset; empty
    = the only one); ValueError (a CheckpointError for the package's format) naming the file at fault."""
    if is_hf_checkpoint(source):
        from vla_accel_ros.models.hf.hf_vla import load_hf_vla

        return load_hf_vla(checkpoint_directory(source), unnorm_key=unnorm_key or None)
    from vla_accel_ros.models.own.checkpoint import load_checkpoint

    return load_checkpoint(Path(source))
