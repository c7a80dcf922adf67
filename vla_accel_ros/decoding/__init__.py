"""Decoders for the policy's action tokens, and the continuous action heads (``flow10``/``flow2``),
which take their place after the same prefill.

:mod:`vla_accel_ros.decoding.specs` defines every decoder: name, settings, capabilities and
implementation; :func:`make_decoder` builds one, importing its implementation (and torch) on first
use. The names of :mod:`.protocol` below load on first use too (PEP 562), so this package imports
without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vla_accel_ros.decoding.specs import (
    BASELINE,
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


def make_decoder(name: str, **settings: Any) -> Decoder:
    """A decoder by name; ``settings`` go to its settings dataclass (e.g. ``r=9`` for sd).
    ValueError names an unknown decoder or setting."""
    module, _, class_name = spec_of(name).implementation.partition(":")
    decoder_class = getattr(importlib.import_module(module), class_name)
    try:
        decoder: Decoder = decoder_class(**settings)
    except TypeError as err:
        raise ValueError(f"bad settings for decoder '{name}': {err}") from err
    return decoder


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
