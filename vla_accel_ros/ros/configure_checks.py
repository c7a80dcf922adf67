"""The control node's configure-time checks of its checkpoint and image size, each a ConfigError (a
ValueError) naming the problem: the checkpoint is there (before the node waits for a URDF), runs on
``device``, was made for this robot, and what its actions are; the image size agrees with the
model's. With ``inference_mode: remote`` the inference node checks its checkpoint. ROS-free.
"""

from __future__ import annotations

from typing import NamedTuple

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.core.robot_record import check_checkpoint_robot
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.models.api import ResolvedCheckpoint
from vla_accel_ros.models.load import resolve_checkpoint
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.runtime.builder import RunnerConfig

DEFAULT_IMAGE_SIZE = 128  # without an image_size parameter and a model that says its own


class CheckedCheckpoint(NamedTuple):
    resolved: ResolvedCheckpoint  # its family, config and action space, handed on to the inference worker
    robot_warning: str  # the checkpoint's robot differs and allow_unmatched_robot runs it anyway; else ''


def check_checkpoint_present(runner: RunnerConfig) -> None:
    """Before any wait for a URDF: the example parameter files' placeholder, or no such directory."""
    if problem := checkpoint_problem(runner.checkpoint_path):
        raise ConfigError(f"{runner.checkpoint_path}: {problem}")


def checkpoint_checks(runner: RunnerConfig, cfg: NodeConfig, kin: ArmKinematics) -> CheckedCheckpoint:
    """The checkpoint ``runner`` names, resolved once (its family, its files, ``device``: one its
    family runs on and, for CUDA, one this torch sees, unless ``inference_python`` names the
    interpreter whose torch counts; its declared action space) and checked against this robot (``kin`` and the policy
    step and image size of ``cfg``). A policy server (openpi://) carries no robot record."""
    # an inference_python of its own asks its own torch for the GPU, as its process starts (still at configure)
    device = "" if cfg.inference_python else runner.device
    resolved = resolve_checkpoint(runner.checkpoint_ref, unnorm_key=runner.unnorm_key, device=device)
    warning = "" if runner.checkpoint_ref.address else check_checkpoint_robot(
        runner.checkpoint_path, kin.joint_names, kin.tcp_frame, action_dt_s=cfg.action_dt_s,
        image_size=cfg.image_size, allow_unmatched=cfg.allow_unmatched_robot)
    return CheckedCheckpoint(resolved, warning)


def image_size(configured: int, model_size: int) -> int:
    """The size images are fed at: the ``image_size`` parameter, else the model's (0: unknown);
    ConfigError when both are set and differ."""
    size = configured or model_size or DEFAULT_IMAGE_SIZE
    if model_size and size != model_size:
        raise ConfigError(f"parameter 'image_size' = {configured} but the checkpoint expects "
                          f"{model_size}; set 0 to use the checkpoint's size")
    return size
