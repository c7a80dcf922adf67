"""Checks of a checkpoint's weight files that need no model and no torch, so that a truncated,
corrupt or missing file is named before anything loads it (and by a command that hands the
checkpoint to another process).

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor to
its dtype, shape and ``data_offsets`` in the data that follows, then the data. A sharded model lists
its files in ``model.safetensors.index.json`` (``weight_map``: tensor name -> shard file).
Pickled weights are never loaded (unpickling runs code).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# A header past this size is corruption, not a model (safetensors itself refuses above 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class SafetensorsProblem(ValueError):
    """A safetensors file that is not complete: the message names the file, ``problem`` says what
    is wrong in a few words."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The tensor entries of ``path``'s header (name -> dtype, shape, data_offsets; the metadata
    left out) and the byte offset where the data starts; :class:`SafetensorsProblem` unless the file
    is complete (a readable header whose tensors' data fills the rest of the file exactly)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            head = file.read(8)
            if len(head) < 8:
                raise SafetensorsProblem(path, f"truncated: {size} bytes, no safetensors header")
            (length,) = struct.unpack("<Q", head)
            if length > min(size - 8, MAX_HEADER_BYTES):
                raise SafetensorsProblem(path, f"truncated or not safetensors: a {length}-byte header in {size} "
                                               "bytes")
            header = json.loads(file.read(length))
    except OSError as error:
        raise SafetensorsProblem(path, f"cannot read it ({error.strerror or error})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SafetensorsProblem(path, "not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise SafetensorsProblem(path, "not a safetensors file (its header is not a JSON object)")
    entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
    end = 0
    for name, entry in entries.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise SafetensorsProblem(path, f"tensor '{name}' has a malformed header entry {entry!r}")
        end = max(end, offsets[1])
    data = size - 8 - length
    if end > data:
        raise SafetensorsProblem(path, f"truncated: {data} bytes of tensor data where its safetensors header "
                                       f"describes {end}")
    if end < data:
        raise SafetensorsProblem(path, f"corrupt: {data} bytes of tensor data where its safetensors header "
                                       f"describes {end}")
    return entries, 8 + length


def check_safetensors(path: Path) -> None:
    """:class:`SafetensorsProblem` (a ValueError naming ``path``) unless it is a complete safetensors file."""
    safetensors_header(path)


def indexed_shards(directory: Path) -> dict[str, Path] | None:
    """Each tensor's name -> its shard, from ``model.safetensors.index.json``; None when the
    directory has no index. ValueError naming the index, or a shard it names that is missing."""
    index_path = directory / INDEX_FILE
    if not index_path.is_file():
        return None
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


def check_weights(directory: Path) -> None:
    """ValueError unless ``directory`` holds safetensors weights, each complete (naming the file
    that is not), and every shard its index names; pickle weights alone are refused, saying why."""
    weights = sorted(directory.glob("*.safetensors"))
    indexed_shards(directory)
    for path in weights:
        check_safetensors(path)
    if weights:
        return
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(f"{directory}: holds only pickle weights ({', '.join(pickles)}), which are never "
                         "loaded (unpickling runs code); convert them to safetensors")
    raise ValueError(f"{directory}: no weights (*.safetensors)")


CONFIG_FILE = "config.json"


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ValueError naming the file when it is missing, unreadable or
    not a JSON object. Every JSON file of a checkpoint is read through this."""
    if not path.is_file():
        raise ValueError(f"{path}: missing")
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read it as JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def read_config(directory: Path) -> dict[str, Any] | None:
    """The directory's ``config.json`` as a dict; None when there is none."""
    path = directory / CONFIG_FILE
    return read_json_object(path) if path.is_file() else None
