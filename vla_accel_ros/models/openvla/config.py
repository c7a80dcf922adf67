"""What an OpenVLA directory says about its model, read from its JSON files only.

- ``config.json`` (``model_type: "openvla"``): ``vision_backbone_id`` names the towers,
  ``arch_specifier`` the projector, ``text_config`` the Llama (transformers' diff against
  ``LlamaConfig()``'s defaults, so a missing size is the default's: 4096 wide, 32 layers, RMSNorm
  eps 1e-6), ``pad_to_multiple_of`` the embedding rows added past the tokenizer's vocabulary,
  ``n_action_bins`` and ``norm_stats``.
- ``preprocessor_config.json``: per tower, the resize (``tvf_resize_params``) and the mean/std it
  normalises with (``tvf_normalize_params``, the values the model was trained with: they are
  bfloat16-rounded for DINOv2, and they override ``means``/``stds``).

The towers' kind comes from ``vision_backbone_id`` (:data:`VISION_BACKBONES`); their width, depth
and MLP width are read from the weights (:func:`tower_configs`), so that smaller models of the same
kind, made for tests, load as the published ones do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vla_accel_ros.models.files import CONFIG_FILE, read_json_object
from vla_accel_ros.models.openvla.vision import TowerConfig
from vla_accel_ros.models.tokenizer import N_BINS

PREPROCESSOR_FILE = "preprocessor_config.json"
MODEL_TYPE = "openvla"
PIL_BICUBIC = 3


@dataclass(frozen=True)
class TowerKind:
    """A kind of ViT tower: the timm model OpenVLA builds it as, the width of its attention heads,
    its prefix tokens (class + registers), and whether its blocks have LayerScale."""

    timm_id: str
    head_width: int
    prefix_tokens: int
    layer_scale: bool


DINOV2_L_REG4 = TowerKind("vit_large_patch14_reg4_dinov2.lvd142m", head_width=64, prefix_tokens=5, layer_scale=True)
SIGLIP_SO400M = TowerKind("vit_so400m_patch14_siglip_224", head_width=72, prefix_tokens=0, layer_scale=False)
# vision_backbone_id -> its towers, in the order of the checkpoint's featurizer, fused_featurizer
VISION_BACKBONES: dict[str, tuple[TowerKind, ...]] = {
    "dinosiglip-vit-so-224px": (DINOV2_L_REG4, SIGLIP_SO400M),
}
# arch_specifier -> whether the projector is fused-gelu-mlp (3 layers) rather than gelu-mlp (2)
PROJECTORS = {"no-align+fused-gelu-mlp": True}
RESIZE_STRATEGIES = ("resize-naive",)


@dataclass(frozen=True)
class ImageProcessing:
    """Per tower: the resized side, PIL's resampling code, and the mean/std per channel."""

    size: int
    resample: int
    means: tuple[tuple[float, float, float], ...]
    stds: tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class OpenVLADirectoryConfig:
    """``config.json`` of an OpenVLA directory, checked. ``text_config``: the keyword arguments of
    ``LlamaConfig`` as shipped; ``action_vocab_size``: the tokenizer's vocabulary, from whose top
    the action ids count (``text_config.vocab_size - pad_to_multiple_of``); ``raw``: the file as
    parsed."""

    path: Path
    vision_backbone_id: str
    towers: tuple[TowerKind, ...]
    fused_projector: bool
    text_config: dict[str, Any]
    action_vocab_size: int
    norm_stats: dict[str, Any] | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def read_directory_config(directory: Path, config: dict[str, Any] | None = None) -> OpenVLADirectoryConfig:
    """The checked ``config.json`` of the OpenVLA directory ``directory`` (``config``: that file as
    parsed; None: read here); ValueError naming the file and key otherwise (an unsupported backbone
    or projector lists the supported ones)."""
    path = directory / CONFIG_FILE
    if config is None:
        if not path.is_file():
            raise ValueError(f"{path}: missing; not an OpenVLA directory")
        config = read_json_object(path)
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path}: model_type {config.get('model_type')!r}, not {MODEL_TYPE!r}")
    backbone = config.get("vision_backbone_id")
    if backbone not in VISION_BACKBONES:
        raise ValueError(f"{path}: vision_backbone_id {backbone!r} is not supported; supported: "
                         f"{', '.join(VISION_BACKBONES)}")
    arch = config.get("arch_specifier")
    if arch not in PROJECTORS:
        raise ValueError(f"{path}: arch_specifier {arch!r} is not supported; supported: {', '.join(PROJECTORS)}")
    strategy = config.get("image_resize_strategy", "resize-naive")
    if strategy not in RESIZE_STRATEGIES:
        raise ValueError(f"{path}: image_resize_strategy {strategy!r} is not supported; supported: "
                         f"{', '.join(RESIZE_STRATEGIES)}")
    bins = config.get("n_action_bins", N_BINS)
    if bins != N_BINS:
        raise ValueError(f"{path}: n_action_bins {bins!r}; this package decodes {N_BINS} bins")
    text = config.get("text_config") or {}
    if not isinstance(text, dict):
        raise ValueError(f"{path}: text_config must be a JSON object")
    if text.get("model_type", "llama") != "llama":
        raise ValueError(f"{path}: text_config.model_type {text.get('model_type')!r} is not supported; "
                         "supported: llama")
    text = {k: v for k, v in text.items() if k not in ("model_type", "architectures", "_name_or_path")}
    pad = config.get("pad_to_multiple_of", 64)
    vocab = text.get("vocab_size", 32000)
    if not (isinstance(pad, int) and isinstance(vocab, int) and 0 <= pad < vocab):
        raise ValueError(f"{path}: text_config.vocab_size {vocab!r} and pad_to_multiple_of {pad!r} must be "
                         "integers, the padding smaller than the vocabulary")
    stats = config.get("norm_stats")
    return OpenVLADirectoryConfig(path=path, vision_backbone_id=backbone, towers=VISION_BACKBONES[backbone],
                                  fused_projector=PROJECTORS[arch], text_config=text,
                                  action_vocab_size=vocab - pad, norm_stats=stats if isinstance(stats, dict) else None,
                                  raw=config)


def tower_configs(kinds: tuple[TowerKind, ...], shapes: dict[str, tuple[int, ...]],
                  image_size: int) -> list[TowerConfig]:
    """Each tower's :class:`TowerConfig` for ``image_size`` px images (the processor's), its sizes
    read from the checkpoint's tensor ``shapes`` (by our names, ``vision.towers.<i>.*``); ValueError
    naming the tensor when one is missing or does not fit the kind."""
    towers = []
    for index, kind in enumerate(kinds):
        prefix = f"vision.towers.{index}."

        def shape(name: str, prefix: str = prefix, index: int = index, kind: TowerKind = kind) -> tuple[int, ...]:
            if prefix + name not in shapes:
                raise ValueError(f"tower {index} ({kind.timm_id}): the checkpoint has no {name}")
            return shapes[prefix + name]

        width, _, patch, _ = shape("patch_embed.weight")
        depth = 1 + max((int(name[len(prefix):].split(".")[1]) for name in shapes
                         if name.startswith(prefix + "blocks.")), default=-1)
        if depth < 2 or width % kind.head_width:
            raise ValueError(f"tower {index} ({kind.timm_id}): {depth} blocks of width {width}; it needs at least "
                             f"2 blocks and a width that is a multiple of {kind.head_width}")
        mlp_width = shape("blocks.0.mlp.fc1.weight")[0]
        config = TowerConfig(width=width, depth=depth, heads=width // kind.head_width, mlp_width=mlp_width,
                             patch_size=patch, image_size=image_size, prefix_tokens=kind.prefix_tokens,
                             layer_scale=kind.layer_scale)
        if shape("pos_embed") != (1, config.n_patches, width):
            raise ValueError(f"tower {index} ({kind.timm_id}): pos_embed of shape {shape('pos_embed')}, expected "
                             f"{(1, config.n_patches, width)} for {image_size} px images in {patch} px patches")
        towers.append(config)
    return towers


def read_image_processing(directory: Path, n_towers: int) -> ImageProcessing:
    """The image processing of ``preprocessor_config.json``: one resize for every tower (resize-naive,
    bicubic) and each tower's mean/std; ValueError naming the file and key otherwise."""
    path = directory / PREPROCESSOR_FILE
    if not path.is_file():
        raise ValueError(f"{path}: missing; an OpenVLA directory's image processing is read from it")
    processor = read_json_object(path)
    resizes = processor.get("tvf_resize_params")
    normalise = processor.get("tvf_normalize_params")
    if normalise is None and processor.get("means") is not None:  # the processor's own fallback
        normalise = [{"mean": m, "std": s} for m, s in zip(processor.get("means") or [], processor.get("stds") or [])]
    for key, value in (("tvf_resize_params", resizes), ("tvf_normalize_params", normalise)):
        if not (isinstance(value, list) and len(value) == n_towers and all(isinstance(v, dict) for v in value)):
            raise ValueError(f"{path}: {key} must hold one entry per vision tower ({n_towers})")
    sizes = set()
    for resize in resizes:
        size = resize.get("size")
        size = tuple(size) if isinstance(size, list) else (size, size)
        if len(size) != 2 or size[0] != size[1] or not isinstance(size[0], int):
            raise ValueError(f"{path}: tvf_resize_params size {resize.get('size')!r}: only a square resize "
                             "(resize-naive) is supported")
        sizes.add((size[0], resize.get("interpolation", PIL_BICUBIC)))
    if len(sizes) != 1:
        raise ValueError(f"{path}: the towers resize differently ({sorted(sizes)}); one resize is supported")
    (size, resample), = sizes
    means, stds = [], []
    for entry in normalise:
        mean, std = entry.get("mean"), entry.get("std")
        if not (isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) == 3
                and all(isinstance(v, (int, float)) for v in mean + std) and min(std) > 0):
            raise ValueError(f"{path}: tvf_normalize_params needs 3 means and 3 positive stds per tower, "
                             f"got {mean!r} and {std!r}")
        means.append(tuple(float(v) for v in mean))
        stds.append(tuple(float(v) for v in std))
    return ImageProcessing(size=size, resample=int(resample), means=tuple(means), stds=tuple(stds))
