"""World-aware KERV: the kinematic threshold, tightened near contact and loosened in free space.

Contact comes from the scene when the context has it (``target_clearance``, the sim's
gripper-to-target distance) and otherwise from the policy's learned near-contact head on the
prefix features (a real robot has no scene). Decoding is otherwise exactly :class:`KervDecoder`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vla_accel_ros.decoding.base import DecodeContext, PolicyLike
from vla_accel_ros.decoding.kerv import KervConfig, KervDecoder
from vla_accel_ros.decoding.thresholds import (
    clearance_looseness,
    contact_probability_looseness,
    world_aware_threshold,
)


@dataclass(frozen=True)
class WorldAwareConfig(KervConfig):
    pass


def contact_looseness(policy: PolicyLike, prefix: Any, context: DecodeContext) -> float:
    """1 in free space, 0 at contact: from the scene clearance if known, else the contact head."""
    if context.target_clearance is not None:
        return clearance_looseness(float(context.target_clearance))
    return contact_probability_looseness(float(policy.contact_probability(prefix)))


class WorldAwareDecoder(KervDecoder):
    name = "world_aware"
    config_type = WorldAwareConfig

    def threshold(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> float:
        r_kin = super().threshold(policy, prefix, context)
        return float(world_aware_threshold(int(r_kin), contact_looseness(policy, prefix, context), self.config.r_max))
