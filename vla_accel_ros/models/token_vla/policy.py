"""A token VLA with OpenVLA's action tokens (:class:`HFTokenVLA`), as a policy the decoders run: the
policy of the Hugging Face family (:mod:`vla_accel_ros.models.hf`) and of OpenVLA
(:mod:`vla_accel_ros.models.openvla`), each over its own model half (:class:`~.passes.VLAModules`).

The model's 7 action dimensions are tokens of its text vocabulary (OpenVLA's layout: the image
features right after BOS); :class:`vla_accel_ros.models.token_vla.spec.VLASpec` says which, and how
the prompt, the image and the actions are made. The decoders see what they see of our own policy:

- ``prefill_batch([obs], tokens)``: ONE forward over ``[BOS] + [image token] * n_image_tokens +
  prompt + appended ids`` (the model puts the projected vision features in place of the image
  tokens) and the action tokens, if any, after them -> the prefix and the logits at the actions;
- ``score(prefix, tokens)``: ONE forward over k of our action tokens (bins 0..255, mapped to HF
  ids) -> logits (1, k+1, 256) over OUR bins (index b is HF id ``vocab_size - 1 - b`` by
  default), logits[:, i] the distribution after tokens[:, :i], and the extended prefix;
- ``tokens_to_action``: OpenVLA's decoding.

The LM head runs on the 256 action rows only (exact for those logits, and the full head's cost
is the vocabulary's). Bin 255 (HF id ``vocab_size - 256``, OpenVLA's token of a value at q99) is
a real output here, unlike our own policy's: it is scored and fed as itself and decodes as bin
254, as in OpenVLA. A draft head is optional: an EAGLE-style head on the model's hidden states
(:mod:`vla_accel_ros.models.token_vla.draft`, ``vla-accel train-draft``), loaded when its files lie beside
the weights or in the directory the ``draft_head`` option names (:func:`attach_saved_draft`); there
is no parallel draft, contact or flow head (:meth:`HFTokenVLA.capabilities`).
:meth:`HFTokenVLA.incremental_prefill` gives the VLA-Cache-style prefill that reuses the keys and
values of unchanged image tokens between frames (:mod:`vla_accel_ros.models.token_vla.incremental`).

Prefixes are immutable while the model's KV cache is mutated in place (:mod:`.cache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.api import PolicyCapabilities, Prefix, ScoreOutput
from vla_accel_ros.models.token_vla.cache import crop_cache
from vla_accel_ros.models.token_vla.draft import DRAFT_META_FILE, DRAFT_WEIGHTS_FILE, HFDraftHead, load_hf_draft
from vla_accel_ros.models.token_vla.passes import HFPasses, VLAModules
from vla_accel_ros.models.token_vla.spec import VLASpec
from vla_accel_ros.models.token_vla.statistics import (
    ActionStatistics,
    OpenVLAActionTokenizer,
    load_action_statistics,
)
from vla_accel_ros.models.tokenizer import BOS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from vla_accel_ros.models.configuration import VisionReuseConfig
    from vla_accel_ros.models.token_vla.incremental import HFIncrementalPrefill

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFTokenVLA(HFPasses):
    """A token VLA whose actions are 7 tokens of its text vocabulary, as a
    :class:`~vla_accel_ros.models.api.TokenScoring` policy (module docstring). A family builds one
    (:func:`vla_accel_ros.models.hf.checkpoint.load_hf_vla`,
    :func:`vla_accel_ros.models.openvla.checkpoint.load_openvla`); the constructor takes the model
    half (:class:`~.passes.VLAModules`), its text tokenizer, the spec and the action tokenizer
    (``source`` names the model in error messages). ``draft``: the optional draft head
    (:meth:`attach_draft`). Its passes are :class:`~.passes.HFPasses`'."""

    flow: Any = None  # no continuous action head
    parallel_draft: Any = None  # no parallel draft head
    family = "a token VLA"  # what error messages call the model

    def __init__(self, modules: VLAModules, text_tokenizer: PreTrainedTokenizerBase, spec: VLASpec,
                 tokenizer: OpenVLAActionTokenizer, *, source: str = "<in-memory model>",
                 statistics: ActionStatistics | None = None) -> None:
        super().__init__(modules, text_tokenizer, spec, source=source, statistics=statistics)
        self.tokenizer = tokenizer
        self.draft: HFDraftHead | None = None

    # --- what the policy offers ---------------------------------------------------------------
    def n_parameters(self) -> dict[str, int]:
        """Parameter counts by component, as ``Policy.n_parameters`` reports them."""
        counts = {"target": sum(p.numel() for p in self.model.parameters())}
        if self.draft is not None:
            counts["draft"] = sum(p.numel() for p in self.draft.parameters())
        return counts

    def capabilities(self) -> PolicyCapabilities:
        """Action tokens; a draft head when one is attached; no parallel draft, contact or flow
        head; its own incremental prefill (:mod:`vla_accel_ros.models.token_vla.incremental`)."""
        return PolicyCapabilities(token_scoring=True, draft_head=self.draft is not None, incremental_prefill=True,
                                  resizes_images=True)

    def incremental_prefill(self, config: VisionReuseConfig) -> HFIncrementalPrefill:
        """This VLA's own incremental prefill: what serves a runner's ``vision`` settings in place of
        the package policy's incremental vision encoder (reused keys/values only: ``config.reuse_kv``
        must be true; :mod:`vla_accel_ros.models.token_vla.incremental`)."""
        from vla_accel_ros.models.token_vla.incremental import HFIncrementalPrefill

        return HFIncrementalPrefill(self, config)

    def attach_draft(self, head: HFDraftHead | None) -> None:
        """Draft with ``head`` (moved to the model's device), or with none; ValueError when it
        was made for a model of another hidden size or text vocabulary."""
        if head is not None:
            config = head.config
            if config.hidden_size != self.config.d_model:
                raise ValueError(f"{self.source}: the draft head reads hidden states of size {config.hidden_size}, "
                                 f"the model's are {self.config.d_model}")
            if config.vocab_size != self.config.vocab_size:
                raise ValueError(f"{self.source}: the draft head was made for a text vocabulary of "
                                 f"{config.vocab_size} tokens, the model's has {self.config.vocab_size}")
            head = head.to(self.device)
        self.draft = head

    @property
    def n_action_tokens(self) -> int:
        return self.config.n_action_tokens

    @property
    def image_size(self) -> int:
        return self.config.image_size

    def draft_tokens(
        self, prefix: Prefix, n: int, last_token: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Propose n tokens after the prefix with the draft head: (tokens (1, n), logits (1, n, 256)),
        as ``Policy.draft_tokens``. ``last_token`` (1,) is the token the prefix consumed last; None
        (or our BOS) means the start of the action. The first proposal is the LM head of
        ``prefix.hidden_last``, the target's own token; the others come from the head
        (:meth:`HFDraftHead.propose`). No target pass is run. ``noise``: the step's sampling noise
        (7, 256), each proposal then the argmax of its logits plus its dimension's noise."""
        if self.draft is None:
            raise ValueError(f"{self.source}: {self.family} with no draft head (capabilities().draft_head is "
                             "False): train one (vla-accel train-draft), or use a decoder that proposes without one "
                             "(ar, kerv, world_aware)")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._check_last_token(prefix, last_token)
        with torch.inference_mode():
            return self.draft.propose(prefix.hidden_last, prefix.n_tokens, n, self.action_embeddings,
                                      self.action_logits, noise)

    def tokens_to_action(self, tokens: torch.Tensor | np.ndarray) -> np.ndarray:
        """Action (7,) float64 of 7 of our tokens: OpenVLA's ``predict_action`` decoding (bin
        centre, unnormalised where the mask is true), then the spec's gripper convention."""
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.detach().cpu().numpy()
        tokens = np.asarray(tokens).reshape(-1)
        if tokens.shape != (self.n_action_tokens,):
            raise ValueError(f"expected {self.n_action_tokens} tokens, got shape {tokens.shape}")
        return self.tokenizer.decode(tokens)

    # --- passes -------------------------------------------------------------------------------
    def prefill(self, obs: Observation) -> Prefix:
        """The prefix of one observation (``prefill_batch`` of it alone, without action tokens)."""
        return self.prefill_batch([obs]).prefix

    def prefill_batch(self, observations: Sequence[Observation], tokens: torch.Tensor | None = None) -> ScoreOutput:
        """ONE forward over one observation's prompt (the image in place of its image tokens) and, when
        given, the k action tokens (1, k) after it (causal, so the prompt's rows are the prefill's).
        A batch of one observation: this family has no batched passes."""
        if len(observations) != 1:
            raise ValueError(f"{self.source}: {self.family} prefills one observation at a time, "
                             f"got {len(observations)}")
        with torch.inference_mode():
            checked = None if tokens is None else self.check_tokens(tokens)
            hidden, slot = self.prompt_pass(observations[0], checked)
            k = 0 if checked is None else checked.shape[1]
            n = hidden.shape[1] - k
            prefix = Prefix(cache=slot, action_hidden=hidden[:, n - 1:],
                            tokens=self._no_tokens() if checked is None else checked,
                            pooled=hidden[:, :n].float().mean(dim=1), prefix_len=n)
            return ScoreOutput(self.action_logits(prefix.action_hidden), prefix)

    def score(self, prefix: Prefix, tokens: torch.Tensor) -> ScoreOutput:
        """ONE forward over k new tokens (1, k) after the prefix; logits (1, k+1, 256)."""
        with torch.inference_mode():
            given, tokens = tokens, self.check_tokens(tokens)
            k = tokens.shape[1]
            if k == 0:  # nothing to run: the prefix's last hidden state already predicts the next token
                return ScoreOutput(self.action_logits(prefix.action_hidden[:, -1:]),
                                   replace(prefix, base=prefix.n_tokens))
            # read where the caller made them (on the host, no wait for the device); the prefix's
            # tokens are the accepted ones, the one read back from the device
            slot, mine, new = prefix.cache, prefix.tokens[0].tolist(), given[0].tolist()
            # The cache holds the tokens of its latest use; keep what this prefix shares with them
            # and re-feed the rest of the prefix's own before the new ones.
            slot.check_current()
            common, held = 0, slot.tokens
            while common < min(len(mine), len(held)) and mine[common] == held[common]:
                common += 1
            crop_cache(slot.cache, prefix.prefix_len + common)
            # the tokens to feed are on the device already: nothing crosses from the host
            feed = self._hf_ids[torch.cat([prefix.tokens[0, common:], tokens[0]])]
            slot.tokens = mine + new
            hidden = self.extend(feed.unsqueeze(0), slot.cache)[:, -k:]
            extended = Prefix(cache=slot, action_hidden=torch.cat([prefix.action_hidden, hidden], dim=1),
                              tokens=torch.cat([prefix.tokens, tokens], dim=1), pooled=prefix.pooled,
                              prefix_len=prefix.prefix_len, base=prefix.n_tokens)
            return ScoreOutput(self.action_logits(extended.action_hidden[:, -(k + 1):]), extended)

    @staticmethod
    def _check_last_token(prefix: Prefix, last_token: torch.Tensor | None) -> None:
        """``last_token`` must be the prefix's last consumed token (None or BOS at the start)."""
        if last_token is None:
            if prefix.n_tokens:
                raise ValueError(f"last_token=None means the start of the action, but the prefix holds "
                                 f"{prefix.n_tokens} tokens")
            return
        if tuple(last_token.shape) != (prefix.batch_size,):
            raise ValueError(f"last_token must be (B={prefix.batch_size},), got {tuple(last_token.shape)}")
        expected = prefix.tokens[:, -1].tolist() if prefix.n_tokens else [BOS] * prefix.batch_size
        if last_token.tolist() != expected:
            raise ValueError("last_token must be the token the prefix consumed last (BOS at the start of the "
                             f"action): got {last_token.tolist()}, the prefix ends with {expected}")


# --- what a family's loader shares -----------------------------------------------------------
def spec_choices(directory: Path, spec: VLASpec,
                 config: dict[str, Any] | None = None) -> tuple[ActionStatistics, OpenVLAActionTokenizer, torch.device]:
    """What the spec of the model in ``directory`` chooses: the action statistics of its
    ``unnorm_key`` (``config``: its ``config.json`` as parsed, for their ``norm_stats``; None: read
    when needed), the action tokenizer made of them, and the device; ValueError naming the file or
    key at fault."""
    statistics = load_action_statistics(directory, spec, config)
    tokenizer = OpenVLAActionTokenizer.from_statistics(statistics, spec.gripper)
    try:
        return statistics, tokenizer, torch.device(spec.device)
    except RuntimeError as error:
        raise ValueError(f"device {spec.device!r}: {error}") from None


def attach_saved_draft(policy: HFTokenVLA, directory: Path, head_directory: Path | None = None) -> None:
    """Attach the draft head ``vla-accel train-draft`` saved: the one in ``head_directory`` when given
    (``train-draft --out``, the ``draft_head`` option; ValueError when it holds none), else the one
    beside the weights in ``directory``, if there is one. ValueError naming its file when it was made
    for another model."""
    ids = policy.action_ids
    head = load_hf_draft(head_directory or directory, hidden_size=policy.config.d_model,
                         vocab_size=policy.config.vocab_size, action_ids=(int(ids[0]), int(ids[-1])),
                         device=policy.device)
    if head is None and head_directory is not None:
        raise ValueError(f"{head_directory}: no draft head ({DRAFT_WEIGHTS_FILE} and {DRAFT_META_FILE}, written by "
                         "vla-accel train-draft --out) for draft_head")
    policy.attach_draft(head)
