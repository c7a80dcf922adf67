"""Checkpoint I/O: a directory with ``model.safetensors`` (all weights) and ``model.json``
(format version, config, tokenizer, proprio statistics, training recipe and metrics), plus
optional components loaded when present: the continuous action head (``flow_head.*``) and the
world-aware prefill (``world.*``).

Loading never executes code (no pickle) and every problem is reported as a CheckpointError that
names the offending file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from vla_accel_ros.models.draft import ContactHead, DraftHead
from vla_accel_ros.models.flow import FlowHeadConfig, FlowHeads
from vla_accel_ros.models.policy import Policy
from vla_accel_ros.models.vla import PROPRIO_DIM, VLAConfig, VLATarget
from vla_accel_ros.models.world import FrameAutoencoderConfig, WorldBiasConfig, WorldPrefill
from vla_accel_ros.tokenizer import ActionTokenizer

FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"
FLOW_WEIGHTS_FILE = "flow_head.safetensors"  # optional continuous action head (vla-accel train-flow)
FLOW_META_FILE = "flow_head.json"
WORLD_WEIGHTS_FILE = "world.safetensors"  # optional world-aware prefill (vla-accel train-world)
WORLD_META_FILE = "world.json"
_PARTS = ("target", "draft", "contact_head")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; ``file`` is the path at fault."""

    def __init__(self, file: Path | str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = Path(file)
        self.problem = problem


def _modules(policy: Policy) -> dict[str, torch.nn.Module]:
    return {"target": policy.target, "draft": policy.draft, "contact_head": policy.contact_head}


def save_checkpoint(
    policy: Policy,
    path: Path | str,
    recipe: dict[str, Any],
    metrics: dict[str, Any] | None = None,
    dtype: str = "float32",
) -> Path:
    """Write ``path/model.safetensors`` and ``path/model.json``; returns the directory.

    A policy with a world component also gets ``world.*`` (with ``policy.world.info`` as its recipe
    and metrics). Without one, stale ``world.*`` files in ``path`` are removed: the target written
    here was not trained on a world bias, and loading one with it would change its inputs."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"{part}.{name}": tensor.detach().to("cpu", _DTYPES[dtype]).contiguous()
        for part, module in _modules(policy).items()
        for name, tensor in module.state_dict().items()
    }
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format_version": str(FORMAT_VERSION)})
    (path / WEIGHTS_FILE).chmod(0o644)  # safetensors writes 0600; an installed checkpoint must be world-readable
    meta = {
        "format_version": FORMAT_VERSION,
        "config": policy.config.to_dict(),
        "tokenizer": policy.tokenizer.to_dict(),
        "proprio_stats": {"mean": policy.proprio_mean.tolist(), "std": policy.proprio_std.tolist()},
        "weights_dtype": dtype,
        "n_parameters": policy.n_parameters(),
        "recipe": recipe,
        "metrics": metrics or {},
    }
    (path / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if policy.world is not None:
        save_world(policy.world, path)
    else:
        for name in (WORLD_WEIGHTS_FILE, WORLD_META_FILE):
            (path / name).unlink(missing_ok=True)
    return path


def _read_meta(meta_path: Path) -> dict[str, Any]:
    meta = _read_json(meta_path)
    for key in ("format_version", "config", "tokenizer", "proprio_stats"):
        if key not in meta:
            raise CheckpointError(meta_path, f"missing key '{key}'")
    if meta["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            meta_path, f"unknown format_version {meta['format_version']!r} (this version reads {FORMAT_VERSION})"
        )
    return meta


def load_checkpoint(path: Path | str) -> Policy:
    """Load a Policy from a checkpoint directory, validating everything against the config."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(path, "checkpoint directory not found")
    meta_path, weights_path = path / META_FILE, path / WEIGHTS_FILE
    meta = _read_meta(meta_path)
    try:
        config = VLAConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(meta_path, f"bad config ({exc})") from exc
    try:
        tokenizer = ActionTokenizer.from_dict(meta["tokenizer"])
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(meta_path, f"bad tokenizer ({exc})") from exc
    try:
        mean = np.asarray(meta["proprio_stats"]["mean"], dtype=np.float32)
        std = np.asarray(meta["proprio_stats"]["std"], dtype=np.float32)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(meta_path, f"bad proprio_stats ({exc!r})") from exc
    if mean.shape != (PROPRIO_DIM,) or std.shape != (PROPRIO_DIM,) or not np.all(std > 0):
        raise CheckpointError(meta_path, f"proprio_stats must hold {PROPRIO_DIM} means and positive stds")

    modules = {"target": VLATarget(config), "draft": DraftHead(config), "contact_head": ContactHead(config)}
    expected = {
        f"{part}.{name}": tensor for part, module in modules.items() for name, tensor in module.state_dict().items()
    }
    tensors = _read_tensors(weights_path, expected)
    for part, module in modules.items():
        prefix = f"{part}."
        module.load_state_dict({k[len(prefix):]: v.float() for k, v in tensors.items() if k.startswith(prefix)})
    info = {key: meta.get(key, {}) for key in ("recipe", "metrics", "n_parameters")}
    policy = Policy(config, tokenizer, modules["target"], modules["draft"], modules["contact_head"], mean, std, info)
    policy.flow = load_flow_heads(path, config.d_model)
    policy.world = load_world(path, config)
    return policy


def save_flow_heads(heads: FlowHeads, path: Path | str, recipe: dict[str, Any], metrics: dict[str, Any]) -> Path:
    """Write the continuous action head next to a checkpoint: ``flow_head.safetensors`` + ``.json``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in heads.state_dict().items()}
    save_file(tensors, str(path / FLOW_WEIGHTS_FILE), metadata={"format_version": str(FORMAT_VERSION)})
    (path / FLOW_WEIGHTS_FILE).chmod(0o644)
    meta = {"format_version": FORMAT_VERSION, "config": heads.config.to_dict(), "recipe": recipe, "metrics": metrics}
    (path / FLOW_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_flow_heads(path: Path | str, d_model: int) -> FlowHeads | None:
    """The continuous action head stored with a checkpoint, None when it has none."""
    path = Path(path)
    meta_path, weights_path = path / FLOW_META_FILE, path / FLOW_WEIGHTS_FILE
    if not meta_path.exists() and not weights_path.exists():
        return None
    meta = _read_json(meta_path)
    for key in ("format_version", "config"):
        if key not in meta:
            raise CheckpointError(meta_path, f"missing key '{key}'")
    try:
        config = FlowHeadConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(meta_path, f"bad config ({exc})") from exc
    if config.d_model != d_model:
        raise CheckpointError(meta_path, f"d_model {config.d_model} does not match the target's {d_model}")
    heads = FlowHeads(config)
    _load_weights(heads, weights_path)
    return heads.eval()


def save_world(world: WorldPrefill, path: Path | str) -> Path:
    """Write the world-aware prefill next to a checkpoint: ``world.safetensors`` (autoencoder and
    bias weights) and ``world.json`` (both configs, and ``world.info``'s recipe and metrics)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in world.state_dict().items()}
    save_file(tensors, str(path / WORLD_WEIGHTS_FILE), metadata={"format_version": str(FORMAT_VERSION)})
    (path / WORLD_WEIGHTS_FILE).chmod(0o644)
    meta = {
        "format_version": FORMAT_VERSION,
        "autoencoder": world.autoencoder.config.to_dict(),
        "bias": world.bias.config.to_dict(),
        "recipe": world.info.get("recipe", {}),
        "metrics": world.info.get("metrics", {}),
    }
    (path / WORLD_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_world(path: Path | str, config: VLAConfig) -> WorldPrefill | None:
    """The world-aware prefill stored with a checkpoint (checked against the target ``config``),
    None when it has none."""
    path = Path(path)
    meta_path, weights_path = path / WORLD_META_FILE, path / WORLD_WEIGHTS_FILE
    if not meta_path.exists() and not weights_path.exists():
        return None
    meta = _read_json(meta_path)
    for key in ("format_version", "autoencoder", "bias"):
        if key not in meta:
            raise CheckpointError(meta_path, f"missing key '{key}'")
    if meta["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            meta_path, f"unknown format_version {meta['format_version']!r} (this version reads {FORMAT_VERSION})"
        )
    try:
        world = WorldPrefill(FrameAutoencoderConfig.from_dict(meta["autoencoder"]),
                             WorldBiasConfig.from_dict(meta["bias"]),
                             info={"recipe": meta.get("recipe", {}), "metrics": meta.get("metrics", {})})
    except (TypeError, ValueError) as exc:
        raise CheckpointError(meta_path, f"bad config ({exc})") from exc
    try:
        world.check_target(config)
    except ValueError as exc:
        raise CheckpointError(meta_path, f"does not match the target ({exc})") from exc
    _load_weights(world, weights_path)
    return world.eval()


def _read_json(meta_path: Path) -> dict[str, Any]:
    if not meta_path.is_file():
        raise CheckpointError(meta_path, "file not found")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(meta_path, f"invalid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise CheckpointError(meta_path, "top level must be a JSON object")
    return meta


def _load_weights(module: torch.nn.Module, weights_path: Path) -> None:
    """Load a safetensors file into ``module`` exactly."""
    tensors = _read_tensors(weights_path, module.state_dict())
    module.load_state_dict({k: v.float() for k, v in tensors.items()})


def _read_tensors(weights_path: Path, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, checked against ``expected``: none missing, none extra,
    every shape as expected, all finite floating point."""
    if not weights_path.is_file():
        raise CheckpointError(weights_path, "file not found")
    try:
        tensors = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises its own error types for corrupt/truncated files
        raise CheckpointError(weights_path, f"cannot read safetensors ({type(exc).__name__}: {exc})") from exc
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(weights_path, f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(weights_path, f"unexpected tensors {unexpected[:5]}")
    for name, ref in expected.items():
        got = tensors[name]
        if tuple(got.shape) != tuple(ref.shape):
            raise CheckpointError(
                weights_path, f"tensor '{name}' has shape {tuple(got.shape)}, the config expects {tuple(ref.shape)}"
            )
        if not got.is_floating_point() or not bool(torch.isfinite(got).all()):
            raise CheckpointError(weights_path, f"tensor '{name}' is not finite floating point")
    return tensors
