"""What SmolVLA, π0 and π0.5 cost at their real shapes on this machine: the prefix (vision towers
and the VLM), one flow step (the expert over the chunk's action tokens), and a whole chunk, with
and without the accelerators (2 flow steps; incremental vision on an unchanged frame, where only
the language rows, and SmolVLA's state row, run).

Random weights at the published sizes: SmolVLA = SmolVLM2-500M's vision tower (768 wide, 12 layers,
512 px, patch 16, pixel shuffle 4: 64 tokens per camera) and its first 16 text layers (960 wide, 15
heads, 5 kv heads, head_dim 64), an expert 0.75 x as wide; π0 = SigLIP so400m/14 at 224 px, Gemma
2B and a Gemma-300M expert (18 layers each), π0.5 the same with its adaptive expert norms. All
take 3 cameras and a chunk of 50; SmolVLA and π0 48 language tokens, π0.5 200 (its default, the
prompt carrying the state). On the CPU, times are CPU seconds of this process (with one torch
thread, the cost of the pass on one core, whatever else the machine runs); on a GPU (``device`` cuda), wall seconds from
the pass's start to the GPU's finishing it, after warm-up passes, and the full prefix and the
sampler (10 and 2 steps) are also timed as CUDA graph replays (``*_graph_s``, as the policy runs
them there: :mod:`vla_accel_ros.models.lerobot.cuda_graph`). The text stacks can be built with
fewer layers (``layers``): their time is then scaled by the real depth over the layers built (each
layer costs the same), the towers' time is measured whole (a graphed prefix only at the real depth).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_accel_ros.models.lerobot.config import GEMMA_VARIANTS, parse_config
from vla_accel_ros.models.lerobot.cuda_graph import CudaGraphs, clone_prefix, prefix_tensors, with_tensors
from vla_accel_ros.models.lerobot.policy import euler

SMOLVLA_LAYERS = 16
N_CAMERAS = 3


@dataclass(frozen=True)
class LeRobotCostOptions:
    type: str = "smolvla"
    layers: int = 0  # text layers built (VLM and expert); 0 = the real depth
    dtype: str = "bfloat16"
    repeats: int = 3
    threads: int = 1
    out: str = "outputs/lerobot_cost"
    device: str = "cpu"


def _config(kind: str, layers: int) -> dict[str, Any]:
    cameras = {f"observation.images.camera{i + 1}": {"type": "VISUAL", "shape": [3, 256, 256]}
               for i in range(N_CAMERAS)}
    raw: dict[str, Any] = {"type": kind, "input_features": {"observation.state": {"type": "STATE", "shape": [6]},
                                                            **cameras},
                           "output_features": {"action": {"type": "ACTION", "shape": [6]}}}  # the type's prompt length
    if kind == "smolvla":
        raw.update(num_vlm_layers=layers or SMOLVLA_LAYERS, num_expert_layers=0, pad_language_to="max_length",
                   prefix_length=0)
    return raw


def smolvlm2_500m_config(text_layers: int) -> Any:
    """SmolVLM2-500M's config at its published sizes (the hub is not read)."""
    from transformers import SmolVLMConfig

    return SmolVLMConfig(
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                           patch_size=16, image_size=512),
        text_config=dict(model_type="llama", hidden_size=960, intermediate_size=2560, num_hidden_layers=text_layers,
                         num_attention_heads=15, num_key_value_heads=5, head_dim=64, vocab_size=49280,
                         rms_norm_eps=1e-5),
        scale_factor=4)


def build(kind: str, layers: int, dtype: torch.dtype) -> tuple[Any, Any, int]:
    """(model, config, the real text depth) with random weights in ``dtype`` (projections float32)."""
    path = Path(f"<{kind} real shape>") / "config.json"
    config = parse_config(path, _config(kind, layers))
    if kind == "smolvla":
        from vla_accel_ros.models.lerobot.smolvla import SmolVLAModel

        model: Any = SmolVLAModel(config, smolvlm2_500m_config(config.num_vlm_layers))
        depth = SMOLVLA_LAYERS
    else:
        from vla_accel_ros.models.lerobot.modules import paligemma_family_model
        from vla_accel_ros.models.lerobot.pi0 import VisionShape, build_configs

        vision = VisionShape(1152, 27, 4304, 14, 224, GEMMA_VARIANTS["gemma_2b"].width)
        model = paligemma_family_model(config, *build_configs(config, vision, 257_152, depth=layers))
        depth = GEMMA_VARIANTS["gemma_2b"].depth
    for name, parameter in model.named_parameters():
        if name.startswith(("vlm.", "expert.", "paligemma.")) and not (
                config.paligemma and any(p in name for p in ("vision_tower", "multi_modal_projector", "norm"))):
            parameter.data = parameter.data.to(dtype)
    model.eval().requires_grad_(False)
    return model, config, depth


def _median_s(run: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """The median cost of ``run``: on the CPU its CPU time (the process's, all its threads), what the
    pass costs, not what the machine's other load makes it wait; on a GPU the wall time until the
    GPU finished it, after two warm-up runs (kernel selection, allocator)."""
    if device.type == "cpu":
        clock, sync = time.process_time, (lambda: None)
    else:
        clock, sync = time.perf_counter, (lambda: torch.cuda.synchronize(device))
        for _ in range(2):
            run()
    times = []
    for _ in range(repeats):
        sync()
        start = clock()
        run()
        sync()
        times.append(clock() - start)
    return statistics.median(times)


def lerobot_cost(opts: LeRobotCostOptions) -> dict[str, Any]:
    """The cost table (module docstring) as a dict, also written to ``out``/summary.json."""
    if opts.threads > 0:
        torch.set_num_threads(opts.threads)
    device = torch.device(opts.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {opts.device!r}: this torch sees no CUDA device")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[opts.dtype]
    model, config, depth = build(opts.type, opts.layers, dtype)
    model.to(device)
    built = opts.layers or depth
    scale = depth / built
    height, width = config.image_hw
    images = [torch.rand(1, 3, height, width, device=device) * 2 - 1 for _ in range(N_CAMERAS)]
    masks = [torch.ones(1, dtype=torch.bool, device=device)] * N_CAMERAS
    lang = torch.randint(0, 1000, (1, config.tokenizer_max_length), device=device)
    lang_mask = torch.ones(1, config.tokenizer_max_length, dtype=torch.bool, device=device)
    state = torch.zeros(1, config.max_state_dim, device=device)
    noise = torch.randn(1, config.chunk_size, config.max_action_dim, device=device)
    t = torch.ones(1, device=device)

    def median_s(run: Callable[[], Any]) -> float:
        return _median_s(run, opts.repeats, device)

    with torch.inference_mode():
        tokens = model.embed_images(images)
        embedded = model.embed_inputs(tokens, masks, lang, lang_mask, state)
        emb, rest = embedded[0], embedded[1:]
        prefix = model.run_prefix(*embedded)
        # an unchanged frame: the image rows reused, the language (and SmolVLA's state) recomputed
        text_rows = torch.arange(N_CAMERAS * tokens[0].shape[1], emb.shape[1], device=device)
        vlm = median_s(lambda: model.run_prefix(*embedded))
        if opts.type == "smolvla":
            step = median_s(lambda: model.velocity(prefix, noise, t))
        else:
            step = median_s(lambda: model.velocity(prefix, state, noise, t))
        rows = median_s(lambda: model.run_prefix_rows(text_rows, emb[:, text_rows], *rest, prefix))
        towers = median_s(lambda: model.embed_images(images))
        graphed: dict[Any, float] = {}  # on a GPU: each pass as one CUDA graph replay, its copies included
        graph_errors: list[str] = []  # a pass that could not be recorded (timed eagerly)
        if device.type == "cuda":
            flat = prefix_tensors(prefix)
            for steps in (10, 2):
                sampler = CudaGraphs(lambda *t, k=steps: euler(model, with_tensors(prefix, t[:-2]), t[-2], t[-1], k),
                                     torch.Tensor.clone)
                graphed[steps] = median_s(lambda sampler=sampler: sampler(*flat, state, noise)) * scale

            def full_prefix(*t: torch.Tensor) -> Any:
                tokens = model.embed_images(list(t[:N_CAMERAS]))
                return model.run_prefix(*model.embed_inputs(tokens, masks, *t[N_CAMERAS:]))

            whole = CudaGraphs(full_prefix, clone_prefix)
            graphed["prefix"] = median_s(lambda: whole(*images, lang, lang_mask, state))
            graph_errors += [graphs.error for graphs in (sampler, whole) if graphs.error]
    prefix_s = towers + vlm * scale
    step_s = step * scale
    table = {"prefix_s": prefix_s, "towers_s": towers, "vlm_s": vlm * scale, "flow_step_s": step_s,
             "chunk_10_steps_s": prefix_s + 10 * step_s, "chunk_2_steps_s": prefix_s + 2 * step_s}
    table["prefix_incremental_unchanged_s"] = rows * scale  # no tower: the text rows only
    table["chunk_2_steps_incremental_unchanged_s"] = rows * scale + 2 * step_s
    if graphed:
        whole = graphed["prefix"] if opts.layers in (0, depth) else math.nan  # a graph is timed whole: real depth only
        table.update({"prefix_graph_s": whole, "flow_10_steps_graph_s": graphed[10], "flow_2_steps_graph_s": graphed[2],
                      "chunk_10_steps_graph_s": whole + graphed[10], "chunk_2_steps_graph_s": whole + graphed[2],
                      "chunk_2_steps_incremental_unchanged_graph_s": rows * scale + graphed[2]})
    summary = {"options": asdict(opts), "prefix_tokens": int(emb.shape[1]), "text_layers_built": built,
               "text_layers_real": depth, "threads": torch.get_num_threads(),
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "parameters_built": int(sum(p.numel() for p in model.parameters())), "graph_errors": graph_errors,
               "table": {k: round(float(v), 4) for k, v in table.items() if np.isfinite(v)}}
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
