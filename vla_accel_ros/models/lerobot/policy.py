"""A LeRobot flow policy (SmolVLA, π0, π0.5) as this package runs it: one observation in, a chunk out.

``predict_chunk(images, state, instruction, noise, steps)`` does what LeRobot's preprocessor,
``predict_action_chunk`` and postprocessor do together:

1. the state normalised with the preprocessor's statistics and zero-padded to ``max_state_dim``;
   the images in the config's camera order; the instruction with a newline (π0.5: the prompt of
   the task and the binned normalised state), tokenized;
2. the prefix computed once (:meth:`prefix`), its keys and values reused by every flow step;
3. ``steps`` Euler steps from the noise at t = 1 towards t = 0, x <- x - (1/steps) v(x, t), with
   t = 1, 1 - 1/steps, ..., 1/steps (10 steps: 1.0 ... 0.1);
4. the chunk cut to the action's width, then unnormalised with the postprocessor's statistics.

The noise is ``chunk_size`` x ``max_action_dim`` standard normal, as LeRobot draws it; giving the
same noise gives the same chunk.
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
from vla_accel_ros.models.lerobot.config import LeRobotConfig
from vla_accel_ros.models.lerobot.cuda_graph import clone_prefix, prefix_tensors, with_tensors
from vla_accel_ros.models.lerobot.modules import model_velocity
from vla_accel_ros.models.lerobot.processor import (
    Statistics,
    image_tensor,
    resize_with_pad,
    state_prompt,
    tokenize,
    tokenize_text,
)
from vla_accel_ros.models.lerobot.student import FlowStudent
from vla_accel_ros.models.realtime_chunking import ChunkGuide, guide_tensors, guided_euler, guided_euler_static


@dataclass(frozen=True)
class ModelInputs:
    """One observation as the model takes it (batch 1): pixels per camera in [-1, 1], the
    normalised, padded state, the tokenized prompt, and the instruction it was made of (π0.5's
    prompt also carries the state)."""

    images: list[torch.Tensor]
    state: torch.Tensor
    lang_tokens: torch.Tensor
    lang_masks: torch.Tensor
    instruction: str = ""


@dataclass(frozen=True, eq=False)
class FlowPrefix:
    """A flow policy's :class:`~vla_accel_ros.models.api.Prefix` cache: the prefix's keys and values
    and the model inputs the flow steps read. Never cropped: the flow decodes no tokens."""

    kv: Any
    inputs: ModelInputs

    def cropped(self, length: int) -> FlowPrefix:
        return self

    def rows(self, rows: list[int]) -> FlowPrefix:
        if rows != [0]:
            raise ValueError("a flow policy's prefix holds one observation")
        return self


@dataclass(frozen=True)
class Chunk:
    """A predicted chunk: ``actions`` (H, action dim) unnormalised, ``normalized`` before that."""

    actions: np.ndarray
    normalized: np.ndarray


class LeRobotPolicy:
    """A SmolVLA, π0 or π0.5 checkpoint directory, loaded natively (the module docstring)."""

    family = "lerobot"

    def __init__(self, config: LeRobotConfig, model: Any, statistics: Statistics, tokenizer: Any,
                 token_settings: dict[str, Any], student: FlowStudent | None = None,
                 device: torch.device | None = None) -> None:
        self.config = config
        self.model = model
        self.statistics = statistics  # applied on the CPU, to the state going in and the chunk coming out
        self.tokenizer = tokenizer
        self.token_settings = token_settings
        self.student = student  # the fitted 2-step sampler (vla-accel train-flow), when there is one
        self.device = torch.device("cpu") if device is None else device  # where the model and its inputs are
        # on a GPU the full prefix and the unguided sampler replay as CUDA graphs (:mod:`.cuda_graph`)
        self.cuda_graphs = self.device.type == "cuda"
        self._sampler_graphs: dict[tuple[int, bool], CudaGraphs] = {}  # per (steps, student)
        self._guided_graphs: dict[tuple[int, bool], CudaGraphs] = {}  # real-time chunking's, per (steps, student)
        self._prefix_graphs = CudaGraphs(self._prefix_pass, clone_prefix)

    @property
    def dtype(self) -> torch.dtype:
        return next(p.dtype for n, p in self.model.named_parameters() if n.startswith(("vlm.", "paligemma.")))

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the passes compute in: the language model's layers' (the tower, projector and
        norms LeRobot keeps in float32 in a bfloat16 model do not set it)."""
        stack = self.model.vlm.text_model if self.config.type == "smolvla" else self.model.language_model
        dtype: torch.dtype = stack.layers[0].self_attn.q_proj.weight.dtype
        return dtype

    def capabilities(self) -> PolicyCapabilities:
        return PolicyCapabilities(flow_head=True, flow_chunks=True, chunk_guidance=True,
                                  incremental_prefill=True,
                                  image_slots=len(self.config.camera_names))

    # --- the runtime's contract (the package's runner, the node) ------------------------------
    def prefill(self, obs: Observation, incremental: Any = None) -> Prefix:
        """The prefix of one robot observation: its cameras' images (in the config's camera order),
        its state (the joints then the gripper opening) and instruction; the cache holds the keys
        and values and the model inputs the flow steps read. ``incremental``: an
        :meth:`incremental_vision` that makes the prefix, reusing unchanged image tokens."""
        state = np.concatenate([np.asarray(obs.joint_pos, dtype=np.float64), [float(obs.gripper)]])
        inputs = self.inputs(list(obs.images), state, obs.instruction)
        with torch.inference_mode():
            kv = self.prefix(inputs) if incremental is None else incremental.prefix(inputs)
        empty = torch.zeros(1, 1, 1)
        return Prefix(cache=FlowPrefix(kv, inputs), action_hidden=empty, tokens=torch.zeros(1, 0, dtype=torch.long),
                      pooled=empty[:, 0], prefix_len=int(kv.length))

    def sample_chunk(self, prefix: Prefix, noise: torch.Tensor, steps: int, guide: ChunkGuide | None = None,
                     student: bool = False) -> np.ndarray:
        """The unnormalised chunk (H, action dim) from a :meth:`prefill` prefix and the noise; with
        ``guide`` (in :meth:`sample_space`), real-time chunking's guided sampler; ``student``: the
        fitted 2-step sampler when the directory has one (else ``steps`` Euler steps)."""
        cache = prefix.cache
        noise = noise.reshape(1, *self.noise_shape())
        fitted = self.student if student else None
        if guide is None:
            with torch.inference_mode():
                sample = self.flow(cache.kv, cache.inputs.state, noise.to(self.device), steps, fitted)[0]
        else:
            field = fitted.velocity_model() if fitted is not None else None
            steps = fitted.steps if fitted is not None else steps

            def velocity(x: torch.Tensor, tau: float) -> torch.Tensor:  # LeRobot's time runs from 1 (noise) to 0
                t = torch.tensor(1.0 - tau, dtype=torch.float32, device=self.device).expand(x.shape[0])
                return -self.velocity(cache.kv, cache.inputs, x.to(self.device), t, field).to(x.device)

            if self.cuda_graphs:
                with torch.inference_mode():
                    sample = self.guided_flow(cache.kv, cache.inputs.state, noise.to(self.device), steps, guide,
                                              fitted)[0]
            else:
                # the guide lives on the CPU with the chunk; the cached prefix was made in inference
                # mode: no backward pass through it
                sample = guided_euler(velocity, noise, steps, guide, differentiable=False)[0]
        actions = self.statistics.action.unnormalise(sample[:, : self.config.action_dim].cpu())
        return np.asarray(actions.detach().numpy(), dtype=np.float64)

    def sample_space(self, actions: np.ndarray) -> torch.Tensor:
        """Unnormalised actions (H, action dim) as the sampler's (H, max_action_dim): normalised, padded."""
        normalised = self.statistics.action.normalise(torch.as_tensor(np.asarray(actions, dtype=np.float32)))
        return torch.nn.functional.pad(normalised, (0, self.config.max_action_dim - self.config.action_dim))

    def check_robot(self, state_dim: int, action_dim: int) -> None:
        """ValueError unless the robot's state and action widths are the config's."""
        config = self.config
        if state_dim != config.state_dim or action_dim != config.action_dim:
            raise ValueError(f"{config.path}: the policy takes a state of {config.state_dim} and gives actions of "
                             f"{config.action_dim}; the robot has {state_dim} and {action_dim}")

    # --- inputs -----------------------------------------------------------------------------
    def inputs(self, images: Sequence[Any], state: Any, instruction: str) -> ModelInputs:
        """The model's inputs for one observation: ``images`` one per camera in the config's order
        (H x W x 3 uint8, or 3 x H x W float in [0, 1]), ``state`` the raw state."""
        config = self.config
        if len(images) != len(config.camera_names):
            raise ValueError(f"{config.path}: the policy takes {len(config.camera_names)} images "
                             f"({', '.join(config.camera_names)}), got {len(images)}")
        state_tensor = torch.as_tensor(np.asarray(state, dtype=np.float32)).reshape(1, -1)
        if state_tensor.shape[1] != config.state_dim:
            raise ValueError(f"{config.path}: observation.state has {config.state_dim} values, got "
                             f"{state_tensor.shape[1]}")
        normalised = self.statistics.state.normalise(state_tensor)
        padded = torch.nn.functional.pad(normalised, (0, config.max_state_dim - config.state_dim))
        height, width = config.image_hw
        pixels = [resize_with_pad(image_tensor(image), height, width, centred=config.paligemma) * 2.0 - 1.0
                  for image in images]
        ids, mask = self.prompt_tokens([instruction], normalised, self.token_settings)
        device = self.device
        return ModelInputs([p.to(device) for p in pixels], padded.to(device), ids.to(device), mask.to(device),
                           instruction)

    def prompt_tokens(self, instructions: Sequence[str], states: torch.Tensor | None,
                      settings: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, masks) (N, L) of the prompts LeRobot's preprocessor tokenizes for N instructions
        and their normalised states (N, state width), which only π0.5's prompt reads (the others
        take None)."""
        if self.config.type == "pi05":
            if states is None:
                raise ValueError(f"{self.config.path}: a π0.5 prompt carries the state; none given")
            return tokenize_text(self.tokenizer, [state_prompt(text, state) for text, state
                                                  in zip(instructions, states, strict=True)], settings)
        ids, masks = zip(*(tokenize(self.tokenizer, text, settings) for text in instructions), strict=True)
        return torch.cat(ids), torch.cat(masks)

    # --- the flow ---------------------------------------------------------------------------
    def prefix(self, inputs: ModelInputs) -> Any:
        """The prefix's keys and values, computed once per chunk (for a batch of observations too)."""
        if self.cuda_graphs:
            return self._prefix_graphs(*inputs.images, inputs.state, inputs.lang_tokens, inputs.lang_masks)
        return self._prefix_pass(*inputs.images, inputs.state, inputs.lang_tokens, inputs.lang_masks)

    def _prefix_pass(self, *tensors: torch.Tensor) -> Any:
        """The prefix of every camera's pixels, then the state, the tokens and their mask."""
        *images, state, lang_tokens, lang_masks = tensors
        model = self.model
        masks = [torch.ones(state.shape[0], dtype=torch.bool, device=state.device) for _ in images]
        return model.run_prefix(*model.embed_inputs(model.embed_images(images), masks, lang_tokens, lang_masks, state))

    def velocity(self, prefix: Any, inputs: ModelInputs, x: torch.Tensor, t: torch.Tensor,
                 model: Any = None) -> torch.Tensor:
        """One flow step's velocity (B, H, max_action_dim) over a computed prefix, of the policy's
        model or of ``model`` (a student's copy of its flow-step modules)."""
        return model_velocity(self.model if model is None else model, prefix, inputs.state, x, t)

    def integrate(self, prefix: Any, inputs: ModelInputs, noise: torch.Tensor, steps: int) -> torch.Tensor:
        """``steps`` Euler steps from the noise at t = 1, every step over the same prefix."""
        return euler(self.model, prefix, inputs.state, noise, steps)

    @property
    def graph_shapes(self) -> int:
        """How many CUDA graphs were recorded: the prefix's, one per input shape, and the sampler's,
        one per steps, student and input shape."""
        return len(self._prefix_graphs) + sum(len(graphs) for graphs in
                                              [*self._sampler_graphs.values(), *self._guided_graphs.values()])

    @property
    def graph_errors(self) -> list[str]:
        """Why a pass runs eagerly on the GPU although graphs were asked for (empty: none does)."""
        every = [("prefix", self._prefix_graphs),
                 *((f"{steps}-step sampler", graphs) for (steps, _), graphs in self._sampler_graphs.items()),
                 *((f"{steps}-step guided sampler", graphs) for (steps, _), graphs in self._guided_graphs.items())]
        return [f"{name}: {graphs.error}" for name, graphs in every if graphs.error]

    def flow(self, prefix: Any, state: torch.Tensor, noise: torch.Tensor, steps: int,
             fitted: FlowStudent | None = None) -> torch.Tensor:
        """The unguided sample from ``noise``: ``steps`` Euler steps, or the fitted student's
        sampler; on a GPU replayed as a CUDA graph (a flow step reads the prefix and the state only)."""
        def sample(prefix: Any, state: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
            if fitted is None:
                return euler(self.model, prefix, state, noise, steps)
            return fitted.sample(lambda x, t, model: model_velocity(model or self.model, prefix, state, x, t), noise)

        if not self.cuda_graphs:
            return sample(prefix, state, noise)
        key = (steps, fitted is not None)
        if key not in self._sampler_graphs:  # the first prefix gives the structure every run rebuilds
            self._sampler_graphs[key] = CudaGraphs(
                lambda *t, shape=prefix: sample(with_tensors(shape, t[:-2]), t[-2], t[-1]), torch.Tensor.clone)
        return self._sampler_graphs[key](*prefix_tensors(prefix), state, noise)

    def guided_flow(self, prefix: Any, state: torch.Tensor, noise: torch.Tensor, steps: int, guide: ChunkGuide,
                    fitted: FlowStudent | None = None) -> torch.Tensor:
        """Real-time chunking's guided sample (B, H, max_action_dim) from ``noise`` on the device:
        ``steps`` guided Euler steps (the fitted student's field and step count with ``fitted``) in
        the static-shape form (:func:`~vla_accel_ros.models.realtime_chunking.guided_euler_static`),
        the guide in the sampler's space; on a GPU replayed as a CUDA graph per steps and student."""
        field = fitted.velocity_model() if fitted is not None else None
        steps = fitted.steps if fitted is not None else steps
        guided = guide_tensors(guide, noise.shape, noise.device)

        def sample(prefix: Any, state: torch.Tensor, noise: torch.Tensor, *guided: torch.Tensor) -> torch.Tensor:
            def velocity(x: torch.Tensor, tau: float) -> torch.Tensor:  # LeRobot's time runs from 1 (noise) to 0
                t = torch.full((x.shape[0],), 1.0 - tau, dtype=torch.float32, device=x.device)
                return -model_velocity(self.model if field is None else field, prefix, state, x, t)

            return guided_euler_static(velocity, noise, steps, *guided)

        if not self.cuda_graphs:
            return sample(prefix, state, noise, *guided)
        key = (steps, fitted is not None)
        if key not in self._guided_graphs:  # the first prefix gives the structure every run rebuilds
            self._guided_graphs[key] = CudaGraphs(
                lambda *t, shape=prefix: sample(with_tensors(shape, t[:-6]), *t[-6:]), torch.Tensor.clone)
        return self._guided_graphs[key](*prefix_tensors(prefix), state, noise, *guided)

    def noise_shape(self) -> tuple[int, int]:
        return self.config.chunk_size, self.config.max_action_dim

    def incremental_vision(self, settings: Any = None, buckets: Sequence[float] | None = None,
                           costs: Any = None) -> Any:
        """The incremental prefix over a stream of frames under ``settings`` (a
        :class:`~vla_accel_ros.models.configuration.VisionReuseConfig`; :mod:`.incremental`).
        ``buckets``: fractions of the image tokens the changed rows are padded to, each bucket a
        CUDA graph on a GPU, chosen per frame against the full prefix from ``costs`` (a
        :class:`~.buckets.PrefixCosts`; None: measured on the first frame on a GPU; :mod:`.buckets`);
        empty: unbucketed; None: bucketed on a GPU (:data:`~.buckets.DEFAULT_BUCKETS`), not on the CPU."""
        from vla_accel_ros.models.lerobot.buckets import DEFAULT_BUCKETS, BucketedIncrementalPrefix
        from vla_accel_ros.models.lerobot.incremental import IncrementalPrefix

        if buckets is None:
            buckets = DEFAULT_BUCKETS if self.device.type == "cuda" else ()
        if not buckets:
            return IncrementalPrefix(self, settings)
        return BucketedIncrementalPrefix(self, settings, buckets, costs)

    def incremental_prefill(self, settings: Any) -> Any:
        """The runtime's incremental prefill (``vision_reuse*``) over :meth:`incremental_vision`."""
        from vla_accel_ros.models.lerobot.incremental import RuntimePrefill

        return RuntimePrefill(self, self.incremental_vision(settings))

    def sample(self, inputs: ModelInputs, noise: Any = None, steps: int | None = None,
               generator: torch.Generator | None = None, incremental: Any = None) -> torch.Tensor:
        """The normalised chunk (H, max_action_dim) float32 on the CPU, before cutting (module docstring);
        ``incremental``: an :meth:`incremental_vision` that makes the prefix."""
        steps = self.config.num_steps if steps is None else int(steps)
        if steps <= 0:
            raise ValueError(f"steps must be positive, got {steps}")
        shape = self.noise_shape()
        if noise is None:
            noise_tensor = torch.randn(shape, generator=generator)
        else:
            noise_tensor = torch.as_tensor(np.asarray(noise, dtype=np.float32))
            if tuple(noise_tensor.shape) != shape:
                raise ValueError(f"noise must be chunk_size x max_action_dim = {shape[0]} x {shape[1]}, got "
                                 f"{' x '.join(map(str, noise_tensor.shape))}")
        with torch.inference_mode():
            prefix = self.prefix(inputs) if incremental is None else incremental.prefix(inputs)
            return self.flow(prefix, inputs.state, noise_tensor[None].to(self.device), steps)[0].cpu()

    def predict_chunk(self, images: Sequence[Any], state: Any, instruction: str, noise: Any = None,
                      steps: int | None = None, generator: torch.Generator | None = None,
                      incremental: Any = None) -> Chunk:
        """The chunk for one observation (module docstring)."""
        sample = self.sample(self.inputs(images, state, instruction), noise, steps, generator, incremental)
        normalized = sample[:, : self.config.action_dim]
        actions = self.statistics.action.unnormalise(normalized)
        return Chunk(actions.numpy().astype(np.float64), normalized.numpy().astype(np.float64))

    def n_parameters(self) -> dict[str, int]:
        return {"total": sum(p.numel() for p in self.model.parameters())}


def euler(model: Any, prefix: Any, state: torch.Tensor, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` Euler steps of ``model``'s field from the noise at t = 1 over one prefix; the flow
    times are device fills, so that a CUDA graph can record the loop."""
    dt = -1.0 / steps
    x = noise
    for step in range(steps):
        t = torch.full((x.shape[0],), 1.0 + step * dt, dtype=torch.float32, device=x.device)
        x = x + dt * model_velocity(model, prefix, state, x, t)
    return x
