"""A LeRobot policy directory's ``config.json``, read as this package needs it (torch-free).

LeRobot writes the whole policy config (a dataclass dump) with ``"type"`` naming the policy. Only
the fields that shape inference are read; unknown fields are ignored, so a config written by a
newer release loads as long as the fields below keep their meaning.

- ``smolvla``: SmolVLM2's first ``num_vlm_layers`` text layers plus an action expert of
  ``expert_width_multiplier`` x its width that cross-attends to the VLM's keys and values, with
  joint self-attention every ``self_attn_every_n_layers`` layers; ``num_steps`` Euler steps.
- ``pi0``: PaliGemma plus a Gemma action expert, sizes named by ``paligemma_variant`` and
  ``action_expert_variant``; ``num_inference_steps`` Euler steps.
- ``pi05``: π0.5, π0's fields and networks except that the state reaches the model as text in
  the prompt and the flow time conditions the expert's norms; 200 language tokens by default.

Cameras are the VISUAL input features in the order the file lists them (the order the model
stacks them); the state is the STATE feature, the action the ACTION output feature. Of each
``chunk_size`` chunk the first ``n_action_steps`` are executed before the next is sampled, as
LeRobot's ``select_action`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_TYPES = ("smolvla", "pi0", "pi05")
PALIGEMMA_TYPES = ("pi0", "pi05")  # PaliGemma plus a Gemma expert
STATE_FEATURE = "observation.state"
ACTION_FEATURE = "action"
# The PaliGemma tokenizer π0's and π0.5's preprocessors name (LeRobot hard-codes it; the file repeats it).
PI0_TOKENIZER = "google/paligemma-3b-pt-224"


@dataclass(frozen=True)
class GemmaVariant:
    """A Gemma size as openpi and LeRobot name it (their sizes are not in config.json)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


GEMMA_VARIANTS = {
    "gemma_2b": GemmaVariant(2048, 18, 16_384, 8, 1, 256),
    "gemma_300m": GemmaVariant(1024, 18, 4096, 8, 1, 256),
    "dummy": GemmaVariant(64, 4, 128, 8, 1, 16),  # openpi's test size
}


@dataclass(frozen=True)
class LeRobotConfig:
    """What inference reads of a LeRobot policy's ``config.json`` (module docstring)."""

    path: Path
    type: str
    chunk_size: int
    n_action_steps: int
    num_steps: int
    max_state_dim: int
    max_action_dim: int
    camera_names: tuple[str, ...]
    state_dim: int
    action_dim: int
    normalization: dict[str, str]
    tokenizer_max_length: int
    min_period: float
    max_period: float
    empty_cameras: int = 0
    # smolvla
    vlm_model_name: str = ""
    num_vlm_layers: int = 16
    num_expert_layers: int = -1
    self_attn_every_n_layers: int = 2
    expert_width_multiplier: float = 0.75
    attention_mode: str = "cross_attn"
    resize_imgs_with_padding: tuple[int, int] | None = (512, 512)
    pad_language_to: str = "longest"
    prefix_length: int = -1
    add_image_special_tokens: bool = False
    load_vlm_weights: bool = False
    # pi0, pi05
    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    dtype: str = "float32"
    image_resolution: tuple[int, int] = (224, 224)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def tokenizer_name(self) -> str:
        """The hub name the tokenizer is published under (LeRobot's preprocessor loads it by name)."""
        return self.vlm_model_name if self.type == "smolvla" else PI0_TOKENIZER

    @property
    def paligemma(self) -> bool:
        """π0 or π0.5: PaliGemma plus a Gemma expert (images resized with centred padding)."""
        return self.type in PALIGEMMA_TYPES

    @property
    def image_size(self) -> int:
        """Side of the square image the vision tower takes (the node resizes camera frames to it)."""
        return self.image_hw[0]

    @property
    def image_hw(self) -> tuple[int, int]:
        """(height, width) the model's vision tower takes."""
        if self.type == "smolvla":
            size = self.resize_imgs_with_padding or (512, 512)
            return int(size[1]), int(size[0])
        return int(self.image_resolution[0]), int(self.image_resolution[1])


def intermediate_size(hidden: int, multiplier: int = 4, multiple_of: int = 256) -> int:
    """The expert MLP's width LeRobot derives from its hidden width."""
    width = multiplier * int(2 * hidden / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


def _feature_shape(path: Path, name: str, feature: Any) -> list[int]:
    if not isinstance(feature, dict) or not isinstance(feature.get("shape"), list):
        raise ValueError(f"{path}: feature {name!r} has no shape list")
    return [int(v) for v in feature["shape"]]


def parse_config(path: Path, raw: dict[str, Any]) -> LeRobotConfig:
    """The config of a policy directory's parsed ``config.json`` at ``path``; ValueError naming the
    file and key for an unsupported type or a missing or malformed field."""
    kind = raw.get("type")
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"{path}: type {kind!r} is not supported; supported: {', '.join(SUPPORTED_TYPES)}")
    inputs = raw.get("input_features") or {}
    outputs = raw.get("output_features") or {}
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise ValueError(f"{path}: input_features and output_features must be objects")
    cameras = tuple(name for name, f in inputs.items() if isinstance(f, dict) and f.get("type") == "VISUAL")
    if not cameras:
        raise ValueError(f"{path}: input_features has no VISUAL feature (a camera)")
    if STATE_FEATURE not in inputs:
        raise ValueError(f"{path}: input_features has no {STATE_FEATURE!r}")
    if ACTION_FEATURE not in outputs:
        raise ValueError(f"{path}: output_features has no {ACTION_FEATURE!r}")
    state_dim = _feature_shape(path, STATE_FEATURE, inputs[STATE_FEATURE])[-1]
    action_dim = _feature_shape(path, ACTION_FEATURE, outputs[ACTION_FEATURE])[-1]
    normalization = {str(k): str(v) for k, v in (raw.get("normalization_mapping") or {}).items()}

    def number(key: str, default: Any) -> Any:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{path}: {key} must be a number, got {value!r}")
        return value

    steps_key = "num_steps" if kind == "smolvla" else "num_inference_steps"
    chunk_size = int(number("chunk_size", 50))
    common: dict[str, Any] = dict(
        path=path, type=kind, chunk_size=chunk_size,
        n_action_steps=int(number("n_action_steps", chunk_size)), num_steps=int(number(steps_key, 10)),
        max_state_dim=int(number("max_state_dim", 32)), max_action_dim=int(number("max_action_dim", 32)),
        camera_names=cameras, state_dim=state_dim, action_dim=action_dim, normalization=normalization,
        tokenizer_max_length=int(number("tokenizer_max_length", 200 if kind == "pi05" else 48)),
        min_period=float(number("min_period", 4e-3)), max_period=float(number("max_period", 4.0)),
        empty_cameras=int(number("empty_cameras", 0)), raw=raw)
    for key in ("chunk_size", "num_steps", "max_state_dim", "max_action_dim"):
        if common[key] <= 0:
            raise ValueError(f"{path}: {steps_key if key == 'num_steps' else key} must be positive")
    if not 0 < common["n_action_steps"] <= common["chunk_size"]:
        raise ValueError(f"{path}: n_action_steps must be in 1..chunk_size ({common['chunk_size']}), "
                         f"got {common['n_action_steps']}")
    if state_dim > common["max_state_dim"] or action_dim > common["max_action_dim"]:
        raise ValueError(f"{path}: state ({state_dim}) or action ({action_dim}) wider than max_state_dim "
                         f"({common['max_state_dim']}) or max_action_dim ({common['max_action_dim']})")
    if raw.get("use_relative_actions"):
        raise ValueError(f"{path}: use_relative_actions is not supported (actions relative to the state)")
    if kind == "smolvla":
        return _smolvla(path, raw, common)
    return _pi0(path, raw, common)


def _smolvla(path: Path, raw: dict[str, Any], common: dict[str, Any]) -> LeRobotConfig:
    if raw.get("add_image_special_tokens"):
        raise ValueError(f"{path}: add_image_special_tokens true is not supported")
    if raw.get("adapt_to_pi_aloha"):
        raise ValueError(f"{path}: adapt_to_pi_aloha true is not supported")
    mode = str(raw.get("attention_mode", "cross_attn"))
    resize = raw.get("resize_imgs_with_padding", [512, 512])
    name = raw.get("vlm_model_name", "HuggingFaceTB/SmolVLM2-500M-Video-Instruct")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path}: vlm_model_name must name the VLM")
    return LeRobotConfig(
        **common, vlm_model_name=name, num_vlm_layers=int(raw.get("num_vlm_layers", 16)),
        num_expert_layers=int(raw.get("num_expert_layers", -1)),
        self_attn_every_n_layers=int(raw.get("self_attn_every_n_layers", 2)),
        expert_width_multiplier=float(raw.get("expert_width_multiplier", 0.75)), attention_mode=mode,
        resize_imgs_with_padding=None if resize is None else (int(resize[0]), int(resize[1])),
        pad_language_to=str(raw.get("pad_language_to", "longest")), prefix_length=int(raw.get("prefix_length", -1)),
        load_vlm_weights=bool(raw.get("load_vlm_weights", False)))


def _pi0(path: Path, raw: dict[str, Any], common: dict[str, Any]) -> LeRobotConfig:
    variants = {}
    for key, default in (("paligemma_variant", "gemma_2b"), ("action_expert_variant", "gemma_300m")):
        variants[key] = str(raw.get(key, default))
        if variants[key] not in GEMMA_VARIANTS:
            raise ValueError(f"{path}: {key} {variants[key]!r} is not a known Gemma size; known: "
                             f"{', '.join(GEMMA_VARIANTS)}")
    resolution = raw.get("image_resolution", [224, 224])
    if not isinstance(resolution, list | tuple) or len(resolution) != 2 or resolution[0] != resolution[1]:
        raise ValueError(f"{path}: image_resolution must be a square [size, size], got {resolution!r}")
    dtype = str(raw.get("dtype", "float32"))
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"{path}: dtype must be float32 or bfloat16, got {dtype!r}")
    return LeRobotConfig(**common, **variants, dtype=dtype, image_resolution=(int(resolution[0]), int(resolution[1])))
