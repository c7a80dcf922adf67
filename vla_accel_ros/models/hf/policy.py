"""The Hugging Face family's policy (:class:`HFPolicy`): the token-VLA policy
(:class:`~vla_accel_ros.models.token_vla.policy.HFTokenVLA`: prefill, one-pass scoring, the LM
head's 256 action rows, the draft head, the incremental prefill) over a Llava-style
image-text-to-text model (:class:`~.modules.LlavaModules`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vla_accel_ros.models.hf.modules import LlavaModules
from vla_accel_ros.models.token_vla.policy import HFTokenVLA

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from vla_accel_ros.models.token_vla.spec import VLASpec
    from vla_accel_ros.models.token_vla.statistics import ActionStatistics, OpenVLAActionTokenizer


class HFPolicy(HFTokenVLA):
    """A Llava-style Hugging Face VLA as a policy: :class:`HFTokenVLA`'s passes over :class:`LlavaModules`."""

    family = "a Hugging Face VLA"

    @classmethod
    def from_model(cls, model: Any, text_tokenizer: PreTrainedTokenizerBase, spec: VLASpec,
                   tokenizer: OpenVLAActionTokenizer, *, device: torch.device, source: str,
                   statistics: ActionStatistics | None = None) -> HFPolicy:
        """The policy of a loaded image-text-to-text ``model`` (a transformers ``PreTrainedModel``),
        moved to ``device``, with its text tokenizer, the spec and the action tokenizer (``source``
        names it in error messages)."""
        return cls(LlavaModules(model.to(device), spec, source), text_tokenizer, spec, tokenizer, source=source,
                   statistics=statistics)
