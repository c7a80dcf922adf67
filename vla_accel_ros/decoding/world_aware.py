"""World-aware KERV: the kinematic threshold, tightened near contact and loosened in free space.

Contact comes from the scene when the context has it (``target_clearance``, the sim's
gripper-to-target distance) and otherwise from the policy's learned near-contact head on the
prefix features (a real robot has no scene). Near contact the previous action does not draft
either: where a bin of error decides the grasp, the proposal comes from the draft head (and the KF
where it has earned it), which is accepted further, so less of the action is left to the KF's
unverified fill.

In free space (contact looseness from ``prefill_min_looseness``, by default where the previous
action drafts too) the cheap sources' proposal is verified inside the prefill (``prefill_verify``,
:mod:`kerv`): the action costs 6 more rows of the prefill and no pass after it. With the checked
fill (``fill_check``) that is every step by default: near contact the prefill's proposal is
rejected more often, and unchecked, the Kalman fill after the rejection is what costs grasps there;
checked, it stays within r (0.4x the kinematic r at contact) of the target's own picks. That
decision comes before the prefill, so without the scene it reads the contact head of the episode's
previous step (one control period old; none at the first step, which decodes after the prefill).
Decoding is otherwise exactly :class:`KervDecoder`'s; the contact head is read on the step's
prefill (:meth:`PassResult.contact_probability
<vla_accel_ros.decoding.protocol.PassResult.contact_probability>`: once per step, and once per
batched prefill for all its robots).
"""

from __future__ import annotations

from typing import Any, ClassVar

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.kerv import KervDecoder
from vla_accel_ros.decoding.protocol import DecodeContext, PassResult
from vla_accel_ros.decoding.specs import DecoderSpec, KervConfig, WorldAwareConfig
from vla_accel_ros.decoding.thresholds import (
    clearance_looseness,
    contact_probability_looseness,
    world_aware_threshold,
)
from vla_accel_ros.models.api import PolicyLike


def contact_looseness(prefill: PassResult, context: DecodeContext) -> float:
    """1 in free space, 0 at contact: from the scene clearance if known, else the contact head on
    the step's prefill."""
    if context.target_clearance is not None:
        return clearance_looseness(float(context.target_clearance))
    return contact_probability_looseness(prefill.contact_probability())


class WorldAwareDecoder(KervDecoder):
    spec: ClassVar[type[DecoderSpec]] = specs.WorldAware
    config_type: ClassVar[type[KervConfig]] = WorldAwareConfig
    config: WorldAwareConfig

    def __init__(self, **cfg: Any) -> None:
        super().__init__(**cfg)
        self._previous_looseness: tuple[int, float] | None = None  # (step, contact looseness) last computed

    @staticmethod
    def kinematics_only(policy: PolicyLike, context: DecodeContext) -> bool:
        """No scene clearance and no contact head: nothing tells contact, so the step is kerv's."""
        return context.target_clearance is None and not policy.capabilities().contact_head

    def contact_looseness(self, prefill: PassResult, context: DecodeContext) -> float:
        """:func:`contact_looseness`, kept for the next step's decision before its prefill."""
        value = contact_looseness(prefill, context)
        self._previous_looseness = (context.step, value)
        return value

    def looseness_before_prefill(self, context: DecodeContext) -> float | None:
        """Contact looseness known before this step's prefill: the scene's clearance, or the
        contact head's reading at the episode's previous step; None when there is neither."""
        if context.target_clearance is not None:
            return clearance_looseness(float(context.target_clearance))
        previous = self._previous_looseness
        if previous is None or previous[0] != context.step - 1:
            return None
        return previous[1]

    def hold_allowed(self, policy: PolicyLike, prefill: PassResult, context: DecodeContext) -> bool:
        if self.kinematics_only(policy, context):
            return True
        return self.contact_looseness(prefill, context) >= self.config.hold_min_looseness

    def prefill_allowed(self, policy: PolicyLike, context: DecodeContext) -> bool:
        """In free space (looseness from ``prefill_min_looseness``), judged before the prefill."""
        if self.kinematics_only(policy, context):
            return True
        looseness, minimum = self.looseness_before_prefill(context), self.config.prefill_min_looseness
        return looseness is not None and minimum is not None and looseness >= minimum

    def threshold(self, policy: PolicyLike, prefill: PassResult | None, context: DecodeContext) -> float:
        """The kinematic r scaled by contact; with ``prefill`` None (before the prefill) the contact
        known then (:meth:`looseness_before_prefill`), tight when there is none."""
        r_kin = super().threshold(policy, prefill, context)
        if self.kinematics_only(policy, context):
            return r_kin
        if prefill is None:
            looseness = self.looseness_before_prefill(context) or 0.0
        else:
            looseness = self.contact_looseness(prefill, context)
        return float(world_aware_threshold(int(r_kin), looseness, self.config.r_max))

    def after_prefill_verified(self, policy: PolicyLike, prefill: PassResult, context: DecodeContext) -> None:
        """Without the scene, the next step's decision reads this step's contact head."""
        if context.target_clearance is None and not self.kinematics_only(policy, context):
            self.contact_looseness(prefill, context)
