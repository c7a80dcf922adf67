"""Loading an OpenVLA directory as published (openvla-7b and its fine-tunes) into a policy.

What is read, and from where (JSON and safetensors only; the ``.py`` files beside the weights, which
``auto_map`` names, are never imported):

- ``config.json``: the backbones, the projector, the Llama's ``text_config``, the padding of the
  vocabulary (:mod:`.config`);
- the weights through ``model.safetensors.index.json`` (or one ``model.safetensors``),
  memory-mapped, in their stored dtype on the CPU and in bfloat16 on a GPU unless a dtype is asked
  for (:mod:`.weights`);
- ``preprocessor_config.json``: the resize and each tower's mean/std;
- ``tokenizer.json`` (or ``tokenizer.model``, which needs sentencepiece) and its special tokens;
- the action statistics: ``dataset_statistics.json``, else ``norm_stats`` in ``config.json``, the
  dataset picked by ``unnorm_key`` (required when there are several);
- optionally ``vla_spec.json``, as for a Llava-style directory: the gripper convention, device,
  dtype, ``unnorm_key`` and the robot the model was made for (the image settings are the
  processor's and may not be set there).

``config.json`` is parsed once, when the checkpoint is resolved (:func:`load_resolved` reads the
record's). The policy is :class:`~.policy.OpenVLAPolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vla_accel_ros.core.resources import checkpoint_problem
from vla_accel_ros.models.api import CheckpointRef, LoadOptions, ResolvedCheckpoint
from vla_accel_ros.models.files import read_json_object
from vla_accel_ros.models.openvla.config import (
    ImageProcessing,
    OpenVLADirectoryConfig,
    read_directory_config,
    read_image_processing,
    tower_configs,
)
from vla_accel_ros.models.openvla.modules import OpenVLAModel, OpenVLAModules
from vla_accel_ros.models.openvla.policy import OpenVLAPolicy
from vla_accel_ros.models.openvla.vision import FusedVisionBackbone
from vla_accel_ros.models.openvla.weights import OpenVLAWeights
from vla_accel_ros.models.token_vla.policy import TORCH_DTYPES, attach_saved_draft, spec_choices
from vla_accel_ros.models.token_vla.spec import CHUNK_KEYS, SPEC_FILE, VLASpec, default_dtype, load_spec, with_overrides

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_MODEL = "tokenizer.model"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
# vla_spec.json keys an OpenVLA directory defines itself (preprocessor_config.json)
PROCESSOR_KEYS = ("image_size", "image_mean", "image_std", "resample")
DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}


def load_resolved(checkpoint: ResolvedCheckpoint, options: LoadOptions) -> OpenVLAPolicy:
    """The family's loader (:mod:`vla_accel_ros.models.load`): :func:`load_openvla` of the resolved
    checkpoint, its ``config.json`` as resolved, under ``options`` (``unnorm_key``, ``device``,
    ``dtype``, ``draft``, ``draft_head``)."""
    parts = read_parts(checkpoint.directory, unnorm_key=options.unnorm_key or None, device=options.device,
                       dtype=options.dtype, config=checkpoint.config)
    return _policy(parts, draft=options.draft, draft_head=options.draft_head)


def load_openvla(path: Path | str, *, unnorm_key: str | None = None, device: str | None = None,
                 dtype: str | None = None, draft: bool = True, draft_head: Path | None = None) -> OpenVLAPolicy:
    """The OpenVLA model in ``path`` as a policy (module docstring). ``unnorm_key``, ``device`` and
    ``dtype`` ("float32", "bfloat16", "float16") override ``vla_spec.json``'s when given; without
    either, the weights keep their stored dtype on the CPU and load in bfloat16 on a GPU. A draft
    head saved beside the weights, or the one in ``draft_head`` (``train-draft --out``), is attached
    unless ``draft`` is False. Every problem is a ValueError naming the file or key at fault."""
    parts = read_parts(CheckpointRef.parse(path).directory, unnorm_key=unnorm_key, device=device, dtype=dtype)
    return _policy(parts, draft=draft, draft_head=draft_head)


def _policy(parts: DirectoryParts, *, draft: bool, draft_head: Path | None = None) -> OpenVLAPolicy:
    """The policy of an OpenVLA directory's :class:`DirectoryParts` (its draft head when ``draft``:
    the one in ``draft_head``, else the one beside the weights)."""
    directory = parts.directory
    for key in CHUNK_KEYS:
        if key in parts.stored:
            raise ValueError(f"{directory / SPEC_FILE}: '{key}' is for an OpenVLA-OFT directory (one with an "
                             "action_head--<step>_checkpoint file)")
    statistics, action_tokenizer, torch_device = spec_choices(directory, parts.spec, parts.config.raw)
    modules, text_tokenizer = build_modules(parts, torch_device)
    policy = OpenVLAPolicy(modules, text_tokenizer, parts.spec, action_tokenizer, source=str(directory),
                           statistics=statistics)
    if draft:
        attach_saved_draft(policy, directory, draft_head)
    return policy


@dataclass(frozen=True)
class DirectoryParts:
    """What an OpenVLA-layout directory says before its model is built (its JSON files and the
    weights' headers): the config, the weights, the image processing, the spec with the overrides
    given, and ``vla_spec.json`` as written (``stored``)."""

    directory: Path
    config: OpenVLADirectoryConfig
    weights: OpenVLAWeights
    processing: ImageProcessing
    spec: VLASpec
    stored: dict[str, Any]


def read_parts(directory: Path, *, unnorm_key: str | None = None, device: str | None = None,
               dtype: str | None = None, config: dict[str, Any] | None = None) -> DirectoryParts:
    """The :class:`DirectoryParts` of ``directory``, ``unnorm_key``, ``device`` and ``dtype``
    overriding ``vla_spec.json``'s; without a dtype, the weights' stored one on the CPU, bfloat16 on a
    GPU. ``config``: its
    ``config.json`` as parsed (None: read here). ValueError naming the file or key at fault."""
    problem = checkpoint_problem(directory)
    if problem:
        raise ValueError(f"{directory}: {problem}")
    directory_config = read_directory_config(directory, config)
    weights = OpenVLAWeights(directory)
    processing = read_image_processing(directory, len(directory_config.towers))
    spec_file = directory / SPEC_FILE
    stored = read_json_object(spec_file) if spec_file.is_file() else {}
    for key in PROCESSOR_KEYS:
        if key in stored:
            raise ValueError(f"{spec_file}: '{key}' is set by the OpenVLA directory's preprocessor_config.json, "
                             "not here")
    chosen_dtype = dtype or default_dtype(directory, device, DTYPE_NAMES.get(weights.stored_dtype, "float32"))
    spec = with_overrides(load_spec(directory, directory_config.raw), unnorm_key=unnorm_key, device=device,
                          dtype=chosen_dtype, image_size=processing.size)
    return DirectoryParts(directory, directory_config, weights, processing, spec, stored)


def build_modules(parts: DirectoryParts, device: torch.device) -> tuple[OpenVLAModules, Any]:
    """The model half of the passes (the network on ``device`` in the spec's dtype) and the text
    tokenizer; ValueError naming the file at fault."""
    directory, config = parts.directory, parts.config
    text_tokenizer = read_text_tokenizer(directory)
    if text_tokenizer.vocab_size != config.action_vocab_size:
        raise ValueError(f"{directory}: the tokenizer's vocabulary has {text_tokenizer.vocab_size} tokens, but "
                         f"{config.path.name} gives {config.action_vocab_size} (text_config.vocab_size - "
                         "pad_to_multiple_of)")
    if text_tokenizer.pad_token_id is None:
        raise ValueError(f"{directory}: the tokenizer has no pad token, whose id holds the image patches' places")
    model = build_model(config, parts.weights, parts.processing.size, TORCH_DTYPES[parts.spec.dtype]).to(device)
    return OpenVLAModules(model, parts.processing, image_token_id=int(text_tokenizer.pad_token_id)), text_tokenizer


def build_model(config: OpenVLADirectoryConfig, weights: OpenVLAWeights, image_size: int,
                dtype: torch.dtype) -> OpenVLAModel:
    """The network with the checkpoint's tensors in place (views into the memory-mapped shards where
    they are stored in ``dtype``, converted copies otherwise); ValueError naming the tensor and the
    file when one is missing, of another shape, or has no place in the model."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = empty_model(config, weights.shapes, image_size)
    expected = model.state_dict()
    check_tensors(config, weights, expected)
    tied = bool(model.language_model.config.tie_word_embeddings)
    state = {}
    for name in expected:
        tensor = weights.tensor(_stored_name(name, tied))
        state[name] = tensor if tensor.dtype == dtype else tensor.to(dtype)
    model.load_state_dict(state, assign=True, strict=True)
    language_model: Any = model.language_model
    # the rotary tables are computed, not stored: build them for real (the model was built on "meta")
    language_model.model.rotary_emb = LlamaRotaryEmbedding(config=language_model.config)
    if tied:
        language_model.lm_head.weight = language_model.model.embed_tokens.weight
    return model.requires_grad_(False).eval()


def empty_model(config: OpenVLADirectoryConfig, shapes: dict[str, tuple[int, ...]], image_size: int) -> OpenVLAModel:
    """The network ``config.json`` and the tensors' ``shapes`` describe, on the meta device (no memory)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from vla_accel_ros.models.hf.direct import llama_unsupported_reason

    towers = tower_configs(config.towers, shapes, image_size)
    text_kwargs = {k: v for k, v in config.text_config.items() if k not in ("torch_dtype", "dtype")}
    try:
        text_config = LlamaConfig(**text_kwargs, attn_implementation="sdpa")
    except (TypeError, ValueError) as error:
        raise ValueError(f"{config.path}: text_config is not a Llama config ({error})") from None
    if reason := llama_unsupported_reason(text_config):
        raise ValueError(f"{config.path}: text_config is not supported: {reason}")
    with torch.device("meta"):
        vision = FusedVisionBackbone(towers, int(text_config.hidden_size), config.fused_projector)
        return OpenVLAModel(vision, LlamaForCausalLM(text_config))


def check_tensors(config: OpenVLADirectoryConfig, weights: OpenVLAWeights, expected: dict[str, torch.Tensor]) -> None:
    """ValueError naming the tensor and its file unless the checkpoint holds every tensor of
    ``expected`` (the model's state dict) at its shape, and nothing else but the towers' parts that
    are never read."""
    tied = "language_model.lm_head.weight" not in weights.shapes and bool(config.text_config.get("tie_word_embeddings"))
    for name, meta in expected.items():
        source = _stored_name(name, tied)
        if source not in weights.shapes:
            raise ValueError(f"{weights.directory}: the weights have no tensor {_published(name)} "
                             f"(shape {tuple(meta.shape)})")
        if weights.shapes[source] != tuple(meta.shape):
            raise ValueError(f"{weights.file_of(source)}: tensor '{weights.published_name(source)}' has shape "
                             f"{weights.shapes[source]}, the model built from {config.path.name} needs "
                             f"{tuple(meta.shape)}")
    last_blocks = {prefix: max(int(n.split(".")[4]) for n in expected if n.startswith(prefix + ".blocks.")) + 1
                   for prefix in ("vision.towers.0", "vision.towers.1")}
    unused = [n for n in weights.names() if n not in expected and not _is_last_block(n, last_blocks)]
    if unused:
        raise ValueError(f"{weights.file_of(unused[0])}: tensor '{weights.published_name(unused[0])}' has no place in "
                         f"the model built from {config.path.name} ({len(unused)} such tensors)")


def _stored_name(name: str, tied: bool) -> str:
    return "language_model.model.embed_tokens.weight" if tied and name == "language_model.lm_head.weight" else name


def _is_last_block(name: str, last_blocks: dict[str, int]) -> bool:
    """Whether ``name`` is a tensor of a tower's last block (``last_blocks``: its index by tower; in
    the checkpoint, never run: the model is built with the blocks before it)."""
    parts = name.split(".")
    return (len(parts) > 5 and parts[3] == "blocks" and ".".join(parts[:3]) in last_blocks
            and int(parts[4]) == last_blocks[".".join(parts[:3])])


def _published(name: str) -> str:
    """The published name of one of our tensors, for messages."""
    from vla_accel_ros.models.openvla.weights import PREFIXES

    for source, target in PREFIXES:
        if name.startswith(target):
            rest = name[len(target):]
            if target.startswith("vision.towers."):
                rest = rest.replace("patch_embed.", "patch_embed.proj.", 1).replace(".gamma", ".scale_factor")
            return source + rest
    return name


def read_text_tokenizer(directory: Path) -> Any:
    """The directory's text tokenizer: ``tokenizer.json`` as its own pipeline says (with the special
    tokens of ``tokenizer_config.json`` / ``special_tokens_map.json``), else ``tokenizer.model``
    through transformers (which needs sentencepiece); ValueError naming the files otherwise."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    specials = _special_tokens(directory)
    if (directory / TOKENIZER_JSON).is_file():
        try:
            return PreTrainedTokenizerFast(tokenizer_file=str(directory / TOKENIZER_JSON), **specials)
        except Exception as error:  # the tokenizers library raises its own exception types
            raise ValueError(f"{directory / TOKENIZER_JSON}: cannot be read as a tokenizer ({error})") from None
    if (directory / TOKENIZER_MODEL).is_file():
        try:
            return AutoTokenizer.from_pretrained(directory, local_files_only=True, use_fast=True)
        except Exception as error:  # sentencepiece missing, or a bad file
            raise ValueError(f"{directory / TOKENIZER_MODEL}: cannot be read as a tokenizer ({error})") from None
    raise ValueError(f"{directory}: no tokenizer ({TOKENIZER_JSON} or {TOKENIZER_MODEL})")


def _special_tokens(directory: Path) -> dict[str, str]:
    """bos/eos/unk/pad tokens by name, from special_tokens_map.json then tokenizer_config.json."""
    specials: dict[str, str] = {}
    for file in (TOKENIZER_CONFIG, SPECIAL_TOKENS_FILE):
        path = directory / file
        if not path.is_file():
            continue
        data = read_json_object(path)
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = data.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value
    return specials
