"""Which passes ``vla-accel cost`` times for each family, on its model at the published shape.

Token VLAs (``openvla``, ``hf``), through the policy the decoders drive
(:mod:`.published_models`): ``vision`` (the towers and the projector), ``prefill``, ``step_1_token``
(what ``ar`` takes 7 of), ``verify_6_tokens`` (what ``kerv`` takes one of: 7 rows, the proposal's
last token is not fed) and ``prefill_verifying_6`` (the prefill with 6 proposed tokens verified
inside it: ``world_aware`` in free space). OpenVLA-OFT (``oft``): ``vision`` over its two images
and ``chunk_pass``, the whole 8 x 7 chunk from the images, the state and the prompt in one
bidirectional pass.

Flow VLAs (``smolvla``, ``pi0``, ``pi05``: LeRobot's, at the sizes :mod:`.flow_models` builds):
``towers`` (3 cameras), ``vlm`` (the VLM over the prefix), ``flow_step`` (the expert over the chunk's
50 action tokens), ``prefix_incremental_unchanged`` (an unchanged frame: the image rows reused, the
language and SmolVLA's state row recomputed); composed from them: ``prefix`` (towers + vlm),
``chunk_10_steps``, ``chunk_2_steps`` and ``chunk_2_steps_incremental_unchanged``;
``flow_10_steps_guided`` (real-time chunking's guided sampler, static-shape form). Bucketed
incremental vision (:func:`bucket_passes`): ``towers_1_cameras``, ``towers_2_cameras``, each
bucket's rows pass ``prefix_rows_bucket_<rows>`` and its partial prefix ``prefix_bucket_<rows>``
beside the full ``prefix``. On a GPU the full prefix, the 10- and 2-step samplers, the guided
sampler, the towers and each bucket's rows pass are also timed as CUDA graph replays (``*_graph``,
:mod:`vla_accel_ros.models.lerobot.cuda_graph`; the graphed prefix at the real depth only).

Built with fewer text layers than the real depth, a pass's text part is scaled to the real depth
(every layer costs the same): its time, FLOPs and weight bytes beyond the sub-pass it contains that
is measured whole (``whole``: the towers) are multiplied by real / built layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.models.lerobot.cuda_graph import CudaGraphs, clone_prefix, prefix_tensors, with_tensors

INSTRUCTION = "pick up the red cube"
VERIFY_TOKENS = 6


@dataclass(frozen=True)
class PassSpec:
    """One pass: its name, how to run it once, the sub-pass inside it measured whole (None: none),
    whether its time scales with the text layers, for a graph replay the eager passes whose work it
    does (``work_of``: pass -> count; None: its work is counted on its own run), and what runs
    before it is timed and before it is counted (``prepare``: a fresh prefix for a pass over one,
    since a later prefill may take the cache of an earlier one)."""

    name: str
    run: Callable[[], Any]
    whole: str | None = None
    scaled: bool = True
    work_of: dict[str, float] | None = None
    prepare: Callable[[], Any] | None = None


@dataclass(frozen=True)
class PassPlan:
    """A family's passes on one model, the passes composed of them (name -> {pass: count}), the
    text layers built and real, the modules whose weights the passes read, facts for the table and
    the CUDA graph recorders (their ``error`` after a run: why a pass ran eagerly)."""

    passes: list[PassSpec]
    composed: dict[str, dict[str, float]]
    layers_built: int
    layers_real: int
    modules: list[torch.nn.Module]
    facts: dict[str, Any] = field(default_factory=dict)
    policy: Any = None  # a token VLA's policy (what an incremental prefill runs on)
    graphs: list[Any] = field(default_factory=list)  # the CUDA graph recorders, whose error says why one ran eagerly


def observation(size: int, n_images: int = 1, state_dim: int | None = None, seed: int = 0) -> Observation:
    """A random observation: ``n_images`` camera frames of ``size`` px and, with ``state_dim``, a raw state."""
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n_images)]
    state = None if state_dim is None else rng.uniform(-0.5, 0.5, state_dim)
    return Observation(images[0], INSTRUCTION, np.zeros(7), 0.04, 0.0, extra_images=tuple(images[1:]), state=state)


def checkpoint_model(family: str, checkpoint: str, device: torch.device, dtype: torch.dtype) -> Any:
    """The :class:`~.published_models.PublishedModel` record of a checkpoint of ``family`` loaded
    on ``device`` in ``dtype`` (its own depth, nothing scaled); ValueError when it is of another family."""
    from vla_accel_ros.evaluation.published_models import PublishedModel
    from vla_accel_ros.models.load import load_policy, resolve_checkpoint

    resolved = resolve_checkpoint(checkpoint, device=str(device))
    if resolved.family != family:
        raise ValueError(f"--checkpoint {checkpoint}: a checkpoint of the {resolved.family} family, not {family}")
    policy: Any = load_policy(resolved, device=str(device), dtype=str(dtype).removeprefix("torch."))
    modules = [policy.modules.model] + ([policy.head] if family == "oft" else [])
    if family == "oft" and policy.projector is not None:
        modules.append(policy.projector)
    depth = int(policy.modules.text_config.num_hidden_layers)
    return PublishedModel(policy, depth, depth, modules)


def token_plan(family: str, layers: int, device: torch.device, dtype: torch.dtype, shape: Any = None,
               checkpoint: str = "") -> PassPlan:
    """The token VLA ``family``'s passes (module docstring) at ``shape`` (None: the published one,
    :class:`~.published_models.TokenVLAShape`), or on the model of ``checkpoint``."""
    from vla_accel_ros.evaluation.published_models import OFT_IMAGES, OPENVLA_7B, build

    if checkpoint:
        made = checkpoint_model(family, checkpoint, device, dtype)
    else:
        made = build(family, layers, device, dtype, shape or OPENVLA_7B)
    policy = made.policy
    size = int(policy.config.image_size)
    facts: dict[str, Any] = {"parameters_built": int(sum(p.numel() for m in made.modules for p in m.parameters()))}
    if family == "oft":
        obs = observation(size, policy.config.n_images or OFT_IMAGES, policy.config.state_dim)
        pixels = policy.pixel_values(obs.images)
        facts["chunk_shape"] = [policy.config.chunk_size, policy.config.action_dim]
        passes = [PassSpec("vision", lambda: policy.modules.image_features(pixels), scaled=False),
                  PassSpec("chunk_pass", lambda: policy.predict_chunk(obs), whole="vision")]
        return PassPlan(passes, {}, made.layers_built, made.layers_real, made.modules, facts, policy)
    obs = observation(size)
    pixels = policy.pixel_values(obs.image)
    one = torch.tensor([[3]], device=device)
    proposal = torch.arange(3, 3 + VERIFY_TOKENS, device=device)[None]
    prefixes = [policy.prefill(obs)]
    facts["prefix_tokens"] = int(prefixes[0].prefix_len)

    def fresh_prefix() -> None:
        prefixes[0] = policy.prefill(obs)

    passes = [PassSpec("vision", lambda: policy.image_features(pixels), scaled=False),
              PassSpec("prefill", lambda: policy.prefill(obs), whole="vision"),
              PassSpec("step_1_token", lambda: policy.score(prefixes[0], one), prepare=fresh_prefix),
              PassSpec(f"verify_{VERIFY_TOKENS}_tokens", lambda: policy.score(prefixes[0], proposal),
                       prepare=fresh_prefix),
              PassSpec(f"prefill_verifying_{VERIFY_TOKENS}", lambda: policy.prefill_batch([obs], proposal),
                       whole="vision")]
    return PassPlan(passes, {}, made.layers_built, made.layers_real, made.modules, facts, policy)


def flow_plan(kind: str, layers: int, device: torch.device, dtype: torch.dtype, shape: Any = None) -> PassPlan:
    """LeRobot's ``kind`` (smolvla, pi0, pi05): its passes (module docstring); ``shape``: its
    towers' layers (None: the published depth, :func:`~.flow_models.build`)."""
    from vla_accel_ros.evaluation.flow_models import N_CAMERAS, build
    from vla_accel_ros.models.lerobot.modules import model_velocity
    from vla_accel_ros.models.lerobot.policy import euler
    from vla_accel_ros.models.realtime_chunking import ChunkGuide, guide_tensors, guided_euler_static

    model, config, depth = build(kind, layers, device, dtype, shape)
    built = layers or depth
    height, width = config.image_hw
    images = [torch.rand(1, 3, height, width, device=device) * 2 - 1 for _ in range(N_CAMERAS)]
    masks = [torch.ones(1, dtype=torch.bool, device=device)] * N_CAMERAS
    lang = torch.randint(0, 1000, (1, config.tokenizer_max_length), device=device)
    lang_mask = torch.ones(1, config.tokenizer_max_length, dtype=torch.bool, device=device)
    state = torch.zeros(1, config.max_state_dim, device=device)
    noise = torch.randn(1, config.chunk_size, config.max_action_dim, device=device)
    t = torch.ones(1, device=device)
    tokens = model.embed_images(images)
    embedded = model.embed_inputs(tokens, masks, lang, lang_mask, state)
    emb, rest = embedded[0], embedded[1:]
    prefix = model.run_prefix(*embedded)
    # an unchanged frame: the image rows reused, the language (and SmolVLA's state) recomputed
    text_rows = torch.arange(N_CAMERAS * tokens[0].shape[1], emb.shape[1], device=device)
    if kind == "smolvla":
        def step() -> Any:
            return model.velocity(prefix, noise, t)
    else:
        def step() -> Any:
            return model.velocity(prefix, state, noise, t)
    passes = [PassSpec("towers", lambda: model.embed_images(images), scaled=False),
              PassSpec("vlm", lambda: model.run_prefix(*embedded)),
              PassSpec("flow_step", step),
              PassSpec("prefix_incremental_unchanged",
                       lambda: model.run_prefix_rows(text_rows, emb[:, text_rows], *rest, prefix))]
    composed = {"prefix": {"towers": 1, "vlm": 1},
                "chunk_10_steps": {"towers": 1, "vlm": 1, "flow_step": 10},
                "chunk_2_steps": {"towers": 1, "vlm": 1, "flow_step": 2},
                "chunk_2_steps_incremental_unchanged": {"prefix_incremental_unchanged": 1, "flow_step": 2}}
    guide = guide_tensors(ChunkGuide(noise.flip(1), torch.ones(config.chunk_size, 1, device=device), 5, 5.0),
                          noise.shape, device)

    def guided(prefix: Any, state: torch.Tensor, noise: torch.Tensor, *guide: torch.Tensor, steps: int = 10) -> Any:
        def velocity(x: torch.Tensor, tau: float) -> torch.Tensor:
            t = torch.full((x.shape[0],), 1.0 - tau, dtype=torch.float32, device=x.device)
            return -model_velocity(model, prefix, state, x, t)

        return guided_euler_static(velocity, noise, steps, *guide)

    passes.append(PassSpec("flow_10_steps_guided", lambda: guided(prefix, state, noise, *guide),
                           work_of={"flow_step": 10}))
    buckets, graphs = bucket_passes(model, prefix, images, tokens, lang, lang_mask, state, passes, composed)
    if device.type == "cuda":
        flat = prefix_tensors(prefix)
        sampler = CudaGraphs(lambda *x: guided(with_tensors(prefix, x[:-6]), *x[-6:]), torch.Tensor.clone)
        passes.append(PassSpec("flow_10_steps_guided_graph", lambda: sampler(*flat, state, noise, *guide),
                               work_of={"flow_step": 10}))
        graphs.append(sampler)
        flat = prefix_tensors(prefix)
        for steps in (10, 2):
            sampler = CudaGraphs(lambda *x, k=steps: euler(model, with_tensors(prefix, x[:-2]), x[-2], x[-1], k),
                                 torch.Tensor.clone)
            passes.append(PassSpec(f"flow_{steps}_steps_graph", lambda s=sampler: s(*flat, state, noise),
                                   work_of={"flow_step": steps}))
            graphs.append(sampler)

        def full_prefix(*x: torch.Tensor) -> Any:
            tokens = model.embed_images(list(x[:N_CAMERAS]))
            return model.run_prefix(*model.embed_inputs(tokens, masks, *x[N_CAMERAS:]))

        whole = CudaGraphs(full_prefix, clone_prefix)
        if built == depth:  # a graph is timed whole: its layers cannot be scaled apart from its towers
            passes.append(PassSpec("prefix_graph", lambda: whole(*images, lang, lang_mask, state), scaled=False,
                                   work_of={"towers": 1, "vlm": 1}))
            composed["chunk_2_steps_graph"] = {"prefix_graph": 1, "flow_2_steps_graph": 1}
            composed["chunk_10_steps_graph"] = {"prefix_graph": 1, "flow_10_steps_graph": 1}
        graphs.append(whole)
    facts = {"prefix_tokens": int(emb.shape[1]), "parameters_built": int(sum(p.numel() for p in model.parameters())),
             "image_tokens": int(N_CAMERAS * tokens[0].shape[1]), "buckets": list(buckets)}
    return PassPlan(passes, composed, built, depth, [model], facts, graphs=graphs)


def bucket_passes(model: Any, prefix: Any, images: list[torch.Tensor], tokens: list[torch.Tensor], lang: torch.Tensor,
                  lang_mask: torch.Tensor, state: torch.Tensor, passes: list[PassSpec],
                  composed: dict[str, dict[str, float]]) -> tuple[tuple[int, ...], list[Any]]:
    """Bucketed incremental vision's passes (:mod:`vla_accel_ros.models.lerobot.buckets`), added to
    ``passes`` and ``composed``: the towers of 1 and 2 cameras (``towers_1_cameras``,
    ``towers_2_cameras``; all 3 are ``towers``), each bucket's rows pass over its first image rows
    (``prefix_rows_bucket_<rows>``) and the partial prefix of each bucket (``prefix_bucket_<rows>``:
    the towers of the cameras those rows lie in, and the rows pass), beside the full ``prefix``; on a
    GPU also each as graph replays (``*_graph``). The bucket sizes, and the graph recorders."""
    from vla_accel_ros.evaluation.flow_models import N_CAMERAS
    from vla_accel_ros.models.lerobot.buckets import (
        DEFAULT_BUCKETS,
        bucket_rows,
        bucket_sizes,
        first_rows,
        padded_rows_pass,
    )

    device = state.device
    per_camera = int(tokens[0].shape[1])
    sizes = bucket_sizes(N_CAMERAS * per_camera, DEFAULT_BUCKETS)
    pixels = torch.cat(images)
    cuda = device.type == "cuda"
    towers = CudaGraphs(lambda p: model.embed_images([p])[0], torch.Tensor.clone)
    rows_graphs = CudaGraphs(lambda *x: padded_rows_pass(model, N_CAMERAS, prefix, *x), clone_prefix)
    flat = prefix_tensors(prefix)
    tower_names = {N_CAMERAS: "towers"}
    for k in range(1, N_CAMERAS):
        tower_names[k] = f"towers_{k}_cameras"
        passes.append(PassSpec(tower_names[k], lambda k=k: model.embed_images([pixels[:k]]), scaled=False))
    for k in range(1, N_CAMERAS + 1) if cuda else ():
        passes.append(PassSpec(f"{tower_names[k]}_graph", lambda k=k: towers(pixels[:k]), scaled=False,
                               work_of={tower_names[k]: 1}))
    for size in sizes:
        dynamic = first_rows(size, N_CAMERAS, per_camera, device)
        args = (torch.zeros(1, size, tokens[0].shape[-1], dtype=tokens[0].dtype, device=device),
                bucket_rows(dynamic, size, per_camera, prefix.length), lang, lang_mask, state, *flat)
        name = f"prefix_rows_bucket_{size}"
        passes.append(PassSpec(name, lambda a=args: padded_rows_pass(model, N_CAMERAS, prefix, *a)))
        cameras = sum(1 for rows in dynamic if len(rows))
        parts = {name: 1.0, **({tower_names[cameras]: 1.0} if cameras else {})}
        composed[f"prefix_bucket_{size}"] = parts
        if cuda:
            passes.append(PassSpec(f"{name}_graph", lambda a=args: rows_graphs(*a), work_of={name: 1}))
            composed[f"prefix_bucket_{size}_graph"] = {f"{p}_graph": n for p, n in parts.items()}
    return sizes, [towers, rows_graphs] if cuda else []

