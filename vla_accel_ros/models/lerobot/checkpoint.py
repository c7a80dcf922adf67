"""Loading a LeRobot policy directory (SmolVLA, π0, π0.5) into a policy (:class:`~.policy.LeRobotPolicy`).

What is read, and from where (JSON and safetensors only):

- ``config.json`` (:mod:`.config`): parsed once, when the checkpoint is resolved
  (:func:`load_resolved` reads the record's);
- ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and the statistics files their steps
  name (:mod:`.processor`), and the tokenizer they name, from ``tokenizer_dir``, a folder of the
  directory of that name, or the Hugging Face cache;
- ``model.safetensors`` into the networks ``type`` names (:mod:`.modules`), and the fitted 2-step
  sampler when one lies beside it (:mod:`.student`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vla_accel_ros.core.errors import SettingError
from vla_accel_ros.models.api import LoadOptions, ResolvedCheckpoint
from vla_accel_ros.models.files import CONFIG_FILE, read_config
from vla_accel_ros.models.lerobot.config import parse_config
from vla_accel_ros.models.lerobot.modules import load_model
from vla_accel_ros.models.lerobot.policy import LeRobotPolicy
from vla_accel_ros.models.lerobot.processor import Statistics, load_tokenizer, tokenizer_settings
from vla_accel_ros.models.lerobot.student import load_student

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_resolved(checkpoint: ResolvedCheckpoint, options: LoadOptions) -> LeRobotPolicy:
    """The family's loader (:mod:`vla_accel_ros.models.load`): the policy of the resolved
    checkpoint, its ``config.json`` as resolved, under ``options`` (``device``, ``dtype``,
    ``tokenizer_dir``)."""
    place, dtype = _placement(options.device, options.dtype)
    return _load(checkpoint.directory, checkpoint.config, place, dtype, options.tokenizer_dir)


def load_lerobot(directory: Path | str, *, unnorm_key: str | None = None, device: str | None = None,
                 dtype: str | None = None, tokenizer_dir: Path | str | None = None) -> LeRobotPolicy:
    """The LeRobot policy in ``directory`` (``device``: cpu (default), cuda, cuda:1, ...; ``dtype``:
    float32 or bfloat16, None = as saved; ``tokenizer_dir``: the tokenizer, and SmolVLA's VLM config,
    when not in the hub cache; a tokenizer name that is a folder of ``directory`` is read from there);
    ValueError naming the file or key at fault."""
    directory = Path(directory)
    if unnorm_key:
        raise SettingError(f"{directory}: a LeRobot policy has one set of statistics; unnorm_key does not apply",
                           "unnorm_key")
    place, torch_dtype = _placement(device, dtype)
    return _load(directory, read_config(directory), place, torch_dtype,
                 None if tokenizer_dir is None else Path(tokenizer_dir))


def _placement(device: str | None, dtype: str | None) -> tuple[torch.device, torch.dtype | None]:
    """Where the policy runs and its weights' dtype (None: as saved); ValueError for a device this
    torch cannot use or a dtype the family does not load in."""
    try:
        place = torch.device(device or "cpu")
    except RuntimeError:
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}") from None
    if place.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch sees no CUDA device")
    if place.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return place, None if dtype is None else DTYPES[dtype]


def _load(directory: Path, raw: dict[str, Any] | None, place: torch.device, dtype: torch.dtype | None,
          tokenizer_dir: Path | None) -> LeRobotPolicy:
    """:func:`load_lerobot` of ``directory``, whose ``config.json`` is ``raw`` (None: it has none), on
    ``place`` in ``dtype``."""
    if raw is None:
        raise ValueError(f"{directory / CONFIG_FILE}: missing")
    config = parse_config(directory / CONFIG_FILE, raw)
    statistics = Statistics.load(directory, config)
    settings = tokenizer_settings(directory, config)
    tok_dir = tokenizer_dir
    name = str(settings["tokenizer_name"])
    if tok_dir is None and name and (directory / name).is_dir():  # the VLM's config and tokenizer kept beside it
        tok_dir = directory / name
    tokenizer = load_tokenizer(name, tok_dir)
    model = load_model(directory, config, dtype, tok_dir)
    student = load_student(directory, model)
    if place.type != "cpu":
        model.to(place)
        if student is not None:
            student.to(place)
    return LeRobotPolicy(config, model, statistics, tokenizer, settings, student, place)
