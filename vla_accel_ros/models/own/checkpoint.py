"""Checkpoint I/O: a directory with ``model.safetensors`` (all weights) and ``model.json``
(format version, config, tokenizer, proprio statistics, the robot it was made for, training recipe
and metrics; see :mod:`vla_accel_ros.core.robot_record`), plus
optional components loaded when present: the continuous action head (``flow_head.*``), the
world-aware prefill (``world.*``) and the parallel draft head (``parallel_draft.*``). Each optional
component is a ``NAME.safetensors`` (its weights) + ``NAME.json`` (format version, config, the
recipe and metrics of the command that trained it) pair, so old checkpoints without one load
unchanged and a component can be added to a checkpoint without rewriting ``model.*``.

Loading never executes code (no pickle) and every problem is reported as a CheckpointError that
names the offending file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.core.robot_record import ROBOT_KEY, RobotRecord, package_robot
from vla_accel_ros.models.api import CheckpointRef, LoadOptions, ResolvedCheckpoint
from vla_accel_ros.models.files import SafetensorsProblem, check_safetensors, read_json_object
from vla_accel_ros.models.load import recognise
from vla_accel_ros.models.own.config import PROPRIO_DIM, VLAConfig
from vla_accel_ros.models.own.draft import ContactHead, DraftHead, ParallelDraftHead
from vla_accel_ros.models.own.flow import FlowHeadConfig, FlowHeads
from vla_accel_ros.models.own.modules import VLATarget
from vla_accel_ros.models.own.policy import Policy
from vla_accel_ros.models.own.world import (
    FrameAutoencoderConfig,
    WorldBiasConfig,
    WorldPrefill,
)
from vla_accel_ros.models.tokenizer import ActionTokenizer

FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"
FLOW_WEIGHTS_FILE = "flow_head.safetensors"  # optional continuous action head (vla-accel train-flow)
FLOW_META_FILE = "flow_head.json"
WORLD_WEIGHTS_FILE = "world.safetensors"  # optional world-aware prefill (vla-accel train-world)
WORLD_META_FILE = "world.json"
PARALLEL_DRAFT_WEIGHTS_FILE = "parallel_draft.safetensors"  # optional (vla-accel train-parallel-draft)
PARALLEL_DRAFT_META_FILE = "parallel_draft.json"
# the target-config fields a parallel draft head's shapes and attention depend on
_PARALLEL_DRAFT_CONFIG_KEYS = ("d_model", "n_heads", "draft_mlp_ratio", "n_action_tokens")
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
    robot: RobotRecord | None = None,
) -> Path:
    """Write ``path/model.safetensors`` and ``path/model.json``; returns the directory.

    ``robot`` is the arm the policy was trained for (default: the package arm at the config's
    image size); it goes into model.json for the commands and the node to check.

    A policy with a world component also gets ``world.*`` (with ``policy.world.info`` as its recipe
    and metrics). Without one, stale ``world.*`` files in ``path`` are removed: the target written
    here was not trained on a world bias, and loading one with it would change its inputs.
    ``parallel_draft.*`` files in ``path`` are always removed and a policy's parallel draft head is
    not written: that head was trained against one particular target, and the target written here
    may be another (re-train it with ``vla-accel train-parallel-draft``)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"{part}.{name}": tensor.detach().to("cpu", _DTYPES[dtype]).contiguous()
        for part, module in _modules(policy).items()
        for name, tensor in module.state_dict().items()
    }
    _write_safetensors(tensors, path / WEIGHTS_FILE)
    meta = {
        "format_version": FORMAT_VERSION,
        "config": policy.config.to_dict(),
        "tokenizer": policy.tokenizer.to_dict(),
        "proprio_stats": {"mean": policy.proprio_mean.tolist(), "std": policy.proprio_std.tolist()},
        "weights_dtype": dtype,
        "n_parameters": {k: v for k, v in policy.n_parameters().items() if k != "parallel_draft"},
        ROBOT_KEY: (robot or package_robot(policy.config.image_size)).to_json(),
        "recipe": recipe,
        "metrics": metrics or {},
    }
    _write_json(meta, path / META_FILE)
    stale = [PARALLEL_DRAFT_WEIGHTS_FILE, PARALLEL_DRAFT_META_FILE]
    if policy.world is not None:
        save_world(policy.world, path)
    else:
        stale += [WORLD_WEIGHTS_FILE, WORLD_META_FILE]
    for name in stale:
        (path / name).unlink(missing_ok=True)
    return path


def _read_meta(meta_path: Path, keys: Sequence[str] = ("config", "tokenizer", "proprio_stats")) -> dict[str, Any]:
    """A checkpoint JSON, checked for ``format_version`` and ``keys``."""
    meta = read_checkpoint_json(meta_path)
    for key in ("format_version", *keys):
        if key not in meta:
            raise CheckpointError(meta_path, f"missing key '{key}'")
    if meta["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            meta_path, f"unknown format_version {meta['format_version']!r} (this version reads {FORMAT_VERSION})"
        )
    return meta


def load_resolved(checkpoint: ResolvedCheckpoint, options: LoadOptions) -> Policy:
    """The family's loader (:mod:`vla_accel_ros.models.load`): the policy in the resolved
    checkpoint's directory, on ``options.device`` (None: the CPU). Its statistics are its own
    (no ``unnorm_key``) and its weights load in float32."""
    policy = _load_directory(checkpoint.directory)
    return policy if options.device is None else policy.to(options.device)


def load_checkpoint(path: Path | str) -> Policy:
    """Load a Policy from a checkpoint directory, validating everything against the config. A
    directory that does not exist, or one of another family (a Hugging Face VLA, ``hf:DIR``), is
    refused in one line that says so."""
    ref = CheckpointRef.parse(path)
    path = ref.directory
    problem = checkpoint_problem(path)
    if problem:
        raise CheckpointError(path, problem)
    if ref.declared_family or not (path / META_FILE).is_file():
        try:
            family = recognise(ref)
        except ValueError as err:
            if (path / "config.json").is_file():  # another kind of model: what it is and the families known
                raise CheckpointError(path, str(err).removeprefix(f"{path}: ")) from None
            family = None  # no family's files at all: model.json is named missing below
        if family is not None and family.name != "own":
            raise CheckpointError(path, f"a checkpoint of the {family.name} family ({family.marker}), where this "
                                        f"command needs one of the own family ({META_FILE})")
    return _load_directory(path)


def _load_directory(path: Path) -> Policy:
    """The policy in the own family's directory ``path``, every file checked against its config."""
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
    if ROBOT_KEY in meta:  # checkpoints without a record were made for the package arm
        try:
            RobotRecord.from_json(meta[ROBOT_KEY])
        except ValueError as exc:
            raise CheckpointError(meta_path, f"bad robot record ({exc})") from exc

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
    policy.parallel_draft = load_parallel_draft(path, config)
    return policy


def save_flow_heads(heads: FlowHeads, path: Path | str, recipe: dict[str, Any], metrics: dict[str, Any]) -> Path:
    """Write the continuous action head next to a checkpoint: ``flow_head.safetensors`` + ``.json``."""
    meta = {"config": heads.config.to_dict(), "recipe": recipe, "metrics": metrics}
    return _save_component(heads, path, FLOW_WEIGHTS_FILE, FLOW_META_FILE, meta)


def load_flow_heads(path: Path | str, d_model: int) -> FlowHeads | None:
    """The continuous action head stored with a checkpoint, None when it has none."""
    path = Path(path)
    meta_path, weights_path = path / FLOW_META_FILE, path / FLOW_WEIGHTS_FILE
    meta = _read_component_meta(meta_path, weights_path, ("config",))
    if meta is None:
        return None
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
    meta = {
        "autoencoder": world.autoencoder.config.to_dict(),
        "bias": world.bias.config.to_dict(),
        "recipe": world.info.get("recipe", {}),
        "metrics": world.info.get("metrics", {}),
    }
    return _save_component(world, path, WORLD_WEIGHTS_FILE, WORLD_META_FILE, meta)


def load_world(path: Path | str, config: VLAConfig) -> WorldPrefill | None:
    """The world-aware prefill stored with a checkpoint (checked against the target ``config``),
    None when it has none."""
    path = Path(path)
    meta_path, weights_path = path / WORLD_META_FILE, path / WORLD_WEIGHTS_FILE
    meta = _read_component_meta(meta_path, weights_path, ("autoencoder", "bias"))
    if meta is None:
        return None
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


def save_parallel_draft(
    head: DraftHead, path: Path | str, recipe: dict[str, Any], metrics: dict[str, Any]
) -> Path:
    """Write the parallel draft head next to a checkpoint: ``parallel_draft.safetensors`` and
    ``parallel_draft.json`` (the target-config fields it was built for, recipe and metrics).
    ``head`` must have been built for that checkpoint's target (same width, heads, MLP ratio)."""
    config = {key: value for key, value in head.config.to_dict().items() if key in _PARALLEL_DRAFT_CONFIG_KEYS}
    meta = {"config": config, "recipe": recipe, "metrics": metrics}
    return _save_component(head, path, PARALLEL_DRAFT_WEIGHTS_FILE, PARALLEL_DRAFT_META_FILE, meta)


def load_parallel_draft(path: Path | str, config: VLAConfig) -> ParallelDraftHead | None:
    """The parallel draft head stored with a checkpoint (checked against the target ``config``),
    None when it has none."""
    path = Path(path)
    meta_path, weights_path = path / PARALLEL_DRAFT_META_FILE, path / PARALLEL_DRAFT_WEIGHTS_FILE
    meta = _read_component_meta(meta_path, weights_path, ("config",))
    if meta is None:
        return None
    stored = meta["config"]
    if not isinstance(stored, dict):
        raise CheckpointError(meta_path, "'config' must be a JSON object")
    target = config.to_dict()
    differ = [f"{k} {stored.get(k)!r} (the target's is {target[k]!r})"
              for k in _PARALLEL_DRAFT_CONFIG_KEYS if stored.get(k) != target[k]]
    if differ:
        raise CheckpointError(meta_path, f"does not match the target: {', '.join(differ)}")
    head = ParallelDraftHead(config)
    _load_weights(head, weights_path)
    return head.eval()


def copy_checkpoint(source: Path | str, destination: Path | str, exclude: Iterable[str] = ()) -> Path:
    """Copy a checkpoint directory's files and folders (e.g. its retrieval store) into
    ``destination``, except the names in ``exclude`` (the component the caller is about to write),
    so that a command adding a component can leave its input untouched and still write a
    complete checkpoint."""
    source, destination = Path(source), Path(destination)
    if source.resolve() == destination.resolve():
        raise ValueError(f"cannot copy checkpoint {source} onto itself")
    destination.mkdir(parents=True, exist_ok=True)
    skip = set(exclude)
    for item in source.iterdir():
        if item.name in skip:
            continue
        if item.is_dir():
            shutil.copytree(item, destination / item.name, dirs_exist_ok=True)
        elif item.is_file():
            shutil.copy2(item, destination / item.name)
    return destination


def _save_component(module: torch.nn.Module, path: Path | str, weights_name: str, meta_name: str,
                    meta: dict[str, Any]) -> Path:
    """Write an optional component's float32 weights and its JSON (``meta`` after the format
    version) into the checkpoint directory ``path``; returns the directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in module.state_dict().items()}
    _write_safetensors(tensors, path / weights_name)
    _write_json({"format_version": FORMAT_VERSION, **meta}, path / meta_name)
    return path


def _write_safetensors(tensors: dict[str, torch.Tensor], file: Path) -> None:
    save_file(tensors, str(file), metadata={"format_version": str(FORMAT_VERSION)})
    file.chmod(0o644)  # safetensors writes 0600; an installed checkpoint must be world-readable


def _write_json(meta: dict[str, Any], file: Path) -> None:
    file.write_text(json.dumps(meta, indent=2) + "\n")
    file.chmod(0o644)


def _read_component_meta(meta_path: Path, weights_path: Path, keys: Sequence[str]) -> dict[str, Any] | None:
    """The JSON of an optional component, checked for ``format_version`` and ``keys``; None when
    neither of its files exists (a checkpoint without it). One file without the other is an error."""
    if not meta_path.exists() and not weights_path.exists():
        return None
    return _read_meta(meta_path, keys)


def read_checkpoint_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (:func:`~vla_accel_ros.models.files.read_json_object`), its
    problem a :class:`CheckpointError` naming the file."""
    if not path.is_file():
        raise CheckpointError(path, "file not found")
    try:
        return read_json_object(path)
    except ValueError as error:
        raise CheckpointError(path, str(error).removeprefix(f"{path}: ")) from None


def _load_weights(module: torch.nn.Module, weights_path: Path) -> None:
    """Load a safetensors file into ``module`` exactly."""
    tensors = _read_tensors(weights_path, module.state_dict())
    module.load_state_dict({k: v.float() for k, v in tensors.items()})


def _read_tensors(weights_path: Path, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, checked against ``expected``: none missing, none extra,
    every shape as expected, all finite floating point."""
    if not weights_path.is_file():
        raise CheckpointError(weights_path, "file not found")
    try:  # a truncated file said so, not in safetensors' own words
        check_safetensors(weights_path)
    except SafetensorsProblem as problem:
        raise CheckpointError(weights_path, problem.problem) from None
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
