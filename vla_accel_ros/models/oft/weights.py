"""The components an OpenVLA-OFT directory adds to OpenVLA's layout, found, converted and read.

OFT's training saves each extra module as ``<component>--<step>_checkpoint.pt``: a torch pickle of
a plain ``{name: tensor}`` state dict, its names prefixed ``module.`` (saved from DDP). The action
head (``action_head``) and the proprio projector (``proprio_projector``) are the ones run here.

Pickles are never loaded by the policy: :func:`convert_directory` (``vla-accel convert DIR``) turns
each ``.pt`` component into ``<same name>.safetensors`` once, with ``torch.load(weights_only=True)``
(which refuses anything but tensors and plain containers), the ``module.`` prefix stripped; a file
that holds anything but a flat dict of tensors is refused. The loader reads the safetensors only,
and names the convert command when it finds only the ``.pt`` files.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACTION_HEAD = "action_head"
PROPRIO_PROJECTOR = "proprio_projector"
COMPONENTS = (ACTION_HEAD, PROPRIO_PROJECTOR)
# <component>--<step>_checkpoint.<suffix>, as OFT's finetune.py names its files
COMPONENT_FILE = re.compile(r"^(?P<component>[a-z_]+)--(?P<step>[0-9A-Za-z_]+?)_checkpoint\.(pt|safetensors)$")
DDP_PREFIX = "module."
CONVERT_COMMAND = "vla-accel convert"


@dataclass(frozen=True)
class ComponentFile:
    """One component file: which component, its training step, its path."""

    component: str
    step: str
    path: Path


def component_files(directory: Path) -> list[ComponentFile]:
    """Every ``<component>--<step>_checkpoint.{pt,safetensors}`` in ``directory``, by name."""
    found = []
    for path in sorted(directory.iterdir()):
        match = COMPONENT_FILE.match(path.name)
        if match and path.is_file():
            found.append(ComponentFile(match["component"], match["step"], path))
    return found


def has_action_head(directory: Path) -> bool:
    """Whether ``directory`` holds an OFT action head (converted or not): what marks the family."""
    return any(f.component == ACTION_HEAD for f in component_files(directory))


def find_components(directory: Path) -> dict[str, Path]:
    """The safetensors of each component run here (the action head, required; the proprio
    projector, when there is one); ValueError in one line when a component exists only as a
    pickle (naming the convert command), or twice."""
    files = component_files(directory)
    found: dict[str, Path] = {}
    for component in COMPONENTS:
        safe = [f.path for f in files if f.component == component and f.path.suffix == ".safetensors"]
        pickled = [f.path for f in files if f.component == component and f.path.suffix == ".pt"]
        if len(safe) > 1:
            raise ValueError(f"{directory}: {len(safe)} {component} files ({', '.join(p.name for p in safe)}); "
                             "keep one")
        if safe:
            found[component] = safe[0]
        elif pickled:
            raise ValueError(f"{directory}: {pickled[0].name} is a torch pickle, which is never loaded; convert it "
                             f"once to safetensors: {CONVERT_COMMAND} {directory}")
    if ACTION_HEAD not in found:
        raise ValueError(f"{directory}: no {ACTION_HEAD}--<step>_checkpoint.safetensors (OpenVLA-OFT's action head)")
    return found


def converted_path(path: Path) -> Path:
    return path.with_suffix(".safetensors")


def convert_directory(directory: Path, *, report: Callable[[str], None] = print) -> list[Path]:
    """Each ``.pt`` component of ``directory`` as safetensors beside it (module docstring); a
    component converted before is left as it is. Returns the files written; ValueError naming the
    file when one is not a flat dict of tensors."""
    from safetensors.torch import save_file

    if not directory.is_dir():
        raise ValueError(f"{directory}: no such directory")
    pickles = [f for f in component_files(directory) if f.path.suffix == ".pt"]
    if not pickles:
        raise ValueError(f"{directory}: no <component>--<step>_checkpoint.pt files to convert")
    written = []
    for item in pickles:
        target = converted_path(item.path)
        if target.exists():
            report(f"{target.name}: converted before, left as it is")
            continue
        tensors = read_pickled_state_dict(item.path)
        save_file(tensors, str(target), metadata={"format": "pt", "converted_from": item.path.name})
        report(f"{item.path.name} -> {target.name} ({len(tensors)} tensors)")
        written.append(target)
    return written


def read_pickled_state_dict(path: Path) -> dict[str, Any]:
    """The tensors of a pickled state dict, loaded with ``weights_only=True`` (nothing but tensors
    and plain containers is unpickled), ``module.`` stripped, contiguous; ValueError in one line
    when the file holds anything else."""
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path}: refused: not a pickle of tensors alone ({first[:160]})") from None
    if not isinstance(state, dict) or not state:
        raise ValueError(f"{path}: refused: holds a {type(state).__name__}, not a dict of tensors")
    tensors = {}
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: refused: entry {name!r} is a {type(value).__name__}, not a tensor")
        tensors[name.removeprefix(DDP_PREFIX)] = value.detach().contiguous()
    if len(tensors) != len(state):
        raise ValueError(f"{path}: refused: names clash once the '{DDP_PREFIX}' prefix is stripped")
    return tensors
