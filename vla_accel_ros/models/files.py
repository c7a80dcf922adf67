"""Checks of a checkpoint's files that need no model and no torch: a safetensors file read as far as
its header says it reaches, so that a truncated or corrupt one is named before anything loads it.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor to
its dtype, shape and ``data_offsets`` in the data that follows, then the data.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# A header past this size is corruption, not a model (safetensors itself refuses above 100 MB).
MAX_HEADER_BYTES = 100_000_000


def safetensors_problem(path: Path) -> str:
    """'' when ``path`` is a complete safetensors file (a readable header whose tensors' data all
    lies within the file, and nothing after it); else what is wrong, in a few words."""
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            head = file.read(8)
            if len(head) < 8:
                return f"truncated: {size} bytes, no header"
            (length,) = struct.unpack("<Q", head)
            if length > min(size - 8, MAX_HEADER_BYTES):
                return f"truncated or corrupt: a {length}-byte header in {size} bytes"
            header = json.loads(file.read(length))
    except OSError as err:
        return f"unreadable: {err.strerror or err}"
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "corrupt: its header is not JSON"
    if not isinstance(header, dict):
        return "corrupt: its header is not a JSON object"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"corrupt: tensor {name!r} has no data_offsets"
        end = max(end, offsets[1])
    data = size - 8 - length
    if end != data:
        kind = "truncated" if end > data else "corrupt"
        return f"{kind}: {data} bytes of tensor data where its header describes {end}"
    return ""


def check_safetensors(path: Path) -> None:
    """ValueError naming ``path`` unless it is a complete safetensors file (:func:`safetensors_problem`)."""
    problem = safetensors_problem(path)
    if problem:
        raise ValueError(f"{path}: cannot read safetensors ({problem})")
