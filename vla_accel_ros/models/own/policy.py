"""The policy bundle the decoders and the node use: target VLA + draft head + contact head +
action tokenizer + proprio statistics, with prefill / score / draft operating on immutable
prefixes. Optional components: a continuous action head (``flow``), the world-aware prefill
(``world``: its per-patch bias is added to the patch tokens of every prefill, see
:mod:`vla_accel_ros.models.own.world`) and a parallel draft head (``parallel_draft``: all remaining
draft tokens from one light call, see :meth:`Policy.draft_tokens_parallel`).

Public calls run in ``torch.inference_mode``; the underscored twins are mode-agnostic so that
training can reuse them under ``torch.no_grad`` (inference tensors cannot feed autograd).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.api import PolicyCapabilities, Prefix, ScoreOutput
from vla_accel_ros.models.layers import KVCache
from vla_accel_ros.models.own.config import PROPRIO_DIM, VLAConfig
from vla_accel_ros.models.own.draft import ContactHead, DraftHead
from vla_accel_ros.models.own.flow import FlowHeads, camera_condition, prefix_condition
from vla_accel_ros.models.own.modules import PrefixPass, VLATarget, count_parameters
from vla_accel_ros.models.own.world import WorldPrefill
from vla_accel_ros.models.sampling import pick_tokens
from vla_accel_ros.models.tokenizer import (
    BOS,
    N_BINS,
    ActionTokenizer,
    encode_instruction,
)

if TYPE_CHECKING:
    from vla_accel_ros.models.configuration import VisionReuseConfig
    from vla_accel_ros.models.own.incremental import IncrementalVisionEncoder


@dataclass(frozen=True, eq=False)
class KVRows:
    """The own family's keys and values behind a :class:`~vla_accel_ros.models.api.Prefix`: per decoder
    layer (k, v), each (B, H, length, hd)."""

    layers: KVCache

    def cropped(self, length: int) -> KVRows:
        return KVRows(tuple((k[:, :, :length], v[:, :, :length]) for k, v in self.layers))

    def rows(self, rows: list[int]) -> KVRows:
        if rows and rows == list(range(rows[0], rows[0] + len(rows))):
            span = slice(rows[0], rows[0] + len(rows))
            return KVRows(tuple((k[span], v[span]) for k, v in self.layers))
        index = torch.tensor(rows, dtype=torch.long, device=self.layers[0][0].device)
        return KVRows(tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in self.layers))


class Policy:
    def __init__(
        self,
        config: VLAConfig,
        tokenizer: ActionTokenizer,
        target: VLATarget,
        draft: DraftHead,
        contact_head: ContactHead,
        proprio_mean: np.ndarray,
        proprio_std: np.ndarray,
        info: dict[str, Any] | None = None,
    ) -> None:
        proprio_mean = np.asarray(proprio_mean, dtype=np.float32).reshape(-1)
        proprio_std = np.asarray(proprio_std, dtype=np.float32).reshape(-1)
        if proprio_mean.shape != (PROPRIO_DIM,) or proprio_std.shape != (PROPRIO_DIM,):
            raise ValueError(f"proprio mean/std must have shape ({PROPRIO_DIM},)")
        if not (np.all(np.isfinite(proprio_mean)) and np.all(np.isfinite(proprio_std)) and np.all(proprio_std > 0)):
            raise ValueError("proprio mean must be finite and std finite and positive")
        self.config = config
        self.tokenizer = tokenizer
        self.target = target.eval()
        self.draft = draft.eval()
        self.contact_head = contact_head.eval()
        self.proprio_mean = proprio_mean
        self.proprio_std = proprio_std
        self._proprio_tensors: tuple[torch.Tensor, torch.Tensor] | None = None  # normalise_proprio's cache
        self._instruction_ids: tuple[str, torch.Tensor] | None = None  # observation_tensors' cache
        # instruction_film's cache: (ids, versions of the weights that made it, FiLM)
        self._instruction_film: tuple[torch.Tensor, tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] | None = None
        self.info: dict[str, Any] = dict(info or {})  # recipe / metrics from the checkpoint
        self.flow: FlowHeads | None = None  # optional continuous action head (models.flow)
        # optional parallel draft head (models.draft.ParallelDraftHead, vla-accel train-parallel-draft)
        self.parallel_draft: DraftHead | None = None
        self._world: WorldPrefill | None = None

    @property
    def world(self) -> WorldPrefill | None:
        """The optional world-aware prefill (frozen autoencoder + bias); None = the plain target."""
        return self._world

    @world.setter
    def world(self, world: WorldPrefill | None) -> None:
        if world is not None:
            world.check_target(self.config)
            world.to(self.device).eval().requires_grad_(False)  # frozen wherever the policy is used
        self._world = world

    @classmethod
    def create(
        cls,
        config: VLAConfig,
        tokenizer: ActionTokenizer,
        proprio_mean: np.ndarray | None = None,
        proprio_std: np.ndarray | None = None,
        seed: int = 0,
    ) -> Policy:
        """A freshly initialised (untrained) policy; seeded so that two calls give the same weights."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            target, draft, contact = VLATarget(config), DraftHead(config), ContactHead(config)
        mean = np.zeros(PROPRIO_DIM, np.float32) if proprio_mean is None else proprio_mean
        std = np.ones(PROPRIO_DIM, np.float32) if proprio_std is None else proprio_std
        return cls(config, tokenizer, target, draft, contact, mean, std)

    def capabilities(self) -> PolicyCapabilities:
        """Action tokens, every head but the optional ones present: the flow head and the parallel
        draft head; its own incremental prefill, and passes over a batch of observations."""
        return PolicyCapabilities(token_scoring=True, draft_head=True,
                                  parallel_draft_head=self.parallel_draft is not None, contact_head=True,
                                  flow_head=self.flow is not None, incremental_prefill=True, batched_passes=True,
                                  image_slots=self.image_slots)

    @property
    def image_slots(self) -> int:
        """Camera images per observation: the flow head's (its condition reads each), else one."""
        return self.flow.config.cameras if self.flow is not None else 1

    @property
    def n_action_tokens(self) -> int:
        return self.config.n_action_tokens

    @property
    def device(self) -> torch.device:
        return self.target.lm_head.weight.device

    @property
    def compute_dtype(self) -> torch.dtype:
        """float32: the own family's weights load in it."""
        return self.target.lm_head.weight.dtype

    def n_parameters(self) -> dict[str, int]:
        counts = {
            "target": count_parameters(self.target),
            "draft": count_parameters(self.draft),
            "contact_head": count_parameters(self.contact_head),
        }
        if self.world is not None:
            counts["world"] = count_parameters(self.world)
        if self.parallel_draft is not None:
            counts["parallel_draft"] = count_parameters(self.parallel_draft)
        return counts

    def to(self, device: str | torch.device) -> Policy:
        for module in (self.target, self.draft, self.contact_head, self.world, self.parallel_draft):
            if module is not None:
                module.to(device)
        return self

    # --- inputs -------------------------------------------------------------------------------
    def normalise_proprio(self, proprio: torch.Tensor) -> torch.Tensor:
        stats = self._proprio_tensors
        if stats is None or stats[0].device != proprio.device:  # converted once, not at every prefill
            stats = (torch.as_tensor(self.proprio_mean, device=proprio.device),
                     torch.as_tensor(self.proprio_std, device=proprio.device))
            self._proprio_tensors = stats
        return (proprio.to(torch.float32) - stats[0]) / stats[1]

    def observation_batch(self, observations: Sequence[Observation]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`observation_tensors` of each observation, stacked (one observation: its own tensors)."""
        parts = [self.observation_tensors(obs) for obs in observations]
        if len(parts) == 1:
            return parts[0]
        images, text, proprio = zip(*parts)
        return torch.cat(images), torch.cat(text), torch.cat(proprio)

    def observation_tensors(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(images (1, H, W, 3) uint8, text ids (1, T), raw proprio (1, 8)) for one observation."""
        size = self.config.image_size
        image = np.asarray(obs.image)
        if image.dtype != np.uint8 or image.shape != (size, size, 3):
            raise ValueError(f"image must be uint8 ({size}, {size}, 3) RGB, got {image.dtype} {image.shape}")
        proprio = obs.proprio
        if proprio.shape != (PROPRIO_DIM,) or not np.isfinite(proprio).all():
            raise ValueError(f"proprio must be {PROPRIO_DIM} finite numbers, got {proprio}")
        device = self.device
        cached = self._instruction_ids
        if cached is None or cached[0] != obs.instruction or cached[1].device != device:
            # one instruction serves a whole episode: its ids are made once (read-only to callers)
            text = encode_instruction(obs.instruction, self.config.max_text_len)
            cached = self._instruction_ids = (obs.instruction, torch.from_numpy(text).unsqueeze(0).to(device))
        # torch refuses to share a read-only array's memory (a frame decoded from a message, a bag's
        # buffer) and warns: such an array, or a strided one, is copied first.
        images, proprio = (torch.from_numpy(np.require(image, requirements=("C", "W"))).unsqueeze(0),
                           torch.from_numpy(np.require(proprio, requirements=("C", "W"))).unsqueeze(0))
        if device.type != "cpu":
            images, proprio = images.to(device), proprio.to(device)
        return images, cached[1], proprio

    # --- target -------------------------------------------------------------------------------
    def encode_local(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """Local (per-patch) vision tokens (B, P, d) of uint8 images (B, H, W, 3) under the
        instruction ids ``text`` (B, T). Never world-biased: the prefill adds the bias, so these
        can be cached and reused."""
        with torch.inference_mode():
            return self.target.encode_images(images, self.instruction_film(text))

    def instruction_film(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The patch encoder's FiLM (scale, shift) for instruction ids ``text`` (B, T), as
        ``encode_patches`` computes it. An episode keeps its instruction while its text layers cost
        ~7% of a prefill, so the last one is kept and reused (exact) until the ids or the weights
        that made it change (in-place updates, e.g. an optimiser step or ``load_state_dict``)."""
        target = self.target
        weights = [target.text_emb.weight, *target.patch_encoder.film.parameters()]
        if target.config.text_layers:
            weights += [target.text_pos, *target.text_blocks.parameters(), *target.text_ln.parameters()]
        versions = tuple(w._version for w in weights)
        cached = self._instruction_film
        if (cached is not None and cached[1] == versions and cached[0].shape == text.shape
                and cached[0].device == text.device and torch.equal(cached[0], text)):
            return cached[2]
        with torch.inference_mode():
            film = target.patch_encoder.film_params(target.instruction_condition(text))
            self._instruction_film = (text.clone(), versions, film)
        return film

    def world_bias(self, images: torch.Tensor) -> torch.Tensor | None:
        """The world-aware bias (B, P, d) of uint8 images (B, H, W, 3); None without a world component.
        Mode-agnostic and gradient-free (the component is frozen), so training can add it too."""
        if self.world is None:
            return None
        with torch.no_grad():
            return self.world.patch_bias(images)

    def prefill(self, obs: Observation) -> Prefix:
        """The prefix of one observation (``prefill_batch`` of it alone, without action tokens)."""
        return self.prefill_batch([obs]).prefix

    def prefill_batch(self, observations: Sequence[Observation], tokens: torch.Tensor | None = None) -> ScoreOutput:
        """ONE target pass over each observation's prefix and, when given, the action ``tokens`` (B, k)
        after it (a decoder's proposal, verified by k more rows of the prefill instead of a pass of
        its own; the prefix rows attend only to the prefix, so they are a plain prefill's)."""
        images, text, proprio = self.observation_batch(observations)
        scored = self.prefill_tensors(images, text, proprio, tokens)
        if self.image_slots == 1:
            return scored
        return replace(scored, prefix=replace(scored.prefix, camera_condition=self.camera_condition(observations)))

    def camera_condition(self, observations: Sequence[Observation]) -> torch.Tensor:
        """The flow head's condition from each observation's other camera images (B, 2d * (slots - 1)):
        the target's prefix features of each image, in one pass over them all."""
        extra = self.image_slots - 1
        for obs in observations:
            if len(obs.extra_images) != extra:
                raise ValueError(f"the policy reads {self.image_slots} camera images (its image slots), the "
                                 f"observation holds {1 + len(obs.extra_images)}")
        rows = [replace(obs, image=image, extra_images=()) for obs in observations for image in obs.extra_images]
        images, text, proprio = self.observation_batch(rows)
        prefix = self.prefill_tensors(images, text, proprio).prefix
        return camera_condition(prefix_condition(prefix.hidden_last, prefix.pooled), extra)

    def flow_condition(self, prefix: Prefix) -> torch.Tensor:
        """(B, c) what the flow head is conditioned on: the prefix's features (its last hidden state
        and its pooled one) and, with more than one image slot, the other cameras' condition the
        prefill made (:meth:`camera_condition`)."""
        condition = prefix_condition(prefix.hidden_last, prefix.pooled)
        if self.image_slots == 1:
            return condition
        if prefix.camera_condition is None:
            raise ValueError(f"the flow head reads {self.image_slots} camera images; this prefill gave "
                             "one (incremental vision encodes the first camera only)")
        return torch.cat([condition, prefix.camera_condition], dim=-1)

    def prefill_tensors(self, images: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor,
                        tokens: torch.Tensor | None = None, local_tokens: torch.Tensor | None = None) -> ScoreOutput:
        """:meth:`prefill_batch` from tensors: uint8 images (B, H, W, 3), text ids (B, T), raw proprio
        (B, 8). ``local_tokens`` (B, P, W), if given, are reused instead of encoding the images (the
        world-aware bias, if any, is added after them)."""
        with torch.inference_mode():
            return self._prefill_tensors(images, text, proprio, tokens, local_tokens)

    def _prefill_tensors(self, images: torch.Tensor, text: torch.Tensor, proprio: torch.Tensor,
                         tokens: torch.Tensor | None = None, local_tokens: torch.Tensor | None = None) -> ScoreOutput:
        """:meth:`prefill_tensors` in whatever autograd mode the caller runs (training reads it too)."""
        if tokens is not None:
            self.check_action_tokens(tokens, images.shape[0])
        if local_tokens is None:
            local_tokens = self.target.encode_images(images, self.instruction_film(text))
        result = self.target.forward_prefix(local_tokens, text, self.normalise_proprio(proprio), tokens,
                                            patch_bias=self.world_bias(images))
        return self.scored(result, tokens)

    def scored(self, result: PrefixPass, tokens: torch.Tensor | None) -> ScoreOutput:
        """The prefix a pass over the observation prefix made, and the target's logits at its end and
        at the action ``tokens`` after it (none: the end alone)."""
        hidden = result.action_hidden
        if tokens is None:
            tokens = torch.empty(hidden.shape[0], 0, dtype=torch.long, device=hidden.device)
        prefix = Prefix(cache=KVRows(result.kv), action_hidden=hidden, tokens=tokens, pooled=result.pooled,
                        prefix_len=result.prefix_len)
        return ScoreOutput(self.target.lm_head(hidden), prefix)

    def incremental_prefill(self, settings: VisionReuseConfig) -> IncrementalVisionEncoder:
        """The prefill over a stream of frames that re-encodes only the changed patches
        (:mod:`vla_accel_ros.models.own.incremental`)."""
        from vla_accel_ros.models.own.incremental import IncrementalVisionEncoder

        return IncrementalVisionEncoder(self, settings)

    def score(self, prefix: Prefix, tokens: torch.Tensor) -> ScoreOutput:
        """ONE target forward over k new tokens (B, k) after the prefix; logits (B, k+1, 256)."""
        with torch.inference_mode():
            return self._score(prefix, tokens)

    @staticmethod
    def check_action_tokens(tokens: torch.Tensor, batch_size: int) -> None:
        """Raise ValueError unless ``tokens`` are int64 action ids (batch_size, k) in [0, 256)."""
        if tokens.dim() != 2 or tokens.shape[0] != batch_size:
            raise ValueError(f"tokens must be (B={batch_size}, k), got {tuple(tokens.shape)}")
        if tokens.dtype != torch.long:
            raise ValueError(f"tokens must be int64, got {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= N_BINS):
            raise ValueError(f"action tokens must lie in [0, {N_BINS})")

    def _score(self, prefix: Prefix, tokens: torch.Tensor) -> ScoreOutput:
        self.check_action_tokens(tokens, prefix.batch_size)
        k = tokens.shape[1]
        if k == 0:  # nothing to run: the prefix's last hidden state already predicts the next token
            logits = self.target.lm_head(prefix.hidden_last).unsqueeze(1)
            return ScoreOutput(logits, replace(prefix, base=prefix.n_tokens))
        x = self.target.embed_actions(tokens, prefix.length)
        hidden, kv = self.target.decode(x, prefix.cache.layers)
        action_hidden = torch.cat([prefix.action_hidden, hidden], dim=1)
        extended = Prefix(
            cache=KVRows(kv),
            action_hidden=action_hidden,
            tokens=torch.cat([prefix.tokens, tokens], dim=1),
            pooled=prefix.pooled,
            prefix_len=prefix.prefix_len,
            base=prefix.n_tokens,
        )
        return ScoreOutput(self.target.lm_head(action_hidden[:, -(k + 1) :]), extended)

    def greedy_decode(self, prefix: Prefix) -> torch.Tensor:
        """Plain autoregressive greedy decoding of the remaining action tokens -> (B, 7)."""
        with torch.inference_mode():
            tokens, _ = self._greedy(prefix)
            return tokens

    def _greedy(self, prefix: Prefix) -> tuple[torch.Tensor, Prefix]:
        """Greedy tokens of the whole action (B, 7) and the prefix after consuming all but the last."""
        if prefix.n_tokens >= self.n_action_tokens:
            raise ValueError(f"the prefix already holds {prefix.n_tokens} action tokens")
        current = prefix
        tokens = [current.tokens]
        token = self.target.lm_head(current.hidden_last).argmax(-1, keepdim=True)
        for _ in range(self.n_action_tokens - prefix.n_tokens - 1):
            tokens.append(token)
            out = self._score(current, token)
            current = out.prefix
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
        return torch.cat(tokens, dim=1), current

    # --- draft --------------------------------------------------------------------------------
    def draft_tokens(
        self, prefix: Prefix, n: int, last_token: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Propose n tokens after the prefix: (tokens (B, n), logits (B, n, 256)).

        ``last_token`` is the token whose hidden state is ``prefix.hidden_last`` (the last one the
        prefix consumed); None means the start of the action (BOS). The first proposal is the
        LM head of ``prefix.hidden_last``, i.e. exactly the target's greedy token; later ones
        come from the draft head, whose feature starts at ``prefix.hidden_last`` and then is its
        own output. No target forward pass is run. ``noise``: the step's sampling noise (7, 256)
        from :mod:`vla_accel_ros.models.sampling`; each proposal is then the argmax of its logits plus
        the noise of its action dimension, as the target's own sampled token would be.
        """
        with torch.inference_mode():
            return self._draft(prefix, n, last_token, noise=noise)

    def draft_tokens_parallel(
        self, prefix: Prefix, n: int, last_token: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`draft_tokens` with the parallel draft head: the same contract and the same first
        proposal (the target's greedy token), but the other n - 1 come from ONE call of
        ``parallel_draft``, whose queries all read the prefix end (its feature and that greedy
        token), so drafting costs one light forward whatever n. Raises ValueError when the policy
        has no parallel draft head."""
        with torch.inference_mode():
            return self._draft(prefix, n, last_token, parallel=True, noise=noise)

    def _draft(
        self, prefix: Prefix, n: int, last_token: torch.Tensor | None, parallel: bool = False,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both drafting modes: the sequential head's chain of steps, or (``parallel``) the
        parallel head's single call over all later positions."""
        head = self.parallel_draft if parallel else self.draft
        if head is None:
            raise ValueError(
                "this policy has no parallel draft head (parallel_draft.* in the checkpoint; "
                "train one with `vla-accel train-parallel-draft`)"
            )
        self._check_last_token(prefix, last_token)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        b, device = prefix.batch_size, prefix.hidden_last.device
        if n == 0:
            return torch.empty(b, 0, dtype=torch.long, device=device), torch.empty(b, 0, N_BINS, device=device)
        lm_head, action_emb = self.target.lm_head, self.target.action_emb
        feature = prefix.hidden_last.unsqueeze(1)
        start = prefix.n_tokens
        logits = [lm_head(feature)]
        tokens = [pick_tokens(logits[-1], noise, start)]
        if n == 1:  # the target's own token alone (a decoder whose cheap sources cover the rest)
            return tokens[0], logits[0]
        memory = prefix.cache.layers[-1]
        # the action dimension each later proposal predicts (past the last one: the last one again)
        positions = (start + torch.arange(1, n, device=device)).clamp_(max=self.n_action_tokens - 1)
        if parallel and n > 1:  # every query reads (first token, feature) at the prefix end
            s = n - 1
            features = head(action_emb(tokens[0]).expand(b, s, -1), feature.expand(b, s, -1), positions, memory)
            logits.append(lm_head(features))
            tokens.append(pick_tokens(logits[-1], noise, start + 1))
        elif not parallel:  # each step reads the token and feature the step before proposed
            for index in positions.split(1):
                feature = head(action_emb(tokens[-1]), feature, index, memory)
                logits.append(lm_head(feature))
                tokens.append(pick_tokens(logits[-1], noise, int(index)))
        return torch.cat(tokens, dim=1), torch.cat(logits, dim=1)

    @staticmethod
    def _check_last_token(prefix: Prefix, last_token: torch.Tensor | None) -> None:
        if last_token is None:
            if prefix.n_tokens:
                raise ValueError(
                    f"last_token=None means the start of the action, but the prefix holds {prefix.n_tokens} tokens"
                )
            return
        if last_token.shape != (prefix.batch_size,):
            raise ValueError(f"last_token must be (B={prefix.batch_size},), got {tuple(last_token.shape)}")
        expected = prefix.tokens[:, -1] if prefix.n_tokens else torch.full_like(last_token, BOS)
        if not torch.equal(last_token.to(expected.device), expected):
            raise ValueError(
                "last_token must be the token the prefix consumed last (BOS at the start of the action): "
                f"got {last_token.tolist()}, the prefix ends with {expected.tolist()}"
            )

    # --- contact & actions --------------------------------------------------------------------
    def contact_logits(self, prefix: Prefix) -> torch.Tensor:
        with torch.inference_mode():
            return self.contact_head(prefix.pooled)

    def contact_probability(self, prefix: Prefix) -> float:
        """P(near contact) for a single-observation prefix (B = 1)."""
        if prefix.batch_size != 1:
            raise ValueError(f"contact_probability needs B=1, got B={prefix.batch_size}; use contact_logits")
        return float(torch.sigmoid(self.contact_logits(prefix))[0])

    def tokens_to_action(self, tokens: torch.Tensor | np.ndarray) -> np.ndarray:
        """Action (7,) float64 at the bin centres of 7 tokens."""
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.detach().cpu().numpy()
        tokens = np.asarray(tokens).reshape(-1)
        if tokens.shape != (self.n_action_tokens,):
            raise ValueError(f"expected {self.n_action_tokens} tokens, got shape {tokens.shape}")
        return self.tokenizer.decode(tokens)
