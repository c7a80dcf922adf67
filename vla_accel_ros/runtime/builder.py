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
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vla_accel_ros.core.controller import Controller, ControllerConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_checkpoint
from vla_accel_ros.decoding import make_decoder
from vla_accel_ros.decoding.specs import DEFAULT, shared_settings, spec_of
from vla_accel_ros.models.api import CheckpointRef, PolicyLike, ResolvedCheckpoint
from vla_accel_ros.models.configuration import (
    MAX_TEMPERATURE,
    RunDefaults,
    VisionReuseConfig,
    declared_run_defaults,
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
    temperature: action-token sampling temperature, 0 = greedy; None = the model's
        (:func:`run_defaults`: its ``vla_spec.json``'s, else its family's).
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
        of ``kerv`` and ``world_aware`` (their ``r_min``, ``r_max``); None = the model's, and with
        them its ``kf_fill_check`` (:meth:`for_model`).
    rtc_horizon, rtc_guidance: real-time chunking of the flow decoders (0 = off).
    device: where the policy runs (cuda, cuda:N); empty = the CPU.
    stand_in_images: an observation with fewer camera images than the policy's image slots gets a
        copy of its first image in each missing slot (the node's ``allow_stand_in_images``, eval's
        ``--stand-in-images``); false: the policy refuses it.
    draft_head: a token VLA's draft head in a directory of its own (``vla-accel train-draft --out``);
        empty = the one beside the weights, if any.
    resolved: the checkpoint resolved already (:func:`vla_accel_ros.models.load.resolve_checkpoint`,
        the node's, which the inference child receives with these settings): the runner loads it
        without reading or recognising it again; None: resolved when the runner is built.
    """

    checkpoint: str = ""
    decoder: str = DEFAULT
    temperature: float | None = None
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
    stand_in_images: bool = False
    draft_head: str = ""
    resolved: ResolvedCheckpoint | None = None

    def __post_init__(self) -> None:
        spec_of(self.decoder)  # ValueError naming the registered decoders
        if self.kinematic_r_bounds is not None:  # a list too: the inference process's JSON
            bounds = tuple(self.kinematic_r_bounds)
            if len(bounds) != 2 or not all(isinstance(r, int) for r in bounds) or not 0 <= bounds[0] <= bounds[1]:
                raise ValueError(f"RunnerConfig.kinematic_r_bounds needs integers 0 <= r_min <= r_max, got "
                                 f"{self.kinematic_r_bounds}")
            object.__setattr__(self, "kinematic_r_bounds", bounds)
        if self.temperature is not None and not (math.isfinite(self.temperature)
                                                 and 0.0 <= self.temperature <= MAX_TEMPERATURE):
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

    def for_model(self, defaults: RunDefaults) -> RunnerConfig:
        """These settings with what they leave to the model taken from ``defaults``: the
        temperature when None; with the kinematic bounds None and a decoder that takes them,
        the model's bounds, and its checked fill where the decoder can check (a fill check asked
        for stays on)."""
        spec = spec_of(self.decoder)
        temperature = defaults.temperature if self.temperature is None else self.temperature
        bounds, fill_check = self.kinematic_r_bounds, self.kf_fill_check
        if bounds is None and spec.kinematic_threshold:
            bounds = defaults.kinematic_r_bounds
            fill_check = fill_check or (defaults.kf_fill_check and spec.fill_check)
        return replace(self, temperature=temperature, kinematic_r_bounds=bounds, kf_fill_check=fill_check)

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

    What ``config`` leaves to the model (the temperature, the kinematic bounds) comes from the
    checkpoint it names (:func:`run_defaults`), also for a ``policy`` passed in.
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
    # a decoder passed in holds its bounds already: then only the temperature may be the model's
    leaves_to_model = config.temperature is None or (decoder is None and config.kinematic_r_bounds is None
                                                     and spec_of(config.decoder).kinematic_threshold)
    if config.resolved is None and (policy is None or leaves_to_model):  # resolved once: defaults and loading
        from vla_accel_ros.models.load import resolve_checkpoint

        config = replace(config, resolved=resolve_checkpoint(config.checkpoint_ref, unnorm_key=config.unnorm_key,
                                                             device=config.device))
    if config.resolved is not None:
        config = config.for_model(run_defaults(config.resolved))
    options: dict[str, Any] = {"action_dt_s": config.action_dt_s, "period_s": config.period_s,
                               "max_steps": config.max_steps, "clock": clock, "vision": config.vision,
                               "stand_in_images": config.stand_in_images,
                               "sampling": SamplingConfig(config.temperature or 0.0)}
    if policy is None:
        if decoder is not None:
            raise ValueError("build_runner: a decoder object needs its policy (pass policy= too)")
        return PolicyRunner.load(config.resolved or config.checkpoint_ref, config.decoder, kin,
                                 unnorm_key=config.unnorm_key, draft_head=config.draft_head,
                                 decoder_settings=decoder_settings(config), device=config.device, **options)
    if decoder is None:
        decoder = make_decoder(config.decoder, **decoder_settings(config))
    elif decoder.name != config.decoder:
        raise ValueError(f"build_runner: the decoder passed is '{decoder.name}', the config names '{config.decoder}'")
    return PolicyRunner(policy, decoder, kin, **options)


def run_defaults(resolved: ResolvedCheckpoint) -> RunDefaults:
    """How the checkpoint ``resolved`` runs unless the user sets it: its family's defaults with what
    its ``vla_spec.json`` declares (:func:`~vla_accel_ros.models.configuration.declared_run_defaults`).
    Imports no torch."""
    from vla_accel_ros.models.load import family_named

    defaults = family_named(resolved.family).run_defaults
    return defaults if resolved.ref.address else declared_run_defaults(defaults, resolved.directory)


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
