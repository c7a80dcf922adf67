"""The control node's inference worker, one kind per ``inference_mode``, started at configure:

- ``thread``: the :class:`~vla_accel_ros.runtime.runner.PolicyRunner` in a thread beside the
  control timer (``runtime/thread_worker.py``);
- ``process``: the runner in a child process fed through shared memory (``runtime/process_worker.py``;
  it reports the model's image size and the decoder's fallbacks once loaded);
- ``remote``: ``vla_inference_node`` on another machine, reached through the node's
  :class:`~vla_accel_ros.ros.remote_link.RemoteLink` (``runtime/remote_worker.py``).

Importing this module does not import torch: only the thread mode loads the policy in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vla_accel_ros.core.controller import Controller
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.ros.parameters import NodeConfig
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.runtime.process_worker import ChildSpec, ProcessInferenceWorker
from vla_accel_ros.runtime.remote_worker import RemoteInferenceWorker
from vla_accel_ros.runtime.thread_worker import InferenceWorker

if TYPE_CHECKING:  # the link is rclpy's; this module is not
    from vla_accel_ros.ros.remote_link import RemoteLink

Worker = InferenceWorker | ProcessInferenceWorker | RemoteInferenceWorker


@dataclass(frozen=True)
class Inference:
    worker: Worker  # started
    model_image_size: int  # the checkpoint's input size; 0 in remote mode (the inference node resizes)
    model_image_slots: int  # camera images per observation the checkpoint reads; 0 in remote mode
    warnings: list[str]  # the decoder's fallbacks for what the policy lacks


def start_inference(cfg: NodeConfig, runner_config: RunnerConfig, controller: Controller, kin: ArmKinematics,
                    clock: Callable[[], float], link: RemoteLink | None = None) -> Inference:
    """The worker of ``cfg.inference_mode`` for ``controller`` and the policy of ``runner_config``
    (its checkpoint resolved by the node), started; ``clock`` is the node's, ``link`` the node's to
    the inference node (remote mode). ConfigError naming the checkpoint and the decoder when the
    policy cannot be loaded."""
    try:
        if cfg.inference_mode == "remote":
            assert link is not None, "remote inference needs the node's RemoteLink"
            remote = link.start_worker(controller, clock, kin.joint_names, lost_after_s=cfg.remote_lost_after_s,
                                       max_age_s=cfg.action_timeout_s)
            return Inference(remote, 0, 0, [])
        if cfg.inference_mode == "process":
            child = ProcessInferenceWorker(controller, ChildSpec(runner_config, kin.urdf_xml, kin.tcp_frame), clock,
                                           max_restarts=cfg.inference_restarts, python=cfg.inference_python)
            child.start()
            return Inference(child, child.image_size, child.image_slots, list(child.warnings))
        runner = build_runner(runner_config, kin)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"cannot load policy checkpoint '{runner_config.checkpoint_path}' with decoder "
                          f"'{cfg.policy.decoder}': {err}") from err
    thread = InferenceWorker(controller, runner, clock, torch_threads=cfg.torch_threads)
    thread.start()
    return Inference(thread, runner.image_size, runner.image_slots, list(runner.warnings))
