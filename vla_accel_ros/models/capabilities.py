"""What a policy offers the decoders beyond prefill and one-pass scoring, declared, never probed.

Every policy the runner drives (the package's own VLA, a Hugging Face VLA) implements ``prefill``,
``prefill_scored``, ``score`` and ``tokens_to_action``; the heads below are optional. A decoder
that needs one the policy lacks either falls back in a documented way or is refused at start-up
(``Decoder.check_policy``). Importable without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyCapabilities:
    """draft_head: ``draft_tokens`` (a light EAGLE-style head on the target's hidden states).
    parallel_draft_head: ``draft_tokens_parallel`` (every token of the action in one pass).
    contact_head: ``contact_probability`` (how near the gripper is to contact).
    flow_head: ``flow`` (the continuous action head).
    own_incremental_prefill: ``incremental_prefill(config)`` (the policy reuses unchanged image
    tokens its own way; without it, :mod:`vla_accel_ros.models.own.incremental_vision` does)."""

    draft_head: bool = False
    parallel_draft_head: bool = False
    contact_head: bool = False
    flow_head: bool = False
    own_incremental_prefill: bool = False

    def missing(self) -> list[str]:
        return [name for name, present in vars(self).items() if not present]
