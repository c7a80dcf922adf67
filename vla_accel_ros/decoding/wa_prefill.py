"""Decoder names on the world-aware prefill: ``wa_prefill+X`` is decoder X, unchanged, run by a
policy whose prefill adds the world-aware bias (a checkpoint with a ``world`` component, see
:mod:`vla_accel_ros.models.own.world`). The prefix is what changes, not the decoding, so any decoder X
works: ``wa_prefill+sd``, ``wa_prefill+kerv``, ...
"""

from __future__ import annotations

from vla_accel_ros.decoding import specs

WA_PREFILL_PREFIX = "wa_prefill+"
# compared by ``vla-accel bench --wa-checkpoint``
WA_DEFAULT_BASES = (specs.SD.name, specs.Kerv.name, specs.HeiSD.name)


def split_prefill(name: str) -> tuple[str, bool]:
    """``'wa_prefill+X'`` -> ``(X, True)``; a plain decoder name -> ``(name, False)``.
    ValueError when the decoder (X or the plain name) is unknown."""
    wa = name.startswith(WA_PREFILL_PREFIX)
    base = name[len(WA_PREFILL_PREFIX):] if wa else name
    if base not in specs.names():
        choices = ", ".join(specs.names())
        raise ValueError(f"unknown decoder '{name}'; choose one of: {choices}, or {WA_PREFILL_PREFIX}<one of them>")
    return base, wa
