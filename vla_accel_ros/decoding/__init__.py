"""Decoders for the policy's 7 action tokens, by name, and the continuous action head
(``flow10``/``flow2``), which takes their place after the same prefill.

``make_decoder(name, **cfg)`` builds one; ``DECODERS`` lists the names. Each decoder's
``decode(policy, prefix, context) -> DecodeResult``; :func:`vla_accel_ros.runtime.runner.run_policy_step` adds the prefill.

What a decoder needs and does is asked, never inferred from its name: ``capabilities_of(name)``
(its :class:`DecoderCapabilities` at default settings) and ``decoders_with(predicate)``;
``policy_refusal(policy, name)`` says why a policy cannot serve a decoder (a missing head). The
registry also names the decoders that the evaluation treats specially: ``BASELINE`` (every
speed-up is against it), the threshold sweep (``threshold_sweep``, ``THRESHOLD_SWEPT``), the
pair compared at the same r bounds (``CONTACT_COMPARISON``) and the decoders whose per-step
threshold is plotted (``THRESHOLD_TRACED``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vla_accel_ros.decoding.ar import ARDecoder
from vla_accel_ros.decoding.deadline import DeadlineDecoder
from vla_accel_ros.decoding.flow import Flow2Decoder, FlowDecoder
from vla_accel_ros.decoding.heisd import HeiSDDecoder
from vla_accel_ros.decoding.history import EpisodeHistory
from vla_accel_ros.decoding.kerv import KervDecoder
from vla_accel_ros.decoding.kerv_released import KervReleasedDecoder
from vla_accel_ros.decoding.protocol import (
    DecodeContext,
    Decoder,
    DecoderCapabilities,
    DecodeResult,
    PolicyLike,
)
from vla_accel_ros.decoding.sd import SDDecoder
from vla_accel_ros.decoding.speculation import accepted_length, relaxed_accept_mask
from vla_accel_ros.decoding.world_aware import WorldAwareDecoder

_REGISTRY: dict[str, type[Decoder]] = {
    "ar": ARDecoder,
    "sd": SDDecoder,
    "kerv_released": KervReleasedDecoder,
    "kerv": KervDecoder,
    "world_aware": WorldAwareDecoder,
    "deadline": DeadlineDecoder,
    "heisd": HeiSDDecoder,  # hybrid drafter / retrieval SD, needs a store from `vla-accel build-store`
    "flow10": FlowDecoder,  # continuous action head (teacher), needs `vla-accel train-flow`
    "flow2": Flow2Decoder,  # its distilled 2-step student
}
DECODERS: tuple[str, ...] = tuple(_REGISTRY)
BASELINE = "ar"  # the reference decoder: speed-ups are measured against it, in the same run
# Traced over a range of acceptance thresholds (success against speed-up as r loosens): the fixed
# threshold and the kinematic one.
THRESHOLD_SWEPT: tuple[str, ...] = ("sd", "kerv")
# The same kinematic threshold without and with the contact signal: at the same (loose) r bounds,
# what contact awareness does to near-contact failures.
CONTACT_COMPARISON: tuple[str, str] = ("kerv", "world_aware")
# Plotted step by step (threshold and acceptance over one episode): the adaptive thresholds, with
# sd's fixed one for reference.
THRESHOLD_TRACED: tuple[str, ...] = ("kerv", "world_aware", "sd", "kerv_released")


def _decoder_type(name: str) -> type[Decoder]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown decoder '{name}'; choose one of: {', '.join(DECODERS)}")
    return _REGISTRY[name]


def make_decoder(name: str, **cfg: Any) -> Decoder:
    """A decoder by name; ``cfg`` goes to its config (e.g. ``r=9`` for sd, ``r_min``/``r_max``)."""
    decoder_type = _decoder_type(name)
    try:
        return decoder_type(**cfg)
    except TypeError as err:
        raise ValueError(f"bad settings for decoder '{name}': {err}") from err


def capabilities_of(name: str) -> DecoderCapabilities:
    """The capabilities of decoder ``name`` with its default settings (ValueError when unknown)."""
    return _decoder_type(name)().capabilities()


def policy_refusal(policy: PolicyLike, name: str) -> str:
    """Why ``policy`` cannot serve decoder ``name`` at its default settings ('' when it can)."""
    try:
        make_decoder(name).check_policy(policy)
    except ValueError as err:
        return str(err)
    return ""


def decoders_with(predicate: Callable[[DecoderCapabilities], bool]) -> tuple[str, ...]:
    """The registered decoders, in registry order, whose default capabilities satisfy ``predicate``
    (e.g. ``decoders_with(lambda c: c.flow_head)``)."""
    return tuple(name for name in DECODERS if predicate(capabilities_of(name)))


def threshold_sweep(name: str, r: int) -> dict[str, Any] | None:
    """The settings of decoder ``name`` at sweep point ``r`` (:meth:`Decoder.threshold_settings`),
    None for a decoder outside ``THRESHOLD_SWEPT`` (ValueError when unknown)."""
    decoder_type = _decoder_type(name)
    return decoder_type.threshold_settings(r) if name in THRESHOLD_SWEPT else None


__all__ = [
    "BASELINE",
    "CONTACT_COMPARISON",
    "DECODERS",
    "THRESHOLD_SWEPT",
    "THRESHOLD_TRACED",
    "DecodeContext",
    "DecodeResult",
    "Decoder",
    "DecoderCapabilities",
    "EpisodeHistory",
    "PolicyLike",
    "accepted_length",
    "capabilities_of",
    "decoders_with",
    "make_decoder",
    "relaxed_accept_mask",
    "threshold_sweep",
]
