"""Policy models: the contract every family meets (:mod:`.api`), the registry and loader that
recognise a checkpoint's family (:mod:`.load`), the one reader of a checkpoint's JSON and checks of
its weight files (:mod:`.files`), one folder per family (:mod:`.own`, :mod:`.hf`, :mod:`.openvla`,
:mod:`.oft`, :mod:`.lerobot`, :mod:`.openpi`; each registers itself in its ``family.py``), what the
token VLAs share (:mod:`.token_vla`), and what every family may use (layers, kernels, the action
tokenizer, sampling, real-time chunking, settings).

The names below load on first use (PEP 562), so that the torch-free modules of this package
(``api``, ``configuration``, ``sampling``, ``tokenizer``) import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vla_accel_ros.models.api import (
        CheckpointRef,
        IncrementalPrefill,
        PolicyCapabilities,
        PolicyLike,
        Prefix,
        ReuseStats,
        ScoreOutput,
    )
    from vla_accel_ros.models.load import load_policy
    from vla_accel_ros.models.own.checkpoint import (
        CheckpointError,
        load_checkpoint,
        save_checkpoint,
    )
    from vla_accel_ros.models.own.config import VLAConfig
    from vla_accel_ros.models.own.draft import ContactHead, DraftHead, ParallelDraftHead
    from vla_accel_ros.models.own.modules import VLATarget
    from vla_accel_ros.models.own.policy import Policy
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
    "CheckpointRef": "api",
    "ContactHead": "own.draft",
    "DraftHead": "own.draft",
    "FrameAutoencoder": "own.world",
    "FrameAutoencoderConfig": "own.world",
    "IncrementalPrefill": "api",
    "ParallelDraftHead": "own.draft",
    "Policy": "own.policy",
    "PolicyCapabilities": "api",
    "PolicyLike": "api",
    "Prefix": "api",
    "ReuseStats": "api",
    "ScoreOutput": "api",
    "VLAConfig": "own.config",
    "VLATarget": "own.modules",
    "WorldBias": "own.world",
    "WorldBiasConfig": "own.world",
    "WorldPrefill": "own.world",
    "load_checkpoint": "own.checkpoint",
    "load_policy": "load",
    "save_checkpoint": "own.checkpoint",
}

__all__ = [
    "BOS",
    "CheckpointError",
    "CheckpointRef",
    "ContactHead",
    "DraftHead",
    "FrameAutoencoder",
    "FrameAutoencoderConfig",
    "IncrementalPrefill",
    "ParallelDraftHead",
    "Policy",
    "PolicyCapabilities",
    "PolicyLike",
    "Prefix",
    "ReuseStats",
    "ScoreOutput",
    "VLAConfig",
    "VLATarget",
    "WorldBias",
    "WorldBiasConfig",
    "WorldPrefill",
    "load_checkpoint",
    "load_policy",
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
