"""Policy models: the target VLA, the EAGLE-style draft head and its parallel variant, the contact
head, the world-aware prefill and checkpoint I/O.

The names below load on first use (PEP 562), so that the torch-free modules of this package
(``configuration``, ``sampling``, ``tokenizer``) import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vla_accel_ros.models.own.checkpoint import (
        CheckpointError,
        load_checkpoint,
        save_checkpoint,
    )
    from vla_accel_ros.models.own.draft import ContactHead, DraftHead, ParallelDraftHead
    from vla_accel_ros.models.own.policy import Policy, Prefix, ScoreOutput
    from vla_accel_ros.models.own.vla import VLAConfig, VLATarget
    from vla_accel_ros.models.own.world import (
        FrameAutoencoder,
        FrameAutoencoderConfig,
        WorldBias,
        WorldBiasConfig,
        WorldPrefill,
    )
    from vla_accel_ros.models.tokenizer import BOS

_MODULE_OF = {
    "BOS": "tokenizer",
    "CheckpointError": "own.checkpoint",
    "ContactHead": "own.draft",
    "DraftHead": "own.draft",
    "FrameAutoencoder": "own.world",
    "FrameAutoencoderConfig": "own.world",
    "ParallelDraftHead": "own.draft",
    "Policy": "own.policy",
    "Prefix": "own.policy",
    "ScoreOutput": "own.policy",
    "VLAConfig": "own.vla",
    "VLATarget": "own.vla",
    "WorldBias": "own.world",
    "WorldBiasConfig": "own.world",
    "WorldPrefill": "own.world",
    "load_checkpoint": "own.checkpoint",
    "save_checkpoint": "own.checkpoint",
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
