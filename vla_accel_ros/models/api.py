"""The policy contract: what every model family offers the runtime and the decoders.

A policy is one family's model (one folder under :mod:`vla_accel_ros.models`, registered in its
``family.py``). It has a small core, :class:`PolicyLike` (its config, its capabilities, the prefill of
one observation), and declares its capabilities (:class:`PolicyCapabilities`), each a small protocol it
implements in full or not at all:

- :class:`TokenScoring`: action tokens. ``prefill_batch(observations, tokens)`` is ONE target pass
  over a batch of observation prefixes with k proposed tokens riding along; ``score(prefix, tokens)``
  ONE pass over k tokens after a prefix; ``tokens_to_action`` and the action tokenizer;
- :class:`SequentialDrafting`, :class:`ParallelDrafting`: draft heads; :class:`ContactSensing`: a
  contact head; :class:`IncrementalPrefilling`: reuse of unchanged image tokens;
- :class:`ContinuousActionHead`, :class:`ChunkSampling` (with :class:`GuidedSampling`) and
  :class:`ChunkPredicting`: a continuous head, a sampled chunk, a chunk in the prefill's one pass.

The decoders and the runner ask for a capability through its ``as_*`` function (``as_token_scoring``
...), which checks the declaration: nothing is probed, and no method exists only to raise.

Every prefix is a :class:`Prefix`, whatever the family: its keys and values are the family's own
(:class:`PrefixCache`), the rest is shared. Importable without torch (tensors are type hints only),
and so are :class:`CheckpointRef`, the parsed name of a checkpoint, and :class:`ResolvedCheckpoint`,
the checkpoint once its family is known, which travels to an inference process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from vla_accel_ros.models.configuration import RunDefaults

if TYPE_CHECKING:
    import numpy as np
    import torch

    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.models.configuration import VisionReuseConfig


# --- capabilities -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyCapabilities:
    """What a policy offers beyond the core (:class:`PolicyLike`), declared by its family, never
    probed. Each flag names the protocol the policy then implements in full (:func:`as_token_scoring`
    and its siblings hand the policy over as that protocol):

    token_scoring: :class:`TokenScoring` (action tokens: ``prefill_batch`` with tokens riding along,
        ``score``, ``tokens_to_action``); every token decoder needs it.
    draft_head: :class:`SequentialDrafting` (a light EAGLE-style head on the target's hidden states).
    parallel_draft_head: :class:`ParallelDrafting` (every token of the action in one call).
    contact_head: :class:`ContactSensing` (how near the gripper is to contact).
    flow_head: the flow decoders serve it: its own continuous head (:class:`ContinuousActionHead`)
        or, with ``flow_chunks``, a sampled chunk.
    incremental_prefill: :class:`IncrementalPrefilling` (reuse of unchanged image tokens).
    batched_passes: ``prefill_batch`` and ``score`` take a batch of several observations.
    flow_chunks: :class:`ChunkSampling`: a flow VLA that samples a whole chunk from its prefix
        (LeRobot's SmolVLA, π0 and π0.5; an openpi server's reply); no action tokens.
    action_chunk: :class:`ChunkPredicting`: the prefill predicts a whole chunk in its one pass
        (OpenVLA-OFT's parallel decoding); no action tokens.
    chunk_guidance: with ``flow_chunks``, :class:`GuidedSampling`: the sampler takes a real-time
        chunking guide in its own space.
    image_slots: camera images one observation holds (``Observation.images``, in slot order; 0: any).
    resizes_images: it resizes camera images itself, as its processor does (else they come at
        ``config.image_size``).
    """

    token_scoring: bool = False
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
    resizes_images: bool = False


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


# --- the policy: a core, and one protocol per capability --------------------------------------
class PolicyLike(Protocol):
    """The core every policy has: its configuration (:class:`PolicyConfig`), the capabilities it
    declares (how it takes observations among them: ``image_slots``), the prefill of one observation,
    and its size. Everything else is a capability below, reached through its ``as_*`` function."""

    config: Any  # a PolicyConfig

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype its passes compute in (parts kept in float32 in a bfloat16 model aside)."""
        ...

    def capabilities(self) -> PolicyCapabilities: ...

    def prefill(self, obs: Observation) -> Prefix:
        """ONE pass over the observation's prefix (a chunk policy's chunk comes with it)."""
        ...

    def n_parameters(self) -> dict[str, int]: ...


class TokenScoring(PolicyLike, Protocol):
    """Action tokens: the target passes every token decoder runs."""

    tokenizer: Any  # the action tokenizer: encode / decode between actions and bins

    @property
    def n_action_tokens(self) -> int: ...

    def prefill_batch(self, observations: Sequence[Observation], tokens: torch.Tensor | None = None) -> ScoreOutput:
        """ONE pass over each observation's prefix, then the action ``tokens`` (B, k) after it (none:
        k = 0): the prefixes extended by them, and logits (B, k+1, n_bins)."""
        ...

    def score(self, prefix: Prefix, tokens: torch.Tensor) -> ScoreOutput:
        """ONE pass over k tokens (B, k) after ``prefix``."""
        ...

    def tokens_to_action(self, tokens: np.ndarray) -> np.ndarray: ...


class SequentialDrafting(Protocol):
    """A draft head that proposes tokens one after another from the target's hidden states."""

    def draft_tokens(self, prefix: Prefix, n: int, last_token: torch.Tensor | None = None,
                     noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


class ParallelDrafting(Protocol):
    """A draft head that proposes every token of the action in one call."""

    parallel_draft: Any  # the head

    def draft_tokens_parallel(self, prefix: Prefix, n: int, last_token: torch.Tensor | None = None,
                              noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


class ContactSensing(Protocol):
    """A contact head: how near the gripper is to contact, from the prefix."""

    def contact_probability(self, prefix: Prefix) -> float: ...

    def contact_logits(self, prefix: Prefix) -> torch.Tensor: ...


class ContinuousActionHead(Protocol):
    """A continuous (flow) action head on the prefix features of a token VLA (the own family's)."""

    flow: Any  # the heads: ``config`` (action_width, horizon) and ``sample``
    tokenizer: Any

    def flow_condition(self, prefix: Prefix) -> torch.Tensor:
        """(B, c) what the head is conditioned on: the prefix's features and the other cameras'."""
        ...


class ChunkSampling(Protocol):
    """A flow VLA: a whole chunk of actions sampled from the prefix (``config``: ``num_steps``, the
    policy's own step count, and ``n_action_steps``, the actions of a chunk the controller runs)."""

    def noise_shape(self) -> tuple[int, int]: ...

    def sample_chunk(self, prefix: Prefix, noise: torch.Tensor, steps: int, guide: Any = None,
                     student: bool = False) -> np.ndarray:
        """(H, D) our actions: ``steps`` steps from ``noise``, under real-time chunking's ``guide``
        when given, with the fitted 2-step sampler when ``student`` and the policy has one."""
        ...

    def check_robot(self, state_dim: int, action_dim: int) -> None:
        """ValueError in one line unless the policy reads this arm's state and acts in its width."""
        ...


class GuidedSampling(Protocol):
    """A chunk sampler that takes a real-time chunking guide in its own space."""

    def sample_space(self, actions: np.ndarray) -> torch.Tensor: ...


class ChunkPredicting(Protocol):
    """A policy whose prefill predicts a whole chunk in its one pass (OpenVLA-OFT)."""

    def action_chunk(self, prefix: Prefix) -> np.ndarray:
        """(H, D) our actions, predicted by the prefill of ``prefix``."""
        ...

    def chunk_tokens(self, prefix: Prefix) -> np.ndarray:
        """(D,) the bins of the chunk's first action, for bookkeeping."""
        ...


class IncrementalPrefilling(Protocol):
    """A prefill over a stream of frames that reuses the image tokens that did not change."""

    def incremental_prefill(self, settings: VisionReuseConfig) -> IncrementalPrefill: ...


def _declared(policy: PolicyLike, flag: str, what: str) -> PolicyLike:
    if not getattr(policy.capabilities(), flag):
        raise ValueError(f"this policy does not declare {what} ({flag} in capabilities())")
    return policy


# ``policy`` as the protocol of one capability, once its capabilities declare it; ValueError otherwise.
def as_token_scoring(policy: PolicyLike) -> TokenScoring:
    return cast(TokenScoring, _declared(policy, "token_scoring", "action tokens"))


def as_sequential_drafting(policy: PolicyLike) -> SequentialDrafting:
    return cast(SequentialDrafting, _declared(policy, "draft_head", "a draft head"))


def as_parallel_drafting(policy: PolicyLike) -> ParallelDrafting:
    return cast(ParallelDrafting, _declared(policy, "parallel_draft_head", "a parallel draft head"))


def as_contact_sensing(policy: PolicyLike) -> ContactSensing:
    return cast(ContactSensing, _declared(policy, "contact_head", "a contact head"))


def as_continuous_head(policy: PolicyLike) -> ContinuousActionHead:
    if policy.capabilities().flow_chunks:  # its flow samples whole chunks: ChunkSampling
        raise ValueError("this policy samples whole chunks (flow_chunks), it has no continuous action head")
    return cast(ContinuousActionHead, _declared(policy, "flow_head", "a continuous action head"))


def as_chunk_sampling(policy: PolicyLike) -> ChunkSampling:
    return cast(ChunkSampling, _declared(policy, "flow_chunks", "a chunk sampler"))


def as_guided_sampling(policy: PolicyLike) -> GuidedSampling:
    return cast(GuidedSampling, _declared(policy, "chunk_guidance", "a guided sampler"))


def as_chunk_predicting(policy: PolicyLike) -> ChunkPredicting:
    return cast(ChunkPredicting, _declared(policy, "action_chunk", "a chunk in its prefill"))


def as_incremental_prefilling(policy: PolicyLike) -> IncrementalPrefilling:
    return cast(IncrementalPrefilling, _declared(policy, "incremental_prefill", "an incremental prefill"))


# --- checkpoint references --------------------------------------------------------------------
HF_PREFIX = "hf:"  # "hf:DIR" names a Hugging Face VLA directory explicitly
# A policy server speaking openpi's protocol: "openpi://HOST:PORT" (or a websocket address), with
# "?spec=FILE&api_key_file=FILE&api_key_env=NAME" (:mod:`vla_accel_ros.models.openpi.policy`).
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


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A checkpoint once its family is known: resolved once per start (its ``config.json`` read
    once), then handed on, to the inference child as JSON (:meth:`to_json`), so that nothing reads or
    recognises it again. ``config``: the directory's ``config.json`` as read (None: none);
    ``action_space``: what its actions are, as its robot record (or a server's spec) declares."""

    ref: CheckpointRef
    family: str
    action_space: str
    config: dict[str, Any] | None = None

    @property
    def directory(self) -> Path:
        return self.ref.directory

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": str(self.ref), "family": self.family, "action_space": self.action_space,
                "config": self.config}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResolvedCheckpoint:
        return cls(CheckpointRef.parse(str(data["checkpoint"])), str(data["family"]), str(data["action_space"]),
                   data.get("config"))


@dataclass(frozen=True)
class LoadOptions:
    """How a family's loader is asked to load: ``unnorm_key`` (a token VLA's dataset in its
    statistics; empty: the only one), ``device`` and ``dtype`` (None: the family's default),
    ``tokenizer_dir`` (a text tokenizer not beside the weights), ``arm`` (the robot's kinematics, for
    a policy that maps joint actions), ``draft`` (attach a saved draft head) and ``draft_head`` (the
    directory ``vla-accel train-draft --out`` wrote the head into; None: the one beside the weights)."""

    unnorm_key: str = ""
    device: str | None = None
    dtype: str | None = None
    tokenizer_dir: Path | None = None
    arm: Any = None
    draft: bool = True
    draft_head: Path | None = None


@dataclass(frozen=True)
class Family:
    """A model family as it registers itself, in its folder's ``family.py`` (``FAMILY = Family(...)``),
    read without torch. ``recognises(directory, config)``: whether a directory is its own, from its
    files only (``config``: the parsed ``config.json``, None when there is none). ``loader``:
    ``"module:function"`` called with a :class:`ResolvedCheckpoint` and :class:`LoadOptions`, imported
    only when one of its checkpoints loads. ``checker``: ``"module:function"`` called with the
    directory, its config and ``unnorm_key``: the checks that need no model (ValueError naming the file).
    ``order``: lower is tried first (a family before the one it extends: OFT before OpenVLA).
    ``devices``, ``dtypes``: where its policies run and the dtypes they load in. ``capabilities``: the
    :class:`PolicyCapabilities` flags its policies can declare. ``options``: the :class:`LoadOptions`
    fields that apply to it. ``remote``: its checkpoints are a server's address; ``action_space_of``:
    ``"module:function"`` giving such an address's action space (a directory's: its robot record).
    ``run_defaults``: how its checkpoints run unless their ``vla_spec.json`` or the user sets it
    (the temperature, the kinematic bounds and the checked fill); a model the package did not
    train runs greedy, with the bounds for a model the Kalman filter predicts poorly."""

    name: str
    marker: str
    recognises: Callable[[Path, dict[str, Any] | None], bool]
    loader: str
    checker: str = ""
    order: int = 100
    devices: tuple[str, ...] = ("cpu",)
    dtypes: tuple[str, ...] = ("float32",)
    capabilities: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    remote: bool = False
    answers_with_chunks: bool = False  # it answers with a server's chunks: a token decoder gives way to a flow one
    action_space_of: str = ""
    run_defaults: RunDefaults = RunDefaults()
