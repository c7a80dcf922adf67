"""Which decoders the evaluation sets side by side, and how (``vla-accel bench``, ``eval``), named by
their specs (:mod:`vla_accel_ros.decoding.specs`). Importable without torch.
"""

from __future__ import annotations

from vla_accel_ros.decoding import specs

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
