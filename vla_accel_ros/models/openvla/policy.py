"""OpenVLA's policy (:class:`OpenVLAPolicy`): the token-VLA policy the Hugging Face family runs too
(:class:`~vla_accel_ros.models.token_vla.policy.HFTokenVLA`: prefill, one-pass scoring with cache
rollback, verification inside the prefill, the LM head's 256 action rows, the draft head, the
incremental prefill), over OpenVLA's model half (:class:`~.modules.OpenVLAModules`)."""

from __future__ import annotations

from vla_accel_ros.models.token_vla.policy import HFTokenVLA


class OpenVLAPolicy(HFTokenVLA):
    """OpenVLA as a policy: :class:`HFTokenVLA`'s passes over :class:`~.modules.OpenVLAModules`."""

    family = "an OpenVLA model"
