"""Which decoders the evaluation sets side by side, and how (``vla-accel bench``, ``eval``), named by
their specs (:mod:`vla_accel_ros.decoding.specs`): the baseline, the r sweep, the bench's extra rows
and their names. Importable without torch (``vla-accel bench --help`` lists them).
"""

from __future__ import annotations

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.specs import names_with

BASELINE = specs.BASELINE  # every speed-up is measured against it, in the same run
# Traced over a range of acceptance thresholds (success against speed-up as r loosens): the decoders
# with a threshold to sweep (the fixed one, and the kinematic one).
THRESHOLD_SWEPT: tuple[str, ...] = specs.names_with(lambda spec: spec.sweep_settings(1) is not None)
# The same kinematic threshold without and with the contact signal: at the same (loose) r bounds,
# what contact awareness does to near-contact failures.
CONTACT_COMPARISON: tuple[str, str] = (specs.Kerv.name, specs.WorldAware.name)
# Plotted step by step (threshold and acceptance over one episode): the adaptive thresholds, with
# sd's fixed one for reference.
THRESHOLD_TRACED: tuple[str, ...] = (specs.Kerv.name, specs.WorldAware.name, specs.SD.name, specs.KervReleased.name)

SWEEP_R = (3, 5, 9, 15, 20)
# The bench's extra rows are named DECODER + suffix (and ar@T=0.5 for the temperature sweep).
SEQUENTIAL_SUFFIX = "@sequential"
AFTER_PREFILL_SUFFIX = "@after_prefill"
FILL_CHECK_SUFFIX = "@fill_check"
TEMPERATURE_PREFIX = "@T="


def parallel_draft_decoders() -> tuple[str, ...]:
    """The decoders that draft with the parallel head when the checkpoint has one (``@sequential`` rows)."""
    return names_with(lambda spec: spec.parallel_draft)


def prefill_verifying_decoders() -> tuple[str, ...]:
    """The decoders that verify inside the prefill by default (``@after_prefill`` rows)."""
    return names_with(lambda spec: spec.verifies_in_prefill)


def fill_check_decoders() -> tuple[str, ...]:
    """The decoders whose Kalman fill can be checked against the target's picks (``@fill_check`` rows)."""
    return names_with(lambda spec: spec.fill_check)


def flow_head_decoders() -> tuple[str, ...]:
    """The decoders that need a checkpoint with a continuous action head."""
    return names_with(lambda spec: spec.flow_head)


def store_decoders() -> tuple[str, ...]:
    """The decoders that need a retrieval store."""
    return names_with(lambda spec: spec.retrieval_store)
