"""Decoders for the policy's 7 action tokens, by name, and the continuous action head
(``flow10``/``flow2``), which takes their place after the same prefill.

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
from vla_accel_ros.decoding.flow import Flow2Decoder, FlowDecoder
from vla_accel_ros.decoding.heisd import HeiSDDecoder
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
    "heisd": HeiSDDecoder,  # hybrid drafter / retrieval SD, needs a store from `vla-accel build-store`
    "flow10": FlowDecoder,  # continuous action head (teacher), needs `vla-accel train-flow`
    "flow2": Flow2Decoder,  # its distilled 2-step student
}
DECODERS: tuple[str, ...] = tuple(_REGISTRY)
FLOW_DECODERS: tuple[str, ...] = ("flow10", "flow2")  # need a checkpoint with a continuous action head
STORE_DECODERS: tuple[str, ...] = ("heisd",)  # need a retrieval store (vla-accel build-store)


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
    "FLOW_DECODERS",
    "STORE_DECODERS",
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
