"""Policy models: the target VLA, the EAGLE-style draft head and its parallel variant, the contact
head, the world-aware prefill and checkpoint I/O."""

from vla_accel_ros.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from vla_accel_ros.models.draft import ContactHead, DraftHead, ParallelDraftHead
from vla_accel_ros.models.policy import Policy, Prefix, ScoreOutput
from vla_accel_ros.models.vla import BOS, VLAConfig, VLATarget
from vla_accel_ros.models.world import FrameAutoencoder, FrameAutoencoderConfig, WorldBias, WorldBiasConfig, WorldPrefill

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
