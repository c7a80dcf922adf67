"""One loader for every model family: a checkpoint directory is recognised by its own files.

Each family registers what marks its directories and the function that loads them, imported only
when a directory of that family is loaded (torch, transformers):

- ``own``: ``model.json`` (the package's VLA, :mod:`vla_accel_ros.models.own.checkpoint`);
- ``hf``: ``config.json`` of a Llava-style VLA, a ``vision_config`` and an image token
  (:mod:`vla_accel_ros.models.hf.hf_vla`); ``hf:DIR`` declares it, for a directory that is not
  recognised otherwise;
- ``oft``: an OpenVLA directory with an OpenVLA-OFT action head beside it
  (``action_head--<step>_checkpoint.*``; :mod:`vla_accel_ros.models.oft.checkpoint`);
- ``openvla``: ``config.json`` with ``model_type: "openvla"``, openvla-7b and its fine-tunes as
  published (:mod:`vla_accel_ros.models.openvla.checkpoint`);
- ``lerobot``: a LeRobot policy directory, ``config.json`` with a policy ``type`` beside
  ``policy_preprocessor.json`` (SmolVLA, π0 and π0.5, :mod:`vla_accel_ros.models.lerobot.policy`); its
  loaders also take ``tokenizer_dir``.
- ``openpi``: no directory but a server's address, ``openpi://HOST:PORT`` or ``ws://`` (a policy served
  over openpi's protocol, :mod:`vla_accel_ros.models.openpi.client`); its chunks come through the flow
  decoders (``answers_with_chunks``), and it needs the arm (``arm``) to turn joint actions into our actions.

A directory no family recognises is refused in one line that names the file read and the families
known. Every loader raises ValueError (the own family's CheckpointError is one) naming the file at fault.
:func:`check_checkpoint` makes the checks that need no model (the directory, the family, complete
safetensors files, a Hugging Face or OpenVLA model's action statistics) without torch, for a command that hands
the checkpoint to another process to load.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vla_accel_ros.core.actions import EE_DELTA
from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.core.robot_record import read_robot_record
from vla_accel_ros.models.api import CheckpointRef, PolicyLike
from vla_accel_ros.models.files import check_safetensors, check_weights

CONFIG_FILE = "config.json"
TOKEN_VLA_FAMILIES = ("hf", "openvla")  # HFTokenVLA policies: their draft head is train-draft's


@dataclass(frozen=True)
class Family:
    """A model family as the loader knows it: its name, what marks its directories (for messages),
    the test of a directory (given its parsed ``config.json``, None when there is none), its
    loader (``"module:function"``, called with the directory and ``unnorm_key``), and the loader
    (``"module:function"``, called with the directory and keywords ``unnorm_key``, ``device``,
    ``dtype``) that takes a device and a dtype, when it has one."""

    name: str
    marker: str
    recognises: Callable[[Path, dict[str, Any] | None], bool]
    loader: str
    placed_loader: str = ""
    # "module:function" called with the directory and unnorm_key: the family's checks of its files
    # that need no model (ValueError naming the file at fault); empty: none beyond recognising it
    checker: str = ""
    takes_tokenizer_dir: bool = False
    answers_with_chunks: bool = False  # its policies answer with chunks only: the flow decoders serve them
    remote: bool = False  # its loader takes the checkpoint's address and the arm, not a directory
    # "module:function" called with the checkpoint's address: the action space of a remote family's
    # actions; empty: the robot record's in the directory (core/robot_record.py)
    action_space_of: str = ""

    def load(self, directory: Path, unnorm_key: str, *, device: str | None = None,
             dtype: str | None = None, tokenizer_dir: Path | None = None) -> PolicyLike:
        if tokenizer_dir is not None and not self.takes_tokenizer_dir:
            raise ValueError(f"{directory}: a checkpoint of the {self.name} family holds its tokenizer; "
                             "tokenizer_dir does not apply")
        if device is None and dtype is None and tokenizer_dir is None:
            policy: PolicyLike = _function(self.loader)(directory, unnorm_key)
            return policy
        if not self.placed_loader:
            raise ValueError(f"{directory}: a checkpoint of the {self.name} family runs on the CPU in float32 "
                             "(no device or dtype can be chosen)")
        extra = {"tokenizer_dir": tokenizer_dir} if self.takes_tokenizer_dir else {}
        placed: PolicyLike = _function(self.placed_loader)(directory, unnorm_key=unnorm_key or None, device=device,
                                                           dtype=dtype, **extra)
        return placed


    def check(self, directory: Path, unnorm_key: str) -> None:
        if self.checker:
            _function(self.checker)(directory, unnorm_key)


def _function(name: str) -> Callable[..., Any]:
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


def _is_llava_style(directory: Path, config: dict[str, Any] | None) -> bool:
    return (config is not None and isinstance(config.get("vision_config"), dict)
            and (config.get("image_token_id") is not None or config.get("image_token_index") is not None))


def check_own_files(directory: Path, unnorm_key: str = "") -> None:
    """The own family's files: ``model.json`` a JSON object, every safetensors file complete."""
    read_json_file(directory / "model.json")
    for path in sorted(directory.glob("*.safetensors")):
        check_safetensors(path)


def check_hf_files(directory: Path, unnorm_key: str = "") -> None:
    """A Hugging Face VLA's files: a Llava-style ``config.json``, then as :func:`check_token_vla_files`."""
    config = read_config(directory)
    if not _is_llava_style(directory, config):
        read = f"model_type {config.get('model_type')!r}" if config else "none"
        raise ValueError(f"{directory / CONFIG_FILE}: not a Llava-style VLA (a vision_config and an image token; "
                         f"read: {read})")
    check_token_vla_files(directory, unnorm_key)


def check_token_vla_files(directory: Path, unnorm_key: str = "") -> None:
    """A Hugging Face or OpenVLA model's files: safetensors weights, every shard its index names
    present and each file complete, and the action statistics of ``unnorm_key`` (empty: the
    file's only dataset)."""
    from vla_accel_ros.models.hf.vla_spec import load_action_statistics, load_spec, with_overrides

    check_weights(directory)
    load_action_statistics(directory, with_overrides(load_spec(directory), unnorm_key=unnorm_key or None))


def _is_lerobot(directory: Path, config: dict[str, Any] | None) -> bool:
    return config is not None and "type" in config and (directory / "policy_preprocessor.json").is_file()


def check_lerobot_files(directory: Path, unnorm_key: str = "") -> None:
    """A LeRobot policy's files: ``config.json`` of a supported type, ``model.safetensors`` complete."""
    from vla_accel_ros.models.lerobot.config import parse_config

    if unnorm_key:
        raise ValueError(f"{directory}: a LeRobot policy has one set of statistics; unnorm_key does not apply")
    parse_config(directory / CONFIG_FILE, read_config(directory) or {})
    if not (directory / "model.safetensors").is_file():
        raise ValueError(f"{directory / 'model.safetensors'}: missing (the policy's weights)")
    check_safetensors(directory / "model.safetensors")


def _is_oft(directory: Path, config: dict[str, Any] | None) -> bool:
    from vla_accel_ros.models.oft.components import has_action_head

    return config is not None and config.get("model_type") == "openvla" and has_action_head(directory)


def check_oft_files(directory: Path, unnorm_key: str = "") -> None:
    """An OpenVLA-OFT directory's files: safetensors weights, every shard its index names present
    and complete, and its components converted to safetensors (:mod:`.oft.components`)."""
    from vla_accel_ros.models.oft.components import find_components

    check_weights(directory)
    for path in find_components(directory).values():
        check_safetensors(path)


FAMILIES: tuple[Family, ...] = (
    Family("own", "model.json", lambda directory, config: (directory / "model.json").is_file(),
           "vla_accel_ros.models.own.checkpoint:load_policy_directory",
           checker="vla_accel_ros.models.load:check_own_files"),
    Family("hf", "config.json of a Llava-style VLA (a vision_config and an image token)", _is_llava_style,
           "vla_accel_ros.models.hf.hf_vla:load_policy_directory", "vla_accel_ros.models.hf.hf_vla:load_hf_vla",
           checker="vla_accel_ros.models.load:check_hf_files"),
    Family("oft", 'config.json with model_type "openvla" and an action_head--<step>_checkpoint file (OpenVLA-OFT)',
           _is_oft, "vla_accel_ros.models.oft.checkpoint:load_policy_directory",
           "vla_accel_ros.models.oft.checkpoint:load_oft", checker="vla_accel_ros.models.load:check_oft_files"),
    Family("openvla", 'config.json with model_type "openvla" (openvla-7b and its fine-tunes)',
           lambda directory, config: config is not None and config.get("model_type") == "openvla",
           "vla_accel_ros.models.openvla.checkpoint:load_policy_directory",
           "vla_accel_ros.models.openvla.checkpoint:load_openvla",
           checker="vla_accel_ros.models.load:check_token_vla_files"),
    Family("lerobot", "config.json with a policy type beside policy_preprocessor.json (SmolVLA, pi0, pi05)",
           _is_lerobot,
           "vla_accel_ros.models.lerobot.policy:load_policy_directory",
           "vla_accel_ros.models.lerobot.policy:load_lerobot", checker="vla_accel_ros.models.load:check_lerobot_files",
           takes_tokenizer_dir=True),
    Family("openpi", "an openpi server's address (openpi://HOST:PORT, ws://...)", lambda directory, config: False,
           "vla_accel_ros.models.openpi.client:connect_policy", answers_with_chunks=True,
           remote=True, action_space_of="vla_accel_ros.models.openpi.client:executed_action_space"),
)


def family_named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"unknown model family '{name}'; known: {', '.join(f.name for f in FAMILIES)}")


def read_config(directory: Path) -> dict[str, Any] | None:
    """The directory's ``config.json`` as a dict; None when there is none. ValueError, naming the
    file, when it is not a JSON object."""
    path = directory / CONFIG_FILE
    return read_json_file(path) if path.is_file() else None


def read_json_file(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ValueError naming the file when it is missing, unreadable or
    not a JSON object."""
    if not path.is_file():
        raise ValueError(f"{path}: missing")
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read it as JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def recognise(source: str | Path | CheckpointRef) -> Family:
    """The family of the checkpoint ``source`` names: the declared one (``hf:DIR``), else the first
    whose marker the directory holds. ValueError in one line otherwise: a missing directory (or the
    example parameter files' placeholder), or one no family recognises (naming the file read and
    the families known)."""
    ref = CheckpointRef.parse(source)
    if ref.address:
        return family_named("openpi")
    directory = ref.directory
    problem = checkpoint_problem(directory)
    if problem:
        raise ValueError(f"{directory}: {problem}")
    if ref.declared_family:
        return family_named(ref.declared_family)
    config = read_config(directory)
    for family in FAMILIES:
        if family.recognises(directory, config):
            return family
    read = f"{directory / CONFIG_FILE}" + (f" (model_type {config.get('model_type')!r})" if config else ": none")
    known = "; ".join(f"{f.name}: {f.marker}" for f in FAMILIES)
    raise ValueError(f"{directory}: not a checkpoint of a family this package runs (read {read}); known: {known}")


def check_checkpoint(source: str | Path | CheckpointRef, *, unnorm_key: str = "") -> Family:
    """The family of the checkpoint ``source`` names, once its files pass the checks that need no
    model (:func:`recognise`, then the family's own: complete safetensors files, a Hugging Face
    VLA's action statistics); ValueError naming the file at fault. Imports no torch."""
    ref = CheckpointRef.parse(source)
    family = recognise(ref)
    family.check(ref.directory, unnorm_key)
    return family


def is_device_name(device: str) -> bool:
    """Whether ``device`` names where a policy can run: cpu, cuda or cuda:N."""
    return re.fullmatch(r"cpu|cuda(:\d+)?", device) is not None


def check_device(source: str | Path | CheckpointRef, device: str) -> Family:
    """The family of the checkpoint ``source`` names, once it can run on ``device`` (empty or cpu:
    any; a GPU: a LeRobot policy only); ValueError in one line otherwise. Imports no torch."""
    ref = CheckpointRef.parse(source)
    family = recognise(ref)
    if device and device != "cpu" and family.name != "lerobot":
        raise ValueError(f"{ref}: device {device!r}: only a LeRobot policy (SmolVLA, pi0, pi05) runs on a GPU here; "
                         f"a checkpoint of the {family.name} family runs on the CPU")
    return family


def declared_action_space(source: str | Path | CheckpointRef) -> str:
    """What the actions of the checkpoint ``source`` names are, as declared
    (:mod:`vla_accel_ros.core.actions`): its robot record's ``action_space`` (end-effector deltas
    when it records no robot), a policy server's spec's. ValueError naming the file at fault."""
    ref = CheckpointRef.parse(source)
    family = recognise(ref)
    if family.action_space_of:
        space: str = _function(family.action_space_of)(ref.address)
        return space
    record = read_robot_record(ref.directory)
    return record.action_space if record is not None else EE_DELTA


def require_family(source: str | Path | CheckpointRef, name: str, purpose: str) -> None:
    """ValueError in one line unless the checkpoint ``source`` names is of the family ``name``
    (``purpose``: what needs it, for the message)."""
    family = recognise(source)
    if family.name != name:
        wanted = family_named(name)
        raise ValueError(f"{CheckpointRef.parse(source).directory}: a checkpoint of the {family.name} family "
                         f"({family.marker}), where {purpose} needs one of the {name} family ({wanted.marker})")


def load_policy(source: str | Path | CheckpointRef, *, unnorm_key: str = "", device: str | None = None,
                dtype: str | None = None, tokenizer_dir: Path | None = None, arm: Any = None) -> PolicyLike:
    """The policy in the checkpoint ``source`` names (a directory, ``hf:DIR``, or a policy server's
    address), loaded by its family (``unnorm_key``: a Hugging Face or OpenVLA model's dataset in its
    statistics; empty = the only one; ``device`` and ``dtype``: where it runs and its weights' dtype,
    None = the family's default; ``tokenizer_dir``: a LeRobot policy's tokenizer when not in the
    Hugging Face cache; ``arm``: the robot's kinematics, which a remote family's policy needs);
    ValueError naming the file at fault."""
    ref = CheckpointRef.parse(source)
    family = recognise(ref)
    if family.remote:
        if arm is None:
            raise ValueError(f"{ref}: a policy server needs the robot's kinematics (arm=)")
        remote: PolicyLike = _function(family.loader)(ref.address, arm=arm)
        return remote
    return family.load(ref.directory, unnorm_key, device=device, dtype=dtype, tokenizer_dir=tokenizer_dir)


def load_token_vla(source: str | Path | CheckpointRef, *, unnorm_key: str | None = None, device: str | None = None,
                   dtype: str | None = None, draft: bool = True) -> Any:
    """The Hugging Face or OpenVLA model (a :class:`~vla_accel_ros.models.hf.hf_vla.HFTokenVLA`, the
    token VLAs an EAGLE-style draft head is trained on) in the checkpoint ``source`` names, without
    its saved draft head when ``draft`` is False; ValueError for a checkpoint of another family."""
    ref = CheckpointRef.parse(source)
    family = recognise(ref)
    if family.name not in TOKEN_VLA_FAMILIES:
        raise ValueError(f"{ref.directory}: a checkpoint of the {family.name} family; this needs a Hugging Face or "
                         "OpenVLA model (hf:DIR, or a directory with model_type openvla)")
    return _function(family.placed_loader)(ref.directory, unnorm_key=unnorm_key or None, device=device, dtype=dtype,
                                           draft=draft)
