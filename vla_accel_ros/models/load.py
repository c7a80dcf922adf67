"""The registry of model families, and the one loader for all of them: a checkpoint directory is
recognised by its own files, once per process start.

A family registers itself in its own folder: ``models/<family>/family.py`` holds ``FAMILY``, a
:class:`~vla_accel_ros.models.api.Family` (its recogniser, checker, loader, order, devices, dtypes and
capabilities), importable without torch. The registry finds

- every package under :mod:`vla_accel_ros.models` with a ``family`` module;
- the modules named in the environment variable ``VLA_ACCEL_FAMILIES`` (comma-separated, on
  ``sys.path``), each with its ``FAMILY``: a family kept outside this package;
- the entry points of group ``vla_accel_ros.families``, each naming such a module: an installed one.

A family's loader and modules are imported only when one of its checkpoints is loaded (torch,
transformers). A directory no family recognises is refused in one line that names the file read and
the families known. :func:`resolve_checkpoint` does the checks that need no model (the directory, the
family, its files, the device: one its family runs on and, for CUDA, one this torch sees) without
loading a model, and torch only for a CUDA device; it returns the record that travels to an inference
process, so that a checkpoint is recognised, and its ``config.json`` read, once.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from vla_accel_ros.core.actions import EE_DELTA
from vla_accel_ros.core.errors import SettingError
from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.core.robot_record import read_robot_record
from vla_accel_ros.models.api import CheckpointRef, Family, LoadOptions, PolicyLike, ResolvedCheckpoint
from vla_accel_ros.models.devices import is_device_name as is_device_name  # where callers have found it
from vla_accel_ros.models.devices import require_device_available
from vla_accel_ros.models.files import CONFIG_FILE, read_config

FAMILIES_VARIABLE = "VLA_ACCEL_FAMILIES"
ENTRY_POINT_GROUP = "vla_accel_ros.families"


def _function(name: str) -> Callable[..., Any]:
    module, _, function = name.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), function)
    return found


def _family_of(module_name: str) -> Family:
    try:
        family = importlib.import_module(module_name).FAMILY
    except (ImportError, AttributeError) as error:
        raise ValueError(f"model family module {module_name!r}: {error} "
                         "(it must define FAMILY = Family(...))") from None
    if not isinstance(family, Family):
        raise ValueError(f"model family module {module_name!r}: FAMILY is a {type(family).__name__}, not a Family")
    return family


@functools.cache
def _registered(extra: str) -> tuple[Family, ...]:
    package, folder = __name__.rpartition(".")[0], Path(__file__).parent  # the folders beside this module
    names = [f"{package}.{info.name}.family" for info in pkgutil.iter_modules([str(folder)])
             if info.ispkg and (folder / info.name / "family.py").is_file()]
    names += [name.strip() for name in extra.split(",") if name.strip()]
    names += [entry.value for entry in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    families: dict[str, Family] = {}
    for name in names:
        family = _family_of(name)
        if family.name in families:
            raise ValueError(f"model family {family.name!r} registered twice (the second by {name})")
        families[family.name] = family
    return tuple(sorted(families.values(), key=lambda f: (f.order, f.name)))


def families() -> tuple[Family, ...]:
    """Every registered family, in the order they are tried."""
    return _registered(os.environ.get(FAMILIES_VARIABLE, ""))


def family_named(name: str) -> Family:
    for family in families():
        if family.name == name:
            return family
    raise ValueError(f"unknown model family '{name}'; known: {', '.join(f.name for f in families())}")


def _recognised(ref: CheckpointRef) -> tuple[Family, dict[str, Any] | None]:
    if ref.address:
        return family_named(ref.declared_family), None
    directory = ref.directory
    problem = checkpoint_problem(directory)
    if problem:
        raise ValueError(f"{directory}: {problem}")
    config = read_config(directory)
    if ref.declared_family:
        declared = family_named(ref.declared_family)
        if not declared.remote and not declared.recognises(directory, config):
            _refuse_another_family(ref, declared, config)
        return declared, config
    for family in families():
        if not family.remote and family.recognises(directory, config):
            return family, config
    read = f"{directory / CONFIG_FILE}" + (f" (model_type {config.get('model_type')!r})" if config else ": none")
    known = "; ".join(f"{f.name}: {f.marker}" for f in families())
    raise ValueError(f"{directory}: not a checkpoint of a family this package runs (read {read}); known: {known}")


def _refuse_another_family(ref: CheckpointRef, declared: Family, config: dict[str, Any] | None) -> None:
    """ValueError in one line when the directory ``ref`` declares as ``declared`` is another
    family's: that family named, and the directory to give without the prefix. A directory no family
    recognises goes on to the declared family's checks, which name the file at fault."""
    directory = ref.directory
    for family in families():
        if not family.remote and family is not declared and family.recognises(directory, config):
            prefix = str(ref).removesuffix(str(directory))
            raise ValueError(f"{directory} is a checkpoint of the {family.name} family ({family.marker}), not of "
                             f"the {declared.name} family {prefix} declares; give the directory without {prefix}")


def recognise(source: str | Path | CheckpointRef | ResolvedCheckpoint) -> Family:
    """The family of the checkpoint ``source`` names: the declared one (``hf:DIR``, an address),
    else the first whose recogniser takes the directory. ValueError in one line otherwise: a missing
    directory (or the example parameter files' placeholder), or one no family recognises (naming the
    file read and the families known)."""
    if isinstance(source, ResolvedCheckpoint):
        return family_named(source.family)
    return _recognised(CheckpointRef.parse(source))[0]


def _check_device(ref: CheckpointRef, family: Family, device: str) -> None:
    kind = device.partition(":")[0]
    if device and kind not in family.devices:
        others = ", ".join(f.name for f in families() if kind in f.devices) or "none"
        raise ValueError(f"{ref}: device {device!r}: a checkpoint of the {family.name} family runs on "
                         f"{' or '.join(family.devices)} only (families that run on {kind}: {others})")
    require_device_available(device)  # before anything loads: a GPU this torch sees


def resolve_checkpoint(source: str | Path | CheckpointRef | ResolvedCheckpoint, *, unnorm_key: str = "",
                       device: str = "") -> ResolvedCheckpoint:
    """The checkpoint ``source`` names, resolved once: its family recognised, the checks that need
    no model passed (the family's own: complete safetensors files, a token VLA's action statistics),
    ``device`` one its family runs on (empty: the CPU), and the action space its robot record
    declares. ValueError in one line naming the file at fault, or a CUDA ``device`` this torch does
    not see. Imports torch only to ask about a CUDA device (:mod:`~vla_accel_ros.models.devices`)."""
    if isinstance(source, ResolvedCheckpoint):
        _check_device(source.ref, recognise(source), device)
        return source
    ref = CheckpointRef.parse(source)
    family, config = _recognised(ref)
    _check_device(ref, family, device)
    if family.checker:
        _function(family.checker)(ref.directory, config, unnorm_key)
    if family.action_space_of:
        space = str(_function(family.action_space_of)(ref.address))
    else:
        record = read_robot_record(ref.directory)
        space = record.action_space if record is not None else EE_DELTA
    return ResolvedCheckpoint(ref.resolved(), family.name, space, config)


def check_checkpoint(source: str | Path | CheckpointRef, *, unnorm_key: str = "") -> Family:
    """The family of the checkpoint ``source`` names, once :func:`resolve_checkpoint` passes."""
    return recognise(resolve_checkpoint(source, unnorm_key=unnorm_key))


def check_device(source: str | Path | CheckpointRef | ResolvedCheckpoint, device: str) -> Family:
    """The family of the checkpoint ``source`` names, once it can run on ``device`` (its family's
    devices, and a CUDA device this torch sees); ValueError in one line otherwise. Imports torch only
    to ask about a CUDA device."""
    family = recognise(source)
    ref = source.ref if isinstance(source, ResolvedCheckpoint) else CheckpointRef.parse(source)
    _check_device(ref, family, device)
    return family


def declared_action_space(source: str | Path | CheckpointRef | ResolvedCheckpoint) -> str:
    """What the actions of the checkpoint ``source`` names are (:mod:`vla_accel_ros.core.actions`)."""
    if isinstance(source, ResolvedCheckpoint):
        return source.action_space
    return resolve_checkpoint(source).action_space


def require_family(source: str | Path | CheckpointRef, name: str, purpose: str) -> None:
    """ValueError in one line unless the checkpoint ``source`` names is of the family ``name``
    (``purpose``: what needs it, for the message)."""
    family = recognise(source)
    if family.name != name:
        wanted = family_named(name)
        raise ValueError(f"{CheckpointRef.parse(source).directory}: a checkpoint of the {family.name} family "
                         f"({family.marker}), where {purpose} needs one of the {name} family ({wanted.marker})")


def load_policy(source: str | Path | CheckpointRef | ResolvedCheckpoint, *, unnorm_key: str = "",
                device: str | None = None, dtype: str | None = None, tokenizer_dir: Path | None = None,
                arm: Any = None, draft: bool = True, draft_head: Path | None = None) -> PolicyLike:
    """The policy in the checkpoint ``source`` names (a directory, ``hf:DIR``, a policy server's
    address, or a checkpoint resolved already), loaded by its family's loader (:class:`LoadOptions`
    says what each option is); ValueError naming the file at fault, or the option that does not apply."""
    checkpoint = source if isinstance(source, ResolvedCheckpoint) else resolve_checkpoint(
        source, unnorm_key=unnorm_key, device=device or "")
    family = family_named(checkpoint.family)
    options = LoadOptions(unnorm_key=unnorm_key, device=device, dtype=dtype, tokenizer_dir=tokenizer_dir, arm=arm,
                          draft=draft, draft_head=draft_head)
    for name, unset in (("unnorm_key", ""), ("tokenizer_dir", None), ("draft", True), ("draft_head", None)):
        if getattr(options, name) != unset and name not in family.options:
            raise SettingError(f"{checkpoint.ref}: {name} does not apply to a checkpoint of the {family.name} family",
                               name)
    if (dtype or device) and not family.remote:
        if dtype and dtype not in family.dtypes:
            raise ValueError(f"{checkpoint.ref}: dtype {dtype!r}: a checkpoint of the {family.name} family loads in "
                             f"{', '.join(family.dtypes)}")
        _check_device(checkpoint.ref, family, device or "")
    policy: PolicyLike = _function(family.loader)(checkpoint, options)
    return policy

