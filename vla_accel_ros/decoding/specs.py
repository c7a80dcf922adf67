"""Every decoder, by name: its settings, its capabilities, and the module that implements it.

One :class:`DecoderSpec` subclass per decoder, registered with :func:`register`: the node's
parameter check, the launch arguments, the runtime's builder and the commands all ask this registry,
so a decoder is defined here once. The implementation is imported only when a decoder is made
(``vla_accel_ros.decoding.make_decoder``): this module imports without torch, so the node in ``inference_mode:
process`` validates its parameters without loading a model.

A spec's capabilities are class attributes, declared, never probed: what the decoder needs from the
policy (action tokens, ``token_scoring``, unless it decodes a chunk; ``draft_head``, ``flow_head``;
``contact_head`` it reads where the scene gives no clearance, with a documented fallback), what it
needs beside the checkpoint (``retrieval_store``), what it keeps across steps (``episode_state``),
and which of the shared settings it takes (``fill_check``: the node's ``kf_fill_check``;
``kinematic_threshold``: ``kinematic_r_min``/``kinematic_r_max``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from vla_accel_ros.core.errors import SettingError

if TYPE_CHECKING:
    from vla_accel_ros.models.api import PolicyCapabilities


# --- settings ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SDConfig:
    r: float = 9  # relaxed acceptance threshold, in token bins

    def __post_init__(self) -> None:
        if not self.r >= 0:
            raise ValueError(f"SDConfig.r (acceptance threshold in bins) must be >= 0, got {self.r}")


@dataclass(frozen=True)
class KervReleasedConfig:
    r_start: int = 15
    r_min: int = 3
    q: float = 1.0
    r_noise: float = 1e-3
    p0: float = 10.0
    period: int = 4

    def __post_init__(self) -> None:
        if not 0 <= self.r_min <= self.r_start:
            raise ValueError(f"KervReleasedConfig needs 0 <= r_min <= r_start, got {self.r_min}, {self.r_start}")
        if self.q <= 0 or self.r_noise <= 0 or self.p0 <= 0:
            raise ValueError("KervReleasedConfig q, r_noise and p0 must be > 0")
        if self.period < 1:
            raise ValueError(f"KervReleasedConfig.period must be >= 1, got {self.period}")


@dataclass(frozen=True)
class KervConfig:
    r_min: int = 5  # bounds of the kinematic acceptance threshold, in token bins
    r_max: int = 15
    kf_draft: bool = True  # let the KF propose the positions it has proven reliable on
    kf_trust: float = 0.9  # running acceptance rate a position's KF token needs before the KF drafts it
    hold_draft: bool = True  # let the previous action's tokens propose the positions they have proven reliable on
    # running acceptance rate a position's held token needs before it is proposed: below 1, because
    # skipping the draft head saves a fixed cost while a rejected proposal costs no extra pass
    hold_trust: float = 0.6
    kf_rate_weight: float = 0.2  # weight of the newest step in that running rate (exponential average)
    # draft with the policy's parallel draft head when it has one (one light call for all tokens);
    # False = always the sequential head
    parallel_draft: bool = True
    # verify a proposal of the cheap sources inside the prefill where ``prefill_allowed`` says so: no
    # pass after the prefill, but no draft head either, and the first position is a cheap token too
    prefill_verify: bool = False
    # check the KF's fill against the target's own picks at those positions, which the same verify
    # pass already gave (conditioned on the proposal before them): a KF token more than r from the
    # target's pick gives way to it. Still one pass; the fill stays the KF's wherever they agree.
    fill_check: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.r_min <= self.r_max:
            raise ValueError(
                f"{type(self).__name__} needs 0 <= r_min <= r_max, got r_min={self.r_min}, r_max={self.r_max}"
            )
        for name in ("kf_trust", "hold_trust"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{type(self).__name__}.{name} must be in (0, 1], got {getattr(self, name)}")
        if not 0.0 < self.kf_rate_weight <= 1.0:
            raise ValueError(f"{type(self).__name__}.kf_rate_weight must be in (0, 1], got {self.kf_rate_weight}")


@dataclass(frozen=True)
class WorldAwareConfig(KervConfig):
    # contact looseness (0 at contact, 1 in free space) below which the previous action does not
    # draft: 0.5 is about 6 cm from the target with the scene's clearance
    hold_min_looseness: float = 0.5
    prefill_verify: bool = True  # in free space, verify the cheap proposal inside the prefill
    # contact looseness from which the proposal is verified inside the prefill; None: 0.5, or 0 (every
    # step with a contact reading) with the fill check, which bounds the suffix after a rejected cheap
    # token by the target's own picks, the risk that keeps the unchecked fill out of the prefill near contact
    prefill_min_looseness: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prefill_min_looseness is None:
            object.__setattr__(self, "prefill_min_looseness", 0.0 if self.fill_check else 0.5)
        for name in ("hold_min_looseness", "prefill_min_looseness"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"WorldAwareConfig.{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class DeadlineConfig(KervConfig):
    margin_s: float = 0.001
    ema: float = 0.3
    draft_step_s: float | None = None
    verify_s: float | None = None
    max_rounds: int = 7

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.margin_s) and self.margin_s >= 0):
            raise ValueError(f"DeadlineConfig.margin_s must be >= 0 seconds, got {self.margin_s}")
        if not 0 < self.ema <= 1:
            raise ValueError(f"DeadlineConfig.ema must be in (0, 1], got {self.ema}")
        for name in ("draft_step_s", "verify_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"DeadlineConfig.{name} must be None or >= 0 seconds, got {value}")
        if self.max_rounds < 1:
            raise ValueError(f"DeadlineConfig.max_rounds must be >= 1, got {self.max_rounds}")
        if self.fill_check:
            raise ValueError("DeadlineConfig.fill_check: deadline fills when no round fits any more, with no verify "
                             "pass over those positions whose picks could check the fill")


PRESETS = ("calibrated", "published")  # heisd's boundary ranges and threshold


@dataclass(frozen=True)
class HeiSDConfig:
    """preset: boundary ranges/threshold, "calibrated" (from the store, see build-store) or
    "published". r: token-wise relaxed threshold (drafter SD and the retrieval fallback).
    skip_steps: retrieved actions executed without verification after an accepted one.
    sequence_accept: use sequence-wise acceptance of retrieved actions; r_seq: its bound on the
    mean token distance. store: a RetrievalStore or the directory of a saved one."""

    preset: str = "calibrated"
    r: float = 9
    skip_steps: int = 2
    sequence_accept: bool = True
    r_seq: float = 4.0
    store: Any = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"HeiSDConfig.preset must be one of {PRESETS}, got {self.preset!r}")
        if not (math.isfinite(self.r) and self.r >= 0):
            raise ValueError(f"HeiSDConfig.r (acceptance threshold in bins) must be >= 0, got {self.r}")
        if not (math.isfinite(self.r_seq) and self.r_seq >= 0):
            raise ValueError(f"HeiSDConfig.r_seq (mean token distance) must be >= 0, got {self.r_seq}")
        if isinstance(self.skip_steps, bool) or not isinstance(self.skip_steps, int) or self.skip_steps < 0:
            raise ValueError(f"HeiSDConfig.skip_steps must be an int >= 0, got {self.skip_steps!r}")
        if not isinstance(self.sequence_accept, bool):
            raise ValueError(f"HeiSDConfig.sequence_accept must be a bool, got {self.sequence_accept!r}")


@dataclass(frozen=True)
class FlowDecoderConfig:
    """``rtc_horizon``: real-time chunking (:mod:`vla_accel_ros.models.realtime_chunking`), the
    steps of each chunk guided towards what the previous chunk plans for the same times (0 = off);
    ``rtc_guidance``: the guidance's largest gain."""

    seed: int = 0
    noise_correlation: float = 0.9  # rho of the step-to-step noise; 0 = independent noise every step
    rtc_horizon: int = 0
    rtc_guidance: float = 5.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise_correlation <= 1.0:
            raise ValueError(f"noise_correlation must be in [0, 1], got {self.noise_correlation}")
        if isinstance(self.rtc_horizon, bool) or not isinstance(self.rtc_horizon, int) or self.rtc_horizon < 0:
            raise ValueError(f"rtc_horizon must be an int >= 0, got {self.rtc_horizon!r}")
        if not (math.isfinite(self.rtc_guidance) and self.rtc_guidance >= 0.0):
            raise ValueError(f"rtc_guidance must be >= 0, got {self.rtc_guidance}")


@dataclass(frozen=True)
class NoSettings:
    """A decoder with nothing to set (``ar``)."""


# --- specs ------------------------------------------------------------------------------------
class DecoderSpec:
    """One decoder: its name, a one-line summary, its settings dataclass, its implementation
    (``"package.module:Class"``, imported on first use) and its capabilities (module docstring).
    Subclass it and :func:`register` the subclass."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    implementation: ClassVar[str] = ""
    settings: ClassVar[type] = NoSettings
    # what it needs and takes
    draft_head: ClassVar[bool] = False  # needs the policy's draft head: refused at start-up without one
    parallel_draft: ClassVar[bool] = False  # drafts with the parallel draft head when the policy has one
    contact_head: ClassVar[bool] = False  # reads the contact head where the scene gives no clearance
    flow_head: ClassVar[bool] = False  # decodes with the continuous action head (vla-accel train-flow)
    action_chunk: ClassVar[bool] = False  # reads the chunk a policy's prefill predicts (OpenVLA-OFT); no tokens
    retrieval_store: ClassVar[bool] = False  # needs a retrieval store (vla-accel build-store)
    episode_state: ClassVar[bool] = False  # keeps state across steps that a new episode clears
    fill_check: ClassVar[bool] = False  # fills a rejected suffix with the Kalman filter and can check it
    kinematic_threshold: ClassVar[bool] = False  # its threshold is the kinematic one, within r_min..r_max
    verifies_in_prefill: ClassVar[bool] = False  # by default verifies a cheap proposal inside the prefill

    @classmethod
    def sweep_settings(cls, r: int) -> dict[str, Any] | None:
        """The settings that make ``r`` bins its acceptance threshold (its loosest, for an adaptive
        one), for a sweep over r; None when it has no threshold to sweep."""
        return None

    @classmethod
    def refusal(cls, offered: PolicyCapabilities) -> str:
        """Why a policy offering ``offered`` cannot serve this decoder ('' when it can)."""
        if offered.action_chunk and not cls.action_chunk:
            return (f"decoder '{cls.name}' does not apply: the policy has no action tokens, it predicts a whole "
                    f"chunk in one pass (decoder '{CHUNK_DECODER}')")
        if offered.flow_chunks and not cls.flow_head:
            return (f"decoder '{cls.name}' does not apply: the policy has no action tokens, it samples a whole chunk "
                    "by flow (decoders flow10, flow2)")
        if cls.action_chunk and not offered.action_chunk:
            return (f"decoder '{cls.name}' needs a policy that predicts its chunk in one pass (an OpenVLA-OFT "
                    "checkpoint)")
        if cls.flow_head and not offered.flow_head:
            return f"decoder '{cls.name}' needs a checkpoint with a continuous action head (vla-accel train-flow)"
        if not (cls.flow_head or cls.action_chunk or offered.token_scoring):
            return f"decoder '{cls.name}' needs a policy with action tokens (token_scoring), and this one has none"
        if cls.draft_head and not offered.draft_head:
            offering = ", ".join(names_with(lambda s: not s.draft_head and not s.flow_head and s.name != BASELINE))
            return (f"decoder '{cls.name}' needs a draft head, and the policy has none: train one (vla-accel "
                    f"train-draft), or choose a decoder that drafts without one ({offering}: the previous action "
                    f"and the Kalman filter) or {BASELINE}")
        return ""

    @classmethod
    def fallbacks(cls, offered: PolicyCapabilities) -> list[str]:
        """The documented fallbacks this decoder takes for what a policy offering ``offered`` lacks."""
        if cls.contact_head and not offered.contact_head:
            return [f"decoder '{cls.name}': the policy has no contact head, so where the scene gives no clearance "
                    "the kinematics alone set the acceptance threshold"]
        return []


_SPECS: dict[str, type[DecoderSpec]] = {}


def register(spec: type[DecoderSpec]) -> type[DecoderSpec]:
    """Add ``spec`` to the registry (a class decorator); its name must be new."""
    if not spec.name or spec.name in _SPECS:
        raise ValueError(f"decoder spec {spec.__name__}: its name {spec.name!r} is empty or taken")
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a registered decoder (a test's own spec)."""
    _SPECS.pop(name, None)


@register
class AR(DecoderSpec):
    name = "ar"
    summary = "autoregressive baseline: 7 sequential target passes"
    implementation = "vla_accel_ros.decoding.ar:ARDecoder"


BASELINE = AR.name  # the decoder every speed-up is measured against, and the one every policy can run


@register
class SD(DecoderSpec):
    name = "sd"
    summary = "speculative decoding, fixed relaxed threshold r; on a rejection the target's token, then another round"
    implementation = "vla_accel_ros.decoding.sd:SDDecoder"
    settings = SDConfig
    draft_head = True

    @classmethod
    def sweep_settings(cls, r: int) -> dict[str, Any]:
        return {"r": r}


@register
class KervReleased(DecoderSpec):
    name = "kerv_released"
    summary = "KERV as its public code behaves: a token-space random-walk Kalman filter, r decaying 15 -> 3"
    implementation = "vla_accel_ros.decoding.kerv_released:KervReleasedDecoder"
    settings = KervReleasedConfig
    draft_head = True


@register
class Kerv(DecoderSpec):
    name = "kerv"
    summary = "one verify pass; the joint-space Kalman filter (URDF) fills a rejected suffix; kinematic threshold"
    implementation = "vla_accel_ros.decoding.kerv:KervDecoder"
    settings = KervConfig
    parallel_draft = True
    fill_check = True
    kinematic_threshold = True

    @classmethod
    def sweep_settings(cls, r: int) -> dict[str, Any]:
        """The kinematic range up to ``r`` bins, from a third of it (at least 1 bin)."""
        return {"r_min": max(1, r // 3), "r_max": r}


@register
class WorldAware(DecoderSpec):
    name = "world_aware"
    summary = "kerv, tightened near contact; verifies a cheap proposal inside the prefill in free space"
    implementation = "vla_accel_ros.decoding.world_aware:WorldAwareDecoder"
    settings = WorldAwareConfig
    parallel_draft = True
    contact_head = True
    fill_check = True
    kinematic_threshold = True
    verifies_in_prefill = True


@register
class Deadline(DecoderSpec):
    name = "deadline"
    summary = "as many draft/verify rounds as the control period affords, then the Kalman filter fills"
    implementation = "vla_accel_ros.decoding.deadline:DeadlineDecoder"
    settings = DeadlineConfig
    draft_head = True
    parallel_draft = True


@register
class HeiSD(DecoderSpec):
    name = "heisd"
    summary = "drafter SD near task boundaries, retrieved trajectories and verify-skip in free motion"
    implementation = "vla_accel_ros.decoding.heisd:HeiSDDecoder"
    settings = HeiSDConfig
    draft_head = True
    retrieval_store = True
    episode_state = True


@register
class Flow10(DecoderSpec):
    name = "flow10"
    summary = "the continuous action head, 10 Euler steps (teacher)"
    implementation = "vla_accel_ros.decoding.flow:FlowDecoder"
    settings = FlowDecoderConfig
    flow_head = True


@register
class Flow2(DecoderSpec):
    name = "flow2"
    summary = "the continuous action head distilled to 2 steps (student)"
    implementation = "vla_accel_ros.decoding.flow:Flow2Decoder"
    settings = FlowDecoderConfig
    flow_head = True


@register
class Chunk(DecoderSpec):
    name = "chunk"
    summary = "the policy's own chunk from its one pass (OpenVLA-OFT's parallel decoding); no action tokens"
    implementation = "vla_accel_ros.decoding.chunk:ChunkDecoder"
    action_chunk = True


CHUNK_DECODER = Chunk.name
FLOW_BASELINE = Flow10.name  # the baseline of a flow VLA without action tokens (SmolVLA, π0): its own sampler
DEFAULT = Kerv.name  # the decoder of the node and of the commands that run it, unless told otherwise


# --- the registry's questions -----------------------------------------------------------------
def names() -> tuple[str, ...]:
    """The registered decoders, in registration order."""
    return tuple(_SPECS)


def spec_of(name: str) -> type[DecoderSpec]:
    """The spec of decoder ``name``; ValueError naming the registered ones when there is none."""
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown decoder '{name}'; choose one of: {', '.join(_SPECS)}")
    return spec


def names_with(predicate: Callable[[type[DecoderSpec]], bool]) -> tuple[str, ...]:
    """The registered decoders, in order, whose spec satisfies ``predicate``
    (e.g. ``names_with(lambda s: s.fill_check)``)."""
    return tuple(name for name, spec in _SPECS.items() if predicate(spec))


def default_setting(name: str, setting: str) -> Any:
    """A setting's default value in decoder ``name``'s settings dataclass."""
    for f in fields(spec_of(name).settings):
        if f.name == setting:
            return f.default
    raise ValueError(f"decoder '{name}' has no setting '{setting}'")


KINEMATIC_R_BOUNDS: tuple[int, int] = (default_setting(Kerv.name, "r_min"), default_setting(Kerv.name, "r_max"))


def shared_settings(name: str, *, fill_check: bool = False, kinematic_r_bounds: tuple[int, int] | None = None,
                    rtc: tuple[int, float] | None = None) -> dict[str, Any]:
    """Decoder ``name``'s settings from the options every decoder is offered (the node's
    ``kf_fill_check``, ``kinematic_r_min`` and ``kinematic_r_max``, ``rtc_horizon`` and
    ``rtc_guidance``): ValueError with the reason when it asks for one the decoder does not take,
    or for bounds with r_min > r_max."""
    spec = spec_of(name)
    settings: dict[str, Any] = {}
    if rtc is not None and rtc[0] > 0:
        if not spec.flow_head:
            raise SettingError(f"'rtc_horizon' (real-time chunking) is for the flow decoders "
                               f"({', '.join(names_with(lambda s: s.flow_head))}), not '{name}'", "rtc_horizon")
        settings["rtc_horizon"], settings["rtc_guidance"] = int(rtc[0]), float(rtc[1])
    if fill_check:
        if not spec.fill_check:
            raise SettingError(f"'kf_fill_check' is for the decoders that fill a rejected suffix with the Kalman "
                               f"filter ({', '.join(names_with(lambda s: s.fill_check))}), not '{name}'",
                               "kf_fill_check")
        settings["fill_check"] = True
    if kinematic_r_bounds is not None:
        r_min, r_max = kinematic_r_bounds
        if r_min > r_max:
            raise ValueError(f"'kinematic_r_min' = {r_min} exceeds 'kinematic_r_max' = {r_max}")
        if not spec.kinematic_threshold:
            raise ValueError(f"'kinematic_r_min' and 'kinematic_r_max' are for the decoders with the kinematic "
                             f"threshold ({', '.join(names_with(lambda s: s.kinematic_threshold))}), not '{name}'")
        settings["r_min"], settings["r_max"] = r_min, r_max
    return settings


def threshold_sweep(name: str, r: int) -> dict[str, Any] | None:
    """Decoder ``name``'s settings at sweep point ``r`` (:meth:`DecoderSpec.sweep_settings`)."""
    return spec_of(name).sweep_settings(r)
