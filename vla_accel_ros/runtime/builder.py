"""From settings to the two halves of a control loop: the :class:`~vla_accel_ros.runtime.runner.PolicyRunner`
(observation -> action) and the :class:`~vla_accel_ros.core.controller.Controller` (one safe command per
tick).

The node (thread mode), the inference child (process mode), the lock-step core of record and replay,
eval and bench all build their runner here, so each runs the same policy, decoder, sampling, vision
and episode history for the same settings. :class:`RunnerConfig` is the runtime's own view of those
settings; ``NodeConfig.runner_config()`` gives the node's.

Importing this module does not import torch: in ``inference_mode: process`` the node builds its
controller here while the policy (and torch) live only in the child.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vla_accel_ros.core.controller import Controller, ControllerConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.specs import DEFAULT, shared_settings, spec_of
from vla_accel_ros.models.api import CheckpointRef, PolicyLike, ResolvedCheckpoint
from vla_accel_ros.models.configuration import (
    DEFAULT_TEMPERATURE,
    MAX_TEMPERATURE,
    VisionReuseConfig,
)

if TYPE_CHECKING:
    from vla_accel_ros.decoding.protocol import Decoder
    from vla_accel_ros.runtime.runner import PolicyRunner


@dataclass(frozen=True)
class RunnerConfig:
    """What a :class:`PolicyRunner` is built from.

    checkpoint: policy checkpoint directory, or ``hf:DIR`` for a Hugging Face VLA; empty = the
        package's checkpoints/default.
    decoder: decoder name (``vla_accel_ros.decoding.specs``).
    temperature: action-token sampling temperature, 0 = greedy.
    vision: incremental-vision settings; None (or ``enabled`` false) = encode every patch of every frame.
    action_dt_s: duration of one policy action step (the Kalman filter's step).
    period_s: the control period: the time a decoder has for one action.
    max_steps: episode step limit the decoders see.
    torch_threads: torch intra-op threads of the thread that builds and runs the runner.
    unnorm_key: a Hugging Face VLA's dataset in its ``dataset_statistics.json``; empty = its only one.
    kf_fill_check: the decoder checks its Kalman filter's fill of a rejected suffix against the
        target's own picks from the same verify pass (its ``fill_check``); only for a decoder with
        that capability (``kerv``, ``world_aware``).
    kinematic_r_bounds: (r_min, r_max), the bounds in token bins of the kinematic acceptance threshold
        of ``kerv`` and ``world_aware`` (their ``r_min``, ``r_max``); None = the decoder's own.
    rtc_horizon, rtc_guidance: real-time chunking of the flow decoders (0 = off).
    device: where the policy runs (cuda, cuda:N); empty = the CPU.
    resolved: the checkpoint resolved already (:func:`vla_accel_ros.models.load.resolve_checkpoint`,
        the node's, which the inference child receives with these settings): the runner loads it
        without reading or recognising it again; None: resolved when the runner is built.
    """

    checkpoint: str = ""
    decoder: str = DEFAULT
    temperature: float = DEFAULT_TEMPERATURE
    vision: VisionReuseConfig | None = None
    action_dt_s: float = 0.05
    period_s: float = 0.05
    max_steps: int = 120
    torch_threads: int = 1
    unnorm_key: str = ""
    kf_fill_check: bool = False
    kinematic_r_bounds: tuple[int, int] | None = None
    rtc_horizon: int = 0
    rtc_guidance: float = 5.0
    device: str = ""
    resolved: ResolvedCheckpoint | None = None

    def __post_init__(self) -> None:
        spec_of(self.decoder)  # ValueError naming the registered decoders
        if self.kinematic_r_bounds is not None:  # a list too: the inference process's JSON
            bounds = tuple(self.kinematic_r_bounds)
            if len(bounds) != 2 or not all(isinstance(r, int) for r in bounds) or not 0 <= bounds[0] <= bounds[1]:
                raise ValueError(f"RunnerConfig.kinematic_r_bounds needs integers 0 <= r_min <= r_max, got "
                                 f"{self.kinematic_r_bounds}")
            object.__setattr__(self, "kinematic_r_bounds", bounds)
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"RunnerConfig.temperature must be in [0, {MAX_TEMPERATURE}], got {self.temperature}")
        for name in ("action_dt_s", "period_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"RunnerConfig.{name} must be > 0, got {value}")
        if self.max_steps < 1:
            raise ValueError(f"RunnerConfig.max_steps must be >= 1, got {self.max_steps}")
        if self.torch_threads < 1:
            raise ValueError(f"RunnerConfig.torch_threads must be >= 1, got {self.torch_threads}")

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON-ready values (what the inference child receives), the resolved
        checkpoint as its record (:meth:`ResolvedCheckpoint.to_json`)."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        values.update(vision=None if self.vision is None else asdict(self.vision),
                      resolved=None if self.resolved is None else self.resolved.to_json())
        return values

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> RunnerConfig:
        """The settings :meth:`to_json` gave (after a JSON round trip)."""
        values = dict(values)
        vision, resolved = values.pop("vision"), values.pop("resolved")
        return cls(**values, vision=None if vision is None else VisionReuseConfig(**vision),
                   resolved=None if resolved is None else ResolvedCheckpoint.from_json(resolved))

    @functools.cached_property
    def checkpoint_ref(self) -> CheckpointRef:
        """The checkpoint this config names, parsed (the package's default when empty)."""
        return CheckpointRef.parse(self.checkpoint or default_checkpoint())

    @property
    def checkpoint_source(self) -> str:
        """The checkpoint this config names, as a setting writes it (``hf:DIR`` declares a Hugging
        Face VLA; the package's default when empty)."""
        return str(self.checkpoint_ref)

    @property
    def checkpoint_path(self) -> Path:
        """The checkpoint's directory."""
        return self.checkpoint_ref.directory


def build_runner(config: RunnerConfig, kin: ArmKinematics, *, policy: PolicyLike | None = None,
                 decoder: Decoder | None = None, clock: Callable[[], float] = time.perf_counter) -> PolicyRunner:
    """The runner of ``config`` for the arm ``kin``, its decoders timing themselves on ``clock``.

    Without ``policy`` the checkpoint is loaded (``config.resolved`` when given, else resolved once;
    ValueError names the file at fault) together with what the decoder needs beside it (heisd:
    CHECKPOINT/retrieval_store). A caller that holds the policy already (eval and bench share one
    between runners) passes it, and may pass a decoder configured beyond its name (thresholds, a
    retrieval store), named ``config.decoder``.
    Raises ValueError naming an unknown decoder, or a policy that cannot serve it.
    """
    import torch

    from vla_accel_ros.models.sampling import SamplingConfig
    from vla_accel_ros.runtime.runner import PolicyRunner

    torch.set_num_threads(config.torch_threads)
    options: dict[str, Any] = {"action_dt_s": config.action_dt_s, "period_s": config.period_s,
                               "max_steps": config.max_steps, "clock": clock, "vision": config.vision,
                               "sampling": SamplingConfig(config.temperature)}
    if policy is None:
        if decoder is not None:
            raise ValueError("build_runner: a decoder object needs its policy (pass policy= too)")
        return PolicyRunner.load(config.resolved or config.checkpoint_ref, config.decoder, kin,
                                 unnorm_key=config.unnorm_key,
                                 decoder_settings=decoder_settings(config), device=config.device, **options)
    if decoder is None:
        decoder = make_decoder(config.decoder, **decoder_settings(config))
    elif decoder.name != config.decoder:
        raise ValueError(f"build_runner: the decoder passed is '{decoder.name}', the config names '{config.decoder}'")
    return PolicyRunner(policy, decoder, kin, **options)


def decoder_settings(config: RunnerConfig) -> dict[str, Any]:
    """What ``config`` sets of its decoder besides the name (:func:`~vla_accel_ros.decoding.specs.shared_settings`:
    ValueError when it asks for a setting the decoder does not take)."""
    return shared_settings(config.decoder, fill_check=config.kf_fill_check,
                           kinematic_r_bounds=config.kinematic_r_bounds,
                           rtc=(config.rtc_horizon, config.rtc_guidance))


def build_controller(config: ControllerConfig, kin: ArmKinematics, *, enabled: bool = False,
                     instruction: str = "") -> Controller:
    """The control core for ``kin``: enabled or holding, with a first instruction when one is given."""
    controller = Controller(kin, config)
    controller.set_enabled(enabled)
    if instruction.strip():
        controller.set_instruction(instruction)
    return controller
