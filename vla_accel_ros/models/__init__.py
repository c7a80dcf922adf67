"""Policy models: the target VLA, the EAGLE-style draft head and its parallel variant, the contact
head, the world-aware prefill and checkpoint I/O.

The names below load on first use (PEP 562), so that the torch-free modules of this package
(``configuration``, ``sampling``, ``tokenizer``) import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vla_accel_ros.models.checkpoint import (
        CheckpointError,
        load_checkpoint,
        save_checkpoint,
    )
    from vla_accel_ros.models.draft import ContactHead, DraftHead, ParallelDraftHead
    from vla_accel_ros.models.policy import Policy, Prefix, ScoreOutput
    from vla_accel_ros.models.vla import BOS, VLAConfig, VLATarget
    from vla_accel_ros.models.world import (
        FrameAutoencoder,
        FrameAutoencoderConfig,
        WorldBias,
        WorldBiasConfig,
        WorldPrefill,
    )

_MODULE_OF = {
    "BOS": "vla",
    "CheckpointError": "checkpoint",
    "ContactHead": "draft",
    "DraftHead": "draft",
    "FrameAutoencoder": "world",
    "FrameAutoencoderConfig": "world",
    "ParallelDraftHead": "draft",
    "Policy": "policy",
    "Prefix": "policy",
    "ScoreOutput": "policy",
    "VLAConfig": "vla",
    "VLATarget": "vla",
    "WorldBias": "world",
    "WorldBiasConfig": "world",
    "WorldPrefill": "world",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
}

__all__ = [
    "BOS",
    "CheckpointError",
    "ContactHead",
    "DraftHead",
    "FrameAutoencoder",
    "FrameAutoencoderConfig",
    "ParallelDraftHead",
    "Policy",
    "Prefix",
    "ScoreOutput",
    "VLAConfig",
    "VLATarget",
    "WorldBias",
    "WorldBiasConfig",
    "WorldPrefill",
    "load_checkpoint",
    "save_checkpoint",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
