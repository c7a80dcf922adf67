"""Decoders for the policy's action tokens, and the continuous action heads (``flow10``/``flow2``),
which take their place after the same prefill.

:mod:`vla_accel_ros.decoding.specs` defines every decoder: name, settings, capabilities and
implementation (``make_decoder(name, **settings)`` builds one). It imports without torch; the names
of :mod:`.protocol` below load on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vla_accel_ros.decoding.specs import (
    BASELINE,
    make_decoder,
    names,
    names_with,
    spec_of,
    threshold_sweep,
)

if TYPE_CHECKING:
    from vla_accel_ros.decoding.protocol import DecodeContext, Decoder, DecodeResult

_LAZY = {"DecodeContext": "protocol", "Decoder": "protocol", "DecodeResult": "protocol"}

__all__ = ["BASELINE", "DecodeContext", "DecodeResult", "Decoder", "make_decoder", "names", "names_with", "spec_of",
           "threshold_sweep"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
