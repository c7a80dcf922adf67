"""The policy contract: what every model family offers the runtime and the decoders.

A policy is one family's model behind these calls (the package's own VLA, :mod:`.own`; a Hugging
Face VLA, :mod:`.hf`); :mod:`.load` recognises which family a checkpoint directory holds.

- ``prefill_batch(observations, tokens)``: ONE target pass over a batch of observation prefixes,
  with k action tokens (a decoder's proposal) riding along after each; ``prefill(obs)`` is its
  batch of one without tokens, returning the prefix.
- ``score(prefix, tokens)``: ONE target pass over k tokens after a prefix.
- ``draft_tokens`` / ``draft_tokens_parallel``, ``contact_probability``: the optional heads, as
  ``capabilities()`` declares them (never probed).
- ``tokens_to_action`` and the action tokenizer; ``config`` (:class:`PolicyConfig`) says what the
  decoders need of the model's shape.
- ``incremental_prefill(settings)``: the family's own way to reuse what earlier frames computed
  (:class:`IncrementalPrefill`), declared by ``capabilities().incremental_prefill``.

Every prefix is a :class:`Prefix`, whatever the family: its keys and values are the family's own
(:class:`PrefixCache`), the rest is shared. Importable without torch (tensors are type hints only),
and so is :class:`CheckpointRef`, the parsed name of a checkpoint that travels to an inference process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.models.configuration import VisionReuseConfig


# --- capabilities -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyCapabilities:
    """What a policy offers beyond prefill and one-pass scoring, declared by the family.

    draft_head: ``draft_tokens`` (a light EAGLE-style head on the target's hidden states).
    parallel_draft_head: ``draft_tokens_parallel`` (every token of the action in one pass).
    contact_head: ``contact_probability`` (how near the gripper is to contact).
    flow_head: ``flow`` (the continuous action head).
    incremental_prefill: ``incremental_prefill(settings)`` (reuse of unchanged image tokens).
    batched_passes: ``prefill_batch`` and ``score`` take a batch of several observations.
    flow_chunks: ``sample_chunk(prefix, noise, steps, guide=None, student=False)``: a flow VLA that
        samples a whole chunk from its prefix's keys and values (LeRobot's SmolVLA and π0), with
        ``noise_shape()``; no action tokens. ``student``: its fitted 2-step sampler when it has one.
    action_chunk: the prefill predicts a whole chunk of actions in its one pass, read with
        ``action_chunk(prefix)`` (OpenVLA-OFT's parallel decoding); the policy has no action
        tokens, so no token decoder applies.
    chunk_guidance: with ``flow_chunks``, ``sample_chunk(prefix, noise, steps, guide)`` takes a
        real-time chunking guide in its own space, ``sample_space(actions)`` (SmolVLA, π0).
    image_slots: camera images one observation holds (``Observation.images``, in slot order).
    """

    draft_head: bool = False
    parallel_draft_head: bool = False
    contact_head: bool = False
    flow_head: bool = False
    incremental_prefill: bool = False
    batched_passes: bool = False
    flow_chunks: bool = False
    action_chunk: bool = False
    chunk_guidance: bool = False
    image_slots: int = 1

    def missing(self) -> list[str]:
        return [name for name, present in vars(self).items() if isinstance(present, bool) and not present]


class PolicyConfig(Protocol):
    """What the runtime and the decoders read of a policy's configuration."""

    @property
    def d_model(self) -> int:
        """Width of the hidden states a prefix holds (``Prefix.pooled``; what a retrieval store keys on)."""
        ...

    @property
    def image_size(self) -> int:
        """Side of the square image the model takes (the node resizes camera frames to it)."""
        ...

    @property
    def n_action_tokens(self) -> int:
        """Action tokens per action (one per action dimension)."""
        ...

    @property
    def n_bins(self) -> int:
        """Vocabulary of action bins (token ids 0 .. n_bins - 1)."""
        ...


# --- prefixes ---------------------------------------------------------------------------------
class PrefixCache(Protocol):
    """A family's keys and values behind a :class:`Prefix`."""

    def cropped(self, length: int) -> PrefixCache:
        """The cache holding only positions before ``length`` (a new view; this one unchanged)."""
        ...

    def rows(self, rows: list[int]) -> PrefixCache:
        """Batch rows ``rows``, in that order."""
        ...


@dataclass(frozen=True, eq=False)
class Prefix:
    """Decoder state after an observation's prefix and any action tokens consumed.

    cache: the family's keys and values. action_hidden: (B, n+1, d) final hidden states at the
    prefix's end and after each of the n consumed tokens (what the LM head reads). tokens: (B, n)
    consumed action tokens. pooled: (B, d) mean of the final hidden states over the observation
    prefix. prefix_len: positions of the observation prefix. base: tokens consumed before the latest
    ``score`` extension; :meth:`truncate` counts from there. Tensors are never written in place.
    """

    cache: Any
    action_hidden: torch.Tensor
    tokens: torch.Tensor
    pooled: torch.Tensor
    prefix_len: int
    base: int = 0
    # (B, 2d * (slots - 1)): the flow head's condition from the other cameras' images (None: one camera)
    camera_condition: torch.Tensor | None = None

    @property
    def hidden_last(self) -> torch.Tensor:
        """(B, d) hidden state at the current end; the LM head of it gives the next token."""
        return self.action_hidden[:, -1]

    @property
    def length(self) -> int:
        """Positions the prefix covers: the observation prefix and the consumed tokens."""
        return self.prefix_len + self.n_tokens

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, i: int) -> Prefix:
        """Batch row ``i`` alone (a batch of 1): one robot's prefix out of a batched prefill."""
        return self.select_rows([i])

    def select_rows(self, rows: list[int]) -> Prefix:
        """Batch rows ``rows``, in that order, as a batch of their own."""
        if rows and rows == list(range(rows[0], rows[0] + len(rows))):
            span = slice(rows[0], rows[0] + len(rows))
            return replace(self, cache=self.cache.rows(rows), action_hidden=self.action_hidden[span],
                           tokens=self.tokens[span], pooled=self.pooled[span])
        import torch

        index = torch.tensor(rows, dtype=torch.long, device=self.tokens.device)
        return replace(self, cache=self.cache.rows(rows), action_hidden=self.action_hidden.index_select(0, index),
                       tokens=self.tokens.index_select(0, index), pooled=self.pooled.index_select(0, index))

    def truncate(self, m: int) -> Prefix:
        """The prefix as it was before the latest extension plus its first m new tokens."""
        added = self.n_tokens - self.base
        if not 0 <= m <= added:
            raise ValueError(f"truncate({m}): the latest extension added {added} tokens")
        keep = self.base + m
        return replace(self, cache=self.cache.cropped(self.prefix_len + keep),
                       action_hidden=self.action_hidden[:, : keep + 1], tokens=self.tokens[:, :keep])


@dataclass(frozen=True, eq=False)
class ScoreOutput:
    """logits (B, k+1, n_bins) float32 over the action bins: logits[:, i] is the next-token
    distribution after tokens[:, :i]; prefix: the prefix extended by the k tokens."""

    logits: torch.Tensor
    prefix: Prefix


# --- incremental prefill ----------------------------------------------------------------------
@dataclass(frozen=True)
class ReuseStats:
    """What one frame cost: image tokens recomputed (of ``n_patches``) and whether it was a full
    refresh (``reason``: why)."""

    recomputed: int
    n_patches: int
    refreshed: bool
    reason: str = ""

    @property
    def fraction(self) -> float:
        return self.recomputed / self.n_patches


@runtime_checkable
class IncrementalPrefill(Protocol):
    """A policy's prefill over a stream of frames (batch 1) that reuses what earlier frames computed
    for the image tokens that did not change; ``last`` says what the latest frame recomputed."""

    last: ReuseStats | None

    def reset(self) -> None:
        """Forget the cache: the next frame is a full prefill."""
        ...

    def prefill_batch(self, observations: Sequence[Observation], tokens: torch.Tensor | None = None) -> ScoreOutput:
        """The policy's ``prefill_batch`` of one observation, reusing what earlier frames computed."""
        ...


# --- the policy -------------------------------------------------------------------------------
@runtime_checkable
class PolicyLike(Protocol):
    """A policy as the runtime and the decoders use it (the module docstring)."""

    config: Any  # a PolicyConfig
    tokenizer: Any  # the action tokenizer: encode / decode between actions and bins
    flow: Any  # the continuous action head, with capabilities().flow_head
    parallel_draft: Any  # the parallel draft head, with capabilities().parallel_draft_head

    @property
    def n_action_tokens(self) -> int: ...

    def capabilities(self) -> PolicyCapabilities: ...

    def prefill(self, obs: Observation) -> Prefix: ...

    def prefill_batch(self, observations: Sequence[Observation], tokens: torch.Tensor | None = None) -> ScoreOutput:
        """ONE pass over each observation's prefix, then the action ``tokens`` (B, k) after it (none:
        k = 0): the prefixes extended by them, and logits (B, k+1, n_bins)."""
        ...

    def score(self, prefix: Prefix, tokens: torch.Tensor) -> ScoreOutput: ...

    def draft_tokens(self, prefix: Prefix, n: int, last_token: torch.Tensor | None = None,
                     noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def draft_tokens_parallel(self, prefix: Prefix, n: int, last_token: torch.Tensor | None = None,
                              noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def contact_probability(self, prefix: Prefix) -> float: ...

    def contact_logits(self, prefix: Prefix) -> torch.Tensor: ...

    def tokens_to_action(self, tokens: np.ndarray) -> np.ndarray: ...

    def incremental_prefill(self, settings: VisionReuseConfig) -> IncrementalPrefill: ...

    def n_parameters(self) -> dict[str, int]: ...


# --- checkpoint references --------------------------------------------------------------------
HF_PREFIX = "hf:"  # "hf:DIR" names a Hugging Face VLA directory explicitly
# A policy server speaking openpi's protocol: "openpi://HOST:PORT" (or a websocket address), with
# "?spec=FILE&api_key_file=FILE&api_key_env=NAME" (:mod:`vla_accel_ros.models.openpi.client`).
REMOTE_PREFIXES = ("openpi://", "ws://", "wss://")


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint as a setting names it, parsed once: its directory and, with the ``hf:`` prefix,
    the family it was declared as (``hf``); otherwise the loader recognises the family by the
    directory's own files. An openpi server's address (``openpi://``, ``ws://``, ``wss://``) is the
    ``openpi`` family, with no directory (``address``). ``str()`` gives the setting back."""

    directory: Path
    declared_family: str = ""
    address: str = ""

    @classmethod
    def parse(cls, source: str | Path | CheckpointRef) -> CheckpointRef:
        if isinstance(source, CheckpointRef):
            return source
        text = str(source)
        if text.startswith(REMOTE_PREFIXES):
            return cls(Path(), "openpi", text)
        if text.startswith(HF_PREFIX):
            return cls(Path(text[len(HF_PREFIX):]), "hf")
        return cls(Path(text))

    def resolved(self) -> CheckpointRef:
        """The same checkpoint with an absolute directory, for a process in another working directory."""
        return self if self.address else replace(self, directory=self.directory.resolve())

    def __str__(self) -> str:
        if self.address:
            return self.address
        return f"{HF_PREFIX}{self.directory}" if self.declared_family == "hf" else str(self.directory)
