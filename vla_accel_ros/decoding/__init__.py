"""Decoders for the policy's 7 action tokens, by name.

``make_decoder(name, **cfg)`` builds one; ``DECODERS`` lists the names. Each decoder's
``decode(policy, prefix, context) -> DecodeResult``; :func:`run_policy_step` adds the prefill.
"""

from __future__ import annotations

from typing import Any

from vla_accel_ros.decoding.ar import ARDecoder
from vla_accel_ros.decoding.base import (
    DecodeContext,
    Decoder,
    DecodeResult,
    EpisodeHistory,
    PolicyLike,
    accepted_length,
    relaxed_accept_mask,
    run_policy_step,
)
from vla_accel_ros.decoding.deadline import DeadlineDecoder
from vla_accel_ros.decoding.kerv import KervDecoder
from vla_accel_ros.decoding.kerv_released import KervReleasedDecoder
from vla_accel_ros.decoding.sd import SDDecoder
from vla_accel_ros.decoding.world_aware import WorldAwareDecoder

_REGISTRY: dict[str, type] = {
    "ar": ARDecoder,
    "sd": SDDecoder,
    "kerv_released": KervReleasedDecoder,
    "kerv": KervDecoder,
    "world_aware": WorldAwareDecoder,
    "deadline": DeadlineDecoder,
}
DECODERS: tuple[str, ...] = tuple(_REGISTRY)


def make_decoder(name: str, **cfg: Any) -> Decoder:
    """A decoder by name; ``cfg`` goes to its config (e.g. ``r=9`` for sd, ``r_min``/``r_max``)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown decoder '{name}'; choose one of: {', '.join(DECODERS)}")
    try:
        return _REGISTRY[name](**cfg)
    except TypeError as err:
        raise ValueError(f"bad settings for decoder '{name}': {err}") from err


__all__ = [
    "DECODERS",
    "DecodeContext",
    "DecodeResult",
    "Decoder",
    "EpisodeHistory",
    "PolicyLike",
    "accepted_length",
    "make_decoder",
    "relaxed_accept_mask",
    "run_policy_step",
]
