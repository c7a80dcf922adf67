"""OpenVLA-OFT as a policy: OpenVLA's backbone, read by the OpenVLA loader, and one parallel pass
that predicts a whole chunk of actions.

The sequence of one pass (batch 1), as OFT's ``predict_action`` builds it:

``[BOS, patches (256 per image), state token, prompt + 29871, H x D empty action embeddings, </s>]``

- each image is resized and normalised as OpenVLA's processor does it, its two towers' inputs
  stacked (6 channels), its 256 projected patches; the images' patches follow each other;
- the state token is the proprio projector's output for the normalised state (none without a
  projector);
- the prompt is OpenVLA's (29871 appended unless it ends with it);
- the H x D action positions enter the language model as zero vectors (only their positions
  tell them apart), then the stop token ``</s>``;
- attention is fully bidirectional, over the whole sequence (OFT runs a transformers fork that
  turns the causal mask off);
- the head reads the final hidden states of the H x D positions starting AT the 29871 token, the
  causal shift OFT keeps from training: the last action position's own state is never read.

There are no action tokens: the token decoders do not apply, and the runtime reads the chunk the
prefill predicted (``capabilities().action_chunk``, ``action_chunk(prefix)``; the ``chunk``
decoder hands it to the controller's queue as a chunked flow head does).

On a GPU the parallel pass (towers, projector, language model and head) replays as one CUDA graph
per input shape (:class:`~vla_accel_ros.models.cuda_graph.CudaGraphs`); on the CPU it runs eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.api import PolicyCapabilities, Prefix
from vla_accel_ros.models.cuda_graph import CudaGraphs
from vla_accel_ros.models.oft.config import ChunkSpec, ChunkStatistics
from vla_accel_ros.models.oft.modules import L1ActionHead, ProprioProjector
from vla_accel_ros.models.openvla.modules import OpenVLAModules
from vla_accel_ros.models.token_vla.passes import to_device
from vla_accel_ros.models.token_vla.spec import IMAGE_FIELD, OPENVLA_APPENDED_ID, PROPRIO_FIELD, VLASpec
from vla_accel_ros.models.token_vla.statistics import gripper_to_ours
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS, digitise

CHANNELS_PER_IMAGE = 6  # DINOv2's 3 then SigLIP's 3


@dataclass(frozen=True)
class OFTConfig:
    """What the runtime reads of an OFT policy: the width, the image side, the chunk
    (``chunk_size`` x ``action_dim``), the state it reads (None: none) and its image slots (None: any)."""

    d_model: int
    image_size: int
    chunk_size: int
    action_dim: int
    state_dim: int | None
    n_images: int | None
    n_bins: int = N_BINS

    @property
    def n_action_tokens(self) -> int:
        return self.action_dim


@dataclass(frozen=True, eq=False)
class ChunkPrediction:
    """One pass's chunk: ``normalized`` (H, D) the head's outputs, ``actions`` (H, D) unnormalised
    as OFT's ``predict_action`` returns them, ``action_hidden`` (1, H x D, width) what the head read."""

    normalized: np.ndarray
    actions: np.ndarray
    action_hidden: torch.Tensor

    def cropped(self, length: int) -> ChunkPrediction:
        return self  # nothing of it is a cache to crop: a prefix of an OFT pass has no tokens

    def rows(self, rows: list[int]) -> ChunkPrediction:
        if rows != [0]:
            raise ValueError("an OFT prefix holds one observation")
        return self


def bidirectional_mask(length: int, device: torch.device) -> torch.Tensor:
    """(1, 1, length, length) boolean: every position attends to every position."""
    return torch.ones(1, 1, length, length, dtype=torch.bool, device=device)


class OFTPolicy:
    """OpenVLA-OFT (module docstring): the OpenVLA ``modules``, the ``text_tokenizer``, the
    ``spec`` (prompt, gripper convention), the ``chunk``, the dataset's ``statistics``, the action
    ``head`` and the ``projector`` (None: the model reads no state)."""

    flow: Any = None
    parallel_draft: Any = None
    family = "an OpenVLA-OFT model"

    def __init__(self, modules: OpenVLAModules, text_tokenizer: Any, spec: VLASpec, chunk: ChunkSpec,
                 statistics: ChunkStatistics, head: L1ActionHead, projector: ProprioProjector | None, *,
                 source: str = "<in-memory model>") -> None:
        if IMAGE_FIELD in spec.prompt or PROPRIO_FIELD in spec.prompt:
            raise ValueError(f"{source}: an OFT prompt has the image and the state before it; its template holds "
                             f"neither {IMAGE_FIELD} nor {PROPRIO_FIELD}")
        width = int(modules.text_config.hidden_size)
        if head.shape.width != width:
            raise ValueError(f"{source}: the action head reads hidden states of width {head.shape.width}, the "
                             f"language model's are {width}")
        self.modules, self.text_tokenizer, self.spec = modules, text_tokenizer, spec
        self.chunk, self.statistics, self.head, self.projector = chunk, statistics, head, projector
        self.source = source
        self.device, self.dtype = modules.device, modules.dtype
        self.compute_dtype = modules.dtype  # the head and the projector are cast to it too
        self.bos_id, self.stop_id = int(text_tokenizer.bos_token_id), int(text_tokenizer.eos_token_id)
        self._stop_ids = torch.tensor([[self.stop_id]], device=self.device)  # made once: a graph reads no host data
        self._graphs = (CudaGraphs(self._parallel_pass, lambda out: tuple(t.clone() for t in out))
                        if self.device.type == "cuda" else None)
        state_dim = None if projector is None else int(projector.fc1.weight.shape[1])
        self.config = OFTConfig(d_model=width, image_size=modules.image_size, chunk_size=chunk.chunk_size,
                                action_dim=chunk.action_dim, state_dim=state_dim, n_images=chunk.n_images)
        self.tokenizer = None  # no action tokens
        self.info: dict[str, Any] = {"source": source, "unnorm_key": statistics.key,
                                     "forward": "native towers + direct Llama, bidirectional",
                                     "fast_path": "one CUDA graph per pass" if self._graphs else "eager pass (CPU)"}

    # --- what the policy offers ---------------------------------------------------------------
    def capabilities(self) -> PolicyCapabilities:
        # its image slots as its spec says (0: not stated, any count the checkpoint takes)
        return PolicyCapabilities(action_chunk=True, image_slots=self.chunk.n_images or 0)

    @property
    def n_action_tokens(self) -> int:
        return self.chunk.action_dim

    def n_parameters(self) -> dict[str, int]:
        counts = {"target": sum(p.numel() for p in self.modules.model.parameters()),
                  "action_head": sum(p.numel() for p in self.head.parameters())}
        if self.projector is not None:
            counts["proprio_projector"] = sum(p.numel() for p in self.projector.parameters())
        return counts

    # --- inputs -------------------------------------------------------------------------------
    def prompt_ids(self, instruction: str) -> torch.Tensor:
        """(1, L): BOS, OpenVLA's prompt, 29871 unless the prompt ends with it."""
        _, text, _ = self.spec.format_prompt(instruction)
        ids = [self.bos_id, *self.text_tokenizer(text, add_special_tokens=False)["input_ids"]]
        if ids[-1] != OPENVLA_APPENDED_ID:
            ids.append(OPENVLA_APPENDED_ID)
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    def pixel_values(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """(1, 6 x N, S, S): each RGB uint8 image (H, W, 3) as OpenVLA's processor makes it, the
        images stacked along the channels as OFT stacks them; ValueError for a bad image or count."""
        if self.chunk.n_images is not None and len(images) != self.chunk.n_images:
            raise ValueError(f"{self.source}: the model takes {self.chunk.n_images} images (n_images), "
                             f"got {len(images)}")
        if not images:
            raise ValueError("an OFT model needs at least one image")
        stacked = []
        for image in images:
            if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3
                    and image.shape[2] == 3 and min(image.shape[:2]) > 0):
                dtype = getattr(image, "dtype", type(image).__name__)
                raise ValueError(f"every image must be an (H, W, 3) uint8 array, got shape "
                                 f"{getattr(image, 'shape', None)}, dtype {dtype}")
            stacked.append(self.modules.normalised_pixels(self.modules.resized_image(image)))
        return torch.cat(stacked, dim=1)

    def state_input(self, obs: Observation) -> torch.Tensor | None:
        """(1, P) the projector's input: the observation's state (else its joints and gripper),
        normalised as OFT does; None for a model that reads no state."""
        if self.projector is None:
            return None
        raw = obs.proprio if obs.state is None else obs.state
        state = self.statistics.normalise_state(raw)
        return to_device(torch.from_numpy(state), self.device).to(self.dtype)[None]

    # --- the pass -----------------------------------------------------------------------------
    def sequence(self, pixels: torch.Tensor, ids: torch.Tensor,
                 state: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        """The input embeddings (1, q, width) of one pass (module docstring) and the position of
        the 29871 token, where the head's hidden states start."""
        modules = self.modules
        text = modules.embed_ids(ids)
        observed = [modules.image_features(image) for image in pixels.split(CHANNELS_PER_IMAGE, dim=1)]
        if self.projector is not None:
            if state is None:
                raise ValueError(f"{self.source}: the model reads a state (it has a proprio projector); give one")
            observed.append(self.projector(state.to(self.dtype))[:, None])
        empty = text.new_zeros(1, self.chunk.n_action_positions, text.shape[2])
        stop = modules.embed_ids(self._stop_ids)
        embeddings = torch.cat([text[:, :1], *observed, text[:, 1:], empty, stop], dim=1)
        start = sum(part.shape[1] for part in observed) + ids.shape[1] - 1
        return embeddings, start

    def forward(self, pixels: torch.Tensor, ids: torch.Tensor,
                state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One parallel pass: the normalised chunk (1, H, D) in float32 and the hidden states the
        head read (1, H x D, width); replayed as a CUDA graph on a GPU."""
        if self.projector is not None and state is None:
            raise ValueError(f"{self.source}: the model reads a state (it has a proprio projector); give one")
        inputs = (pixels, ids) if state is None else (pixels, ids, state)
        if self._graphs is not None:
            return self._graphs(*inputs)
        return self._parallel_pass(*inputs)

    def _parallel_pass(self, pixels: torch.Tensor, ids: torch.Tensor,
                       state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        embeddings, start = self.sequence(pixels, ids, state)
        length = embeddings.shape[1]
        positions = torch.arange(length, device=self.device)[None]
        hidden = self.modules.forward_embeddings(embeddings, self.modules.new_cache(), positions,
                                                 bidirectional_mask(length, self.device))
        action_hidden = hidden[:, start:start + self.chunk.n_action_positions]
        return self.head(action_hidden).float(), action_hidden

    def predict_chunk(self, obs: Observation) -> ChunkPrediction:
        """The chunk of one observation (its images in the model's slots, its state, its
        instruction): normalised and unnormalised, (H, D) each."""
        with torch.inference_mode():
            normalized, action_hidden = self.forward(self.pixel_values(obs.images), self.prompt_ids(obs.instruction),
                                                     self.state_input(obs))
        values = normalized[0].cpu().double().numpy()
        return ChunkPrediction(values, self.statistics.unnormalise(values), action_hidden)

    # --- the policy contract ------------------------------------------------------------------
    def prefill(self, obs: Observation) -> Prefix:
        """The parallel pass over ``obs``: a prefix that holds its chunk (``action_chunk``)."""
        prediction = self.predict_chunk(obs)
        hidden = prediction.action_hidden
        return Prefix(cache=prediction, action_hidden=hidden[:, :1], tokens=hidden.new_zeros(1, 0, dtype=torch.long),
                      pooled=hidden.float().mean(dim=1), prefix_len=int(hidden.shape[1]))

    def action_chunk(self, prefix: Prefix) -> np.ndarray:
        """(H, D) the unnormalised chunk of the prefix's pass, the gripper (the last value of a 7-D
        action) in the package's convention (1 = open, [0, 1]) by the spec's ``gripper``."""
        prediction = prefix.cache
        if not isinstance(prediction, ChunkPrediction):
            raise ValueError("not the prefix of an OFT pass")
        actions = np.array(prediction.actions, dtype=float)
        if actions.shape[1] == ACTION_DIM:
            actions[:, -1] = gripper_to_ours(actions[:, -1], self.spec.gripper)
        return actions

    def chunk_tokens(self, prefix: Prefix) -> np.ndarray:
        """(D,) the bins of the chunk's first normalised action, for the runtime's bookkeeping."""
        prediction: ChunkPrediction = prefix.cache
        return digitise(np.clip(prediction.normalized[0], -1.0, 1.0))
