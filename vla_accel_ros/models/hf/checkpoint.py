"""Loading a Llava-style Hugging Face VLA directory into a policy (:class:`~.policy.HFPolicy`).

What is read, and from where (JSON and safetensors only; a directory with only pickle weights,
``*.bin`` or ``*.pt``, is refused, and no code beside the weights is run):

- ``config.json`` (:mod:`.config`): parsed once, when the checkpoint is resolved; transformers is
  handed the config made of it, never the file;
- the spec (:func:`~vla_accel_ros.models.token_vla.spec.load_spec`: the processor's image settings,
  ``vla_spec.json``) and the action statistics of its ``unnorm_key``;
- the text tokenizer (``AutoTokenizer``) and the weights (``AutoModelForImageTextToText``);
- a draft head saved beside the weights (``draft_head.*``, ``vla-accel train-draft``), or in the
  directory the ``draft_head`` option names (``train-draft --out``).

transformers is imported when a model is loaded, not with this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.models.api import CheckpointRef, LoadOptions, ResolvedCheckpoint
from vla_accel_ros.models.files import check_weights, read_config
from vla_accel_ros.models.hf.config import llava_config, transformers_config
from vla_accel_ros.models.hf.policy import HFPolicy
from vla_accel_ros.models.token_vla.policy import TORCH_DTYPES, attach_saved_draft, spec_choices
from vla_accel_ros.models.token_vla.spec import default_dtype, load_spec, with_overrides


def load_resolved(checkpoint: ResolvedCheckpoint, options: LoadOptions) -> HFPolicy:
    """The family's loader (:mod:`vla_accel_ros.models.load`): the policy of the resolved
    checkpoint, its ``config.json`` as resolved, under ``options`` (``unnorm_key``, ``device``,
    ``dtype``, ``draft``, ``draft_head``)."""
    directory = checkpoint.directory
    return _load(directory, llava_config(directory, checkpoint.config), unnorm_key=options.unnorm_key or None,
                 device=options.device, dtype=options.dtype, draft=options.draft, draft_head=options.draft_head)


def load_hf_vla(path: Path | str, *, unnorm_key: str | None = None, device: str | None = None,
                dtype: str | None = None, draft: bool = True, draft_head: Path | None = None) -> HFPolicy:
    """Load the Hugging Face VLA in ``path`` (``hf:/path`` or a path): its spec
    (:func:`vla_accel_ros.models.token_vla.spec.load_spec`), action statistics, text tokenizer and
    safetensors weights. ``unnorm_key``, ``device`` ("cpu", "cuda", ...) and ``dtype`` ("float32",
    "bfloat16", "float16") override the spec's when given (its defaults: the file's only key,
    cpu, float32 on the CPU and bfloat16 on a GPU). A draft head saved beside the weights
    (``draft_head.safetensors`` + ``.json``, ``vla-accel train-draft``), or the one in
    ``draft_head`` (``train-draft --out``), is attached unless ``draft`` is False (a trainer
    replacing it). Every problem is a ValueError naming the file or key at fault."""
    directory = CheckpointRef.parse(path).directory
    problem = checkpoint_problem(directory)
    if problem:
        raise ValueError(f"{directory}: {problem}")
    return _load(directory, llava_config(directory, read_config(directory)), unnorm_key=unnorm_key, device=device,
                 dtype=dtype, draft=draft, draft_head=draft_head)


def _load(directory: Path, config: dict[str, Any], *, unnorm_key: str | None, device: str | None,
          dtype: str | None, draft: bool, draft_head: Path | None) -> HFPolicy:
    """:func:`load_hf_vla` of ``directory``, whose ``config.json`` is ``config`` (checked)."""
    check_weights(directory)
    spec = with_overrides(load_spec(directory, config), unnorm_key=unnorm_key, device=device,
                          dtype=dtype or default_dtype(directory, device, "float32"))
    statistics, tokenizer, torch_device = spec_choices(directory, spec, config)

    from transformers import AutoModelForImageTextToText, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a bar per load would fill every command's log

    model_config = transformers_config(directory, config, TORCH_DTYPES[spec.dtype])
    try:
        text_tokenizer = AutoTokenizer.from_pretrained(directory, config=model_config, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"{directory}: no usable tokenizer ({error})") from None
    try:
        model = AutoModelForImageTextToText.from_pretrained(
            directory, config=model_config, local_files_only=True, use_safetensors=True,
            dtype=TORCH_DTYPES[spec.dtype])
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise ValueError(f"{directory}: the model cannot be loaded as an image-text-to-text model ({error})") from None
    policy = HFPolicy.from_model(model, text_tokenizer, spec, tokenizer, device=torch_device, source=str(directory),
                                 statistics=statistics)
    if draft:
        attach_saved_draft(policy, directory, draft_head)
    return policy
