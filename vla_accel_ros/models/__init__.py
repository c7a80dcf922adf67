"""Policy models: the target VLA, the EAGLE-style draft head, the contact head and checkpoint I/O."""

from vla_accel_ros.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from vla_accel_ros.models.draft import ContactHead, DraftHead
from vla_accel_ros.models.policy import Policy, Prefix, ScoreOutput
from vla_accel_ros.models.vla import BOS, VLAConfig, VLATarget

__all__ = [
    "BOS",
    "CheckpointError",
    "ContactHead",
    "DraftHead",
    "Policy",
    "Prefix",
    "ScoreOutput",
    "VLAConfig",
    "VLATarget",
    "load_checkpoint",
    "save_checkpoint",
]
