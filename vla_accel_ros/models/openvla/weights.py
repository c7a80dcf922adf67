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

import json
import mmap
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from vla_accel_ros.models.hf.hf_vla import check_weights

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024

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
        try:
            with path.open("rb") as handle:
                size = path.stat().st_size
                head = handle.read(8)
                if len(head) < 8:
                    raise ValueError(f"{path}: truncated or not safetensors ({size} bytes)")
                (header_len,) = struct.unpack("<Q", head)
                if header_len > min(MAX_HEADER_BYTES, size - 8):
                    raise ValueError(f"{path}: truncated or not safetensors (a header of {header_len} bytes "
                                     f"in a file of {size})")
                header = json.loads(handle.read(header_len))
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        except OSError as error:
            raise ValueError(f"{path}: cannot read it ({error})") from None
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"{path}: not a safetensors file (its header is not JSON)") from None
        if not isinstance(header, dict):
            raise ValueError(f"{path}: not a safetensors file (its header is not a JSON object)")
        base = 8 + header_len
        self.tensors: dict[str, StoredTensor] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype = SAFETENSORS_DTYPES[entry["dtype"]]
                shape = tuple(int(n) for n in entry["shape"])
                start, end = (base + int(n) for n in entry["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}: tensor '{name}' has a malformed header entry {entry!r}") from None
            if end > size:
                raise ValueError(f"{path}: truncated: tensor '{name}' ends at byte {end}, the file has {size}")
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
    check_weights(directory)  # pickles alone are refused
    index_path = directory / INDEX_FILE
    if not index_path.is_file():
        if not (directory / SINGLE_FILE).is_file():
            raise ValueError(f"{directory}: no weights ({INDEX_FILE} or {SINGLE_FILE})")
        return dict.fromkeys(ShardReader(directory / SINGLE_FILE).tensors, directory / SINGLE_FILE)
    try:
        index = json.loads(index_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{index_path}: cannot be read as JSON ({error})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_path}: no weight_map of tensor name -> shard file")
    files = {}
    for shard in sorted(set(weight_map.values())):
        path = directory / shard
        if Path(shard).name != shard:
            raise ValueError(f"{index_path}: shard '{shard}' is not a file beside the index")
        if not path.is_file():
            raise ValueError(f"{path}: missing (named by {index_path.name})")
        files[shard] = path
    return {name: files[shard] for name, shard in weight_map.items()}


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
