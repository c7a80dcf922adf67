"""World-aware KERV: the kinematic threshold, tightened near contact and loosened in free space.

Contact comes from the scene when the context has it (``target_clearance``, the sim's
gripper-to-target distance) and otherwise from the policy's learned near-contact head on the
prefix features (a real robot has no scene). Near contact the previous action does not draft
either: where a bin of error decides the grasp, the proposal comes from the draft head (and the KF
where it has earned it), which is accepted further, so less of the action is left to the KF's
unverified fill. Decoding is otherwise exactly :class:`KervDecoder`.
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
    # contact looseness (0 at contact, 1 in free space) below which the previous action does not
    # draft: 0.5 is about 6 cm from the target with the scene's clearance
    hold_min_looseness: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.hold_min_looseness <= 1.0:
            raise ValueError(f"WorldAwareConfig.hold_min_looseness must be in [0, 1], got {self.hold_min_looseness}")


def contact_looseness(policy: PolicyLike, prefix: Any, context: DecodeContext) -> float:
    """1 in free space, 0 at contact: from the scene clearance if known, else the contact head."""
    if context.target_clearance is not None:
        return clearance_looseness(float(context.target_clearance))
    return contact_probability_looseness(float(policy.contact_probability(prefix)))


class WorldAwareDecoder(KervDecoder):
    name = "world_aware"
    config_type = WorldAwareConfig

    def __init__(self, **cfg: Any) -> None:
        super().__init__(**cfg)
        self._last_contact: tuple[Any, DecodeContext, float] | None = None

    def contact_looseness(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> float:
        """:func:`contact_looseness`, computed once per (prefix, context): the threshold and the
        drafting decision of one step both ask (on a robot it is a contact-head forward)."""
        last = self._last_contact
        if last is not None and last[0] is prefix and last[1] is context:
            return last[2]
        value = contact_looseness(policy, prefix, context)
        self._last_contact = (prefix, context, value)
        return value

    def hold_allowed(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> bool:
        return self.contact_looseness(policy, prefix, context) >= self.config.hold_min_looseness

    def threshold(self, policy: PolicyLike, prefix: Any, context: DecodeContext) -> float:
        r_kin = super().threshold(policy, prefix, context)
        looseness = self.contact_looseness(policy, prefix, context)
        return float(world_aware_threshold(int(r_kin), looseness, self.config.r_max))
