"""The weights of an OpenVLA directory: safetensors shards found through their index, memory-mapped,
and their names mapped onto this package's modules.

A shard is read as the safetensors format defines it (an 8-byte header length, a JSON header of
name -> dtype, shape, byte offsets, then the data), and each tensor is a view into a private
(copy-on-write) memory map of the file: nothing is read until a pass touches it, and a model
kept in its stored dtype takes no second copy. Nothing is unpickled and no code is run.

Names: ``vision_backbone.featurizer.*`` (DINOv2) and ``vision_backbone.fused_featurizer.*``
(SigLIP) become ``vision.towers.0.*`` and ``vision.towers.1.*`` (timm's ``patch_embed.proj`` our
``patch_embed``; LayerScale's ``scale_factor``, as OpenVLA renamed timm's ``gamma``, our ``gamma``);
``projector.*`` becomes ``vision.projector.*``; ``language_model.*`` (a ``LlamaForCausalLM``) keeps
its names. The towers' last block, final norm and SigLIP's attention-pool head are never read.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from vla_accel_ros.models.files import SINGLE_FILE, check_weights, indexed_shards, safetensors_header

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}

# (published prefix, our prefix) pairs, tried in order
PREFIXES = (
    ("vision_backbone.featurizer.", "vision.towers.0."),
    ("vision_backbone.fused_featurizer.", "vision.towers.1."),
    ("projector.", "vision.projector."),
    ("language_model.", "language_model."),
)
# within a tower: timm's names -> ours
TOWER_RENAMES = ((re.compile(r"^patch_embed\.proj\."), "patch_embed."),
                 (re.compile(r"\.ls([12])\.(scale_factor|gamma)$"), r".ls\1.gamma"))
# tensors of a tower that OpenVLA never reads (its final norm, SigLIP's pooling head)
UNREAD_TOWER_PARTS = re.compile(r"^(norm|fc_norm|attn_pool|head)\.")


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a shard: where it lies and what it is."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offset in the file
    end: int


class ShardReader:
    """The tensors of one safetensors file, as views into a private memory map of it; ValueError
    naming the file when it is not safetensors or is shorter than its header says (truncated)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        entries, base = safetensors_header(path)  # a truncated or corrupt file is named here
        size = path.stat().st_size
        with path.open("rb") as handle:
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        self.tensors: dict[str, StoredTensor] = {}
        for name, entry in entries.items():
            try:
                dtype = SAFETENSORS_DTYPES[entry["dtype"]]
                shape = tuple(int(n) for n in entry["shape"])
                start, end = (base + int(n) for n in entry["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}: tensor '{name}' has a malformed header entry {entry!r}") from None
            count = 1
            for n in shape:
                count *= n
            if end - start != count * torch.empty((), dtype=dtype).element_size():
                raise ValueError(f"{path}: tensor '{name}' takes {end - start} bytes for shape {shape} of {dtype}")
            self.tensors[name] = StoredTensor(path, dtype, shape, start, end)

    def tensor(self, name: str) -> torch.Tensor:
        stored = self.tensors[name]
        count = (stored.end - stored.start) // torch.empty((), dtype=stored.dtype).element_size()
        if count == 0:
            return torch.empty(stored.shape, dtype=stored.dtype)
        flat = torch.frombuffer(self._map, dtype=stored.dtype, count=count, offset=stored.start)
        return flat.view(stored.shape)


def shard_files(directory: Path) -> dict[str, Path]:
    """Each stored tensor's name -> its shard, from ``model.safetensors.index.json`` (or the one
    ``model.safetensors``); ValueError naming the index or the shard at fault."""
    check_weights(directory)  # pickles alone are refused, every shard complete
    shards = indexed_shards(directory)
    if shards is not None:
        return shards
    if not (directory / SINGLE_FILE).is_file():
        raise ValueError(f"{directory}: no weights (model.safetensors.index.json or {SINGLE_FILE})")
    return dict.fromkeys(ShardReader(directory / SINGLE_FILE).tensors, directory / SINGLE_FILE)


def our_name(published: str) -> str | None:
    """This package's name of a published tensor; None for a tensor OpenVLA never reads. ValueError
    for a name outside OpenVLA's layout."""
    for source, target in PREFIXES:
        if published.startswith(source):
            rest = published[len(source):]
            if target.startswith("vision.towers."):
                if UNREAD_TOWER_PARTS.match(rest):
                    return None
                for pattern, replacement in TOWER_RENAMES:
                    rest = pattern.sub(replacement, rest)
            return target + rest
    raise ValueError(f"tensor '{published}' is not part of OpenVLA's layout (vision_backbone.*, projector.*, "
                     "language_model.*)")


class OpenVLAWeights:
    """The tensors of an OpenVLA directory by our names (:func:`our_name`), read lazily from their
    memory-mapped shards. ``shapes``: every mapped tensor's shape, read from the headers alone."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._where: dict[str, tuple[ShardReader, str]] = {}
        readers: dict[Path, ShardReader] = {}
        listed = shard_files(directory)
        for published, path in listed.items():
            if path not in readers:
                readers[path] = ShardReader(path)
            reader = readers[path]
            if published not in reader.tensors:
                raise ValueError(f"{path}: has no tensor '{published}' (the index names it)")
            name = our_name(published)
            if name is not None:
                self._where[name] = (reader, published)
        self.shapes = {name: reader.tensors[published].shape for name, (reader, published) in self._where.items()}
        dtypes = [reader.tensors[published].dtype for reader, published in self._where.values()]
        self.stored_dtype = max(set(dtypes), key=dtypes.count) if dtypes else torch.float32

    def names(self) -> Iterable[str]:
        return self._where.keys()

    def tensor(self, name: str) -> torch.Tensor:
        reader, published = self._where[name]
        return reader.tensor(published)

    def published_name(self, name: str) -> str:
        return self._where[name][1]

    def file_of(self, name: str) -> Path:
        return self._where[name][0].path
