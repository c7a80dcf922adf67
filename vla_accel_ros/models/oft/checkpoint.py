"""Loading an OpenVLA-OFT directory into a policy (:class:`~.policy.OFTPolicy`).

An OFT directory is an OpenVLA directory (``config.json`` with ``model_type: "openvla"``, the same
sharded weights, processor and tokenizer files: the OpenVLA loader reads them,
:func:`~vla_accel_ros.models.openvla.checkpoint.read_parts`) with an action head and, usually, a
proprio projector beside it (:mod:`.weights`; safetensors only: ``vla-accel convert DIR``
makes them from OFT's ``.pt`` files). What no file stores (the chunk size, the bounds style, the
image count) comes from ``vla_spec.json`` or the parameters, else (the chunk size and bounds) from
the platform the statistics' dataset names (:mod:`.config`), checked against the head's and the
projector's shapes. ``config.json`` is parsed once, when the checkpoint is resolved
(:func:`load_resolved` reads the record's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vla_accel_ros.models.api import CheckpointRef, LoadOptions, ResolvedCheckpoint
from vla_accel_ros.models.oft.config import chunk_spec, load_chunk_statistics
from vla_accel_ros.models.oft.modules import L1ActionHead, ProprioProjector, head_shape
from vla_accel_ros.models.oft.policy import OFTPolicy
from vla_accel_ros.models.oft.weights import ACTION_HEAD, PROPRIO_PROJECTOR, find_components
from vla_accel_ros.models.openvla.checkpoint import build_modules, read_parts
from vla_accel_ros.models.openvla.weights import ShardReader
from vla_accel_ros.models.token_vla.policy import TORCH_DTYPES
from vla_accel_ros.models.token_vla.spec import STATISTICS_FILE
from vla_accel_ros.models.token_vla.statistics import dataset_statistics


def load_resolved(checkpoint: ResolvedCheckpoint, options: LoadOptions) -> OFTPolicy:
    """The family's loader (:mod:`vla_accel_ros.models.load`): :func:`load_oft` of the resolved
    checkpoint, its ``config.json`` as resolved, under ``options`` (``unnorm_key``, ``device``,
    ``dtype``); the chunk's settings are ``vla_spec.json``'s."""
    return load_oft(checkpoint.directory, unnorm_key=options.unnorm_key or None, device=options.device,
                    dtype=options.dtype, config=checkpoint.config)


def load_oft(path: Path | str, *, unnorm_key: str | None = None, device: str | None = None,
             dtype: str | None = None, chunk_size: int | None = None, action_dim: int | None = None,
             bounds: str | None = None, n_images: int | None = None,
             config: dict[str, Any] | None = None) -> OFTPolicy:
    """The OFT model in ``path`` as a policy (module docstring). ``unnorm_key``, ``device``,
    ``dtype`` and the chunk's settings override ``vla_spec.json``'s when given; ``config``: its
    ``config.json`` as parsed (None: read here). Every problem is a ValueError in one line naming
    the file or key at fault."""
    directory = CheckpointRef.parse(path).directory
    parts = read_parts(directory, unnorm_key=unnorm_key, device=device, dtype=dtype, config=config)
    files = find_components(directory)
    head_reader = ShardReader(files[ACTION_HEAD])
    shape = head_shape({name: t.shape for name, t in head_reader.tensors.items()}, str(files[ACTION_HEAD]))
    _, dataset, _ = dataset_statistics(directory, STATISTICS_FILE, parts.spec.unnorm_key, parts.config.raw)
    chunk = chunk_spec(parts.stored, directory / "vla_spec.json", head_action_dim=shape.action_dim,
                       chunk_size=chunk_size, action_dim=action_dim, bounds=bounds, n_images=n_images,
                       dataset=dataset)
    projector_reader = ShardReader(files[PROPRIO_PROJECTOR]) if PROPRIO_PROJECTOR in files else None
    state_dim = None
    if projector_reader is not None:
        fc1 = projector_reader.tensors.get("fc1.weight")
        if fc1 is None or len(fc1.shape) != 2 or fc1.shape[0] != shape.width:
            raise ValueError(f"{files[PROPRIO_PROJECTOR]}: not a proprio projector into width {shape.width} "
                             f"(fc1.weight {None if fc1 is None else fc1.shape})")
        state_dim = int(fc1.shape[1])
    statistics = load_chunk_statistics(directory, parts.spec.unnorm_key, chunk.bounds, chunk.action_dim, state_dim,
                                       parts.config.raw)
    limit = parts.config.text_config.get("max_position_embeddings", 4096)
    if chunk.n_action_positions >= int(limit):
        raise ValueError(f"{directory}: a chunk of {chunk.chunk_size} x {chunk.action_dim} does not fit in the "
                         f"language model's {limit} positions")
    try:
        torch_device = torch.device(parts.spec.device)
    except RuntimeError as error:
        raise ValueError(f"device {parts.spec.device!r}: {error}") from None
    modules, text_tokenizer = build_modules(parts, torch_device)
    if shape.width != modules.text_config.hidden_size:
        raise ValueError(f"{files[ACTION_HEAD]}: the head reads hidden states of width {shape.width}, the language "
                         f"model's are {modules.text_config.hidden_size}")
    model_dtype = TORCH_DTYPES[parts.spec.dtype]
    head = _loaded(L1ActionHead(shape), head_reader, model_dtype, torch_device)
    projector = None
    if projector_reader is not None and state_dim is not None:
        projector = _loaded(ProprioProjector(state_dim, shape.width), projector_reader, model_dtype, torch_device)
    return OFTPolicy(modules, text_tokenizer, parts.spec, chunk, statistics, head, projector, source=str(directory))


def _loaded(module: Any, reader: ShardReader, dtype: torch.dtype, device: torch.device) -> Any:
    """``module`` with the reader's tensors in ``dtype`` on ``device``; ValueError naming the file
    and the tensor when they do not match its names and shapes."""
    expected = module.state_dict()
    for name, value in expected.items():
        stored = reader.tensors.get(name)
        if stored is None:
            raise ValueError(f"{reader.path}: no tensor '{name}' (shape {tuple(value.shape)})")
        if stored.shape != tuple(value.shape):
            raise ValueError(f"{reader.path}: tensor '{name}' has shape {stored.shape}, expected {tuple(value.shape)}")
    extra = sorted(set(reader.tensors) - set(expected))
    if extra:
        raise ValueError(f"{reader.path}: tensor '{extra[0]}' has no place in the module ({len(extra)} such tensors)")
    module.load_state_dict({name: reader.tensor(name).to(dtype) for name in expected}, strict=True)
    return module.to(device=device, dtype=dtype).requires_grad_(False).eval()

