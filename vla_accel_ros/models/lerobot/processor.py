"""A LeRobot policy's processor files: the statistics that (un)normalise state and action, the
tokenizer the prompt goes through, and the images as the model takes them.

- ``policy_preprocessor.json`` / ``policy_postprocessor.json`` list the pipeline's steps; the
  normaliser's and unnormaliser's statistics lie in the safetensors file each step names as its
  ``state_file`` (the step number in that name varies by policy and release, so it is read, never
  guessed), flat keys such as ``observation.state.mean`` and ``action.std``.
- Modes (``norm_map``, by feature type): MEAN_STD ``(x - mean) / (std + eps)`` and back ``x std +
  mean``; MIN_MAX, QUANTILES (q01/q99), QUANTILE10 (q10/q90) map to [-1, 1]; IDENTITY leaves it.
  A feature whose mode needs statistics the file lacks is refused, naming the file and the key
  (LeRobot would pass it through unnormalised, silently).
- The tokenizer is not in the directory: it is the one published under the name the preprocessor
  names, read offline from ``tokenizer_dir`` or the Hugging Face cache (``HF_HOME``).
- The prompt: SmolVLA's and π0's is the instruction with a newline. π0.5's carries the state: the
  normalised state (its own width, unpadded) cut into 256 equal bins over [-1, 1], bin ``i``
  holding ``-1 + 2i/256 <= x < -1 + 2(i+1)/256`` (below -1: -1; from the last edge up: 255), in
  ``"Task: {task}, State: {bins};\nAction: "``, the task stripped, its underscores and newlines
  made spaces; no newline is appended.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vla_accel_ros.models.files import read_json_object
from vla_accel_ros.models.lerobot.config import ACTION_FEATURE, STATE_FEATURE, LeRobotConfig

PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"
STATISTICS_NEEDED = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"),
                     "QUANTILE10": ("q10", "q90"), "IDENTITY": ()}
FEATURE_TYPES = {STATE_FEATURE: "STATE", ACTION_FEATURE: "ACTION"}


def _steps(path: Path) -> list[dict[str, Any]]:
    steps = read_json_object(path).get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ValueError(f"{path}: 'steps' must be a list of objects")
    return steps


@dataclass(frozen=True)
class FeatureNormaliser:
    """One feature's mode and statistics (float32 tensors of the feature's width)."""

    mode: str
    stats: dict[str, torch.Tensor]
    eps: float

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stats
        if self.mode == "MEAN_STD":
            return (x - s["mean"]) / (s["std"] + self.eps)
        if self.mode == "IDENTITY":
            return x
        low, high = self._range()
        return 2.0 * (x - low) / self._span(low, high) - 1.0

    def unnormalise(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stats
        if self.mode == "MEAN_STD":
            return x * s["std"] + s["mean"]
        if self.mode == "IDENTITY":
            return x
        low, high = self._range()
        return (x + 1.0) * self._span(low, high) / 2.0 + low

    def _range(self) -> tuple[torch.Tensor, torch.Tensor]:
        low_key, high_key = STATISTICS_NEEDED[self.mode]
        return self.stats[low_key], self.stats[high_key]

    def _span(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        span = high - low
        return torch.where(span == 0, torch.tensor(self.eps, dtype=span.dtype), span)


def _statistics_step(path: Path, kind: str) -> tuple[dict[str, Any], Path]:
    """The (un)normaliser step of a processor file and the path of its statistics."""
    for step in _steps(path):
        if step.get("registry_name") == f"{kind}_processor":
            state_file = step.get("state_file")
            if not isinstance(state_file, str) or not state_file:
                raise ValueError(f"{path}: the {kind}_processor step names no state_file")
            return step.get("config") or {}, path.parent / state_file
    raise ValueError(f"{path}: no {kind}_processor step")


def _feature(config_path: Path, config: dict[str, Any], stats_path: Path, feature: str,
             dim: int) -> FeatureNormaliser:
    from safetensors import safe_open

    norm_map = config.get("norm_map") or {}
    mode = str(norm_map.get(FEATURE_TYPES[feature], "IDENTITY"))
    if mode not in STATISTICS_NEEDED:
        raise ValueError(f"{config_path}: normalisation mode {mode!r} of {feature} is not supported")
    stats: dict[str, torch.Tensor] = {}
    if STATISTICS_NEEDED[mode]:
        if not stats_path.is_file():
            raise ValueError(f"{stats_path}: missing (named as state_file by {config_path})")
        try:
            with safe_open(str(stats_path), framework="pt") as handle:
                stored = set(handle.keys())
                for stat in STATISTICS_NEEDED[mode]:
                    key = f"{feature}.{stat}"
                    if key not in stored:
                        raise ValueError(f"{stats_path}: statistics lack {key!r} ({mode} normalisation of {feature})")
                    stats[stat] = handle.get_tensor(key).to(torch.float32).reshape(-1)
        except (OSError, RuntimeError) as error:  # safetensors' own errors are plain exceptions
            raise ValueError(f"{stats_path}: cannot read it as safetensors ({error})") from None
        for stat, value in stats.items():
            if value.numel() != dim:
                raise ValueError(f"{stats_path}: {feature}.{stat} has {value.numel()} values; the config's "
                                 f"{feature} has {dim}")
    return FeatureNormaliser(mode, stats, float(config.get("eps", 1e-8)))


@dataclass(frozen=True)
class Statistics:
    """The state's normaliser (from the preprocessor) and the action's unnormaliser (from the
    postprocessor)."""

    state: FeatureNormaliser
    action: FeatureNormaliser

    @classmethod
    def load(cls, directory: Path, config: LeRobotConfig) -> Statistics:
        pre_config, pre_stats = _statistics_step(directory / PREPROCESSOR, "normalizer")
        post_config, post_stats = _statistics_step(directory / POSTPROCESSOR, "unnormalizer")
        return cls(_feature(directory / PREPROCESSOR, pre_config, pre_stats, STATE_FEATURE, config.state_dim),
                   _feature(directory / POSTPROCESSOR, post_config, post_stats, ACTION_FEATURE, config.action_dim))


def tokenizer_settings(directory: Path, config: LeRobotConfig) -> dict[str, Any]:
    """The tokenizer step's settings from the preprocessor (name, max_length, padding), falling back
    to the config's fields where the step leaves one out."""
    settings: dict[str, Any] = {"tokenizer_name": config.tokenizer_name, "max_length": config.tokenizer_max_length,
                                "padding": config.pad_language_to if config.type == "smolvla" else "max_length",
                                "padding_side": "right", "truncation": True}
    for step in _steps(directory / PREPROCESSOR):
        if step.get("registry_name") == "tokenizer_processor":
            found = step.get("config") or {}
            settings.update({k: found[k] for k in settings if found.get(k) is not None})
    return settings


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache this process reads (``HF_HUB_CACHE``, else ``HF_HOME``/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return home / "hub"


def pretrained_source(name: str, tokenizer_dir: Path | None, what: str) -> tuple[str, dict[str, Any]]:
    """Where ``from_pretrained`` reads ``name`` from, offline: ``tokenizer_dir`` when given, else the
    hub cache; ValueError saying where it looked when neither holds it."""
    if tokenizer_dir is not None:
        if not tokenizer_dir.is_dir():
            raise ValueError(f"tokenizer_dir {tokenizer_dir}: no such directory")
        return str(tokenizer_dir), {"local_files_only": True}
    cache = hf_cache_dir()
    if not (cache / f"models--{name.replace('/', '--')}").is_dir():
        raise ValueError(f"{what} {name!r} not found: looked in the Hugging Face cache {cache} (offline); "
                         "download it there, or give tokenizer_dir (predict: --tokenizer-dir)")
    return name, {"local_files_only": True, "cache_dir": str(cache)}


def load_tokenizer(name: str, tokenizer_dir: Path | None) -> Any:
    """The text tokenizer published as ``name``, offline (module docstring)."""
    from transformers import AutoTokenizer

    source, kwargs = pretrained_source(name, tokenizer_dir, "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError) as error:
        where = tokenizer_dir if tokenizer_dir is not None else hf_cache_dir()
        raise ValueError(f"tokenizer {name!r}: cannot load it from {where} ({str(error).splitlines()[0]})") from None


def tokenize(tokenizer: Any, instruction: str, settings: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (1, L) int64, mask (1, L) bool) of the task as SmolVLA's and π0's preprocessors make
    them: a newline appended, then the tokenizer step's settings."""
    return tokenize_text(tokenizer, instruction if instruction.endswith("\n") else instruction + "\n", settings)


def tokenize_text(tokenizer: Any, text: str | list[str], settings: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (N, L) int64, mask (N, L) bool) of ``text`` (one prompt or N) as it is, under the
    tokenizer step's settings."""
    encoded = tokenizer(text, max_length=int(settings["max_length"]), truncation=bool(settings["truncation"]),
                        padding=settings["padding"], padding_side=settings["padding_side"], return_tensors="pt")
    return encoded["input_ids"].to(torch.long), encoded["attention_mask"].to(torch.bool)


STATE_BINS = 256
# the bins' lower edges, in float64 (a float32 state is compared with them in float64)
_STATE_EDGES = np.linspace(-1.0, 1.0, STATE_BINS + 1)[:STATE_BINS]


def state_bins(state: torch.Tensor) -> np.ndarray:
    """π0.5's bin of each value of a normalised state (module docstring): how many lower edges
    lie at or below it, minus one."""
    values = np.asarray(state.detach().cpu().to(torch.float32).numpy(), dtype=np.float64)
    return np.searchsorted(_STATE_EDGES, values, side="right") - 1


def state_prompt(task: str, state: torch.Tensor) -> str:
    """π0.5's prompt of a task and its normalised state (S,) (module docstring)."""
    words = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {words}, State: {' '.join(str(int(b)) for b in state_bins(state))};\nAction: "


def image_tensor(image: Any) -> torch.Tensor:
    """(1, 3, H, W) float32 in [0, 1] from an (H, W, 3) uint8 array or LeRobot's (3, H, W) float in [0, 1]."""
    tensor = torch.as_tensor(image)
    if tensor.ndim != 3:
        raise ValueError(f"an image must be H x W x 3 uint8 or 3 x H x W float, got shape {tuple(tensor.shape)}")
    if tensor.dtype == torch.uint8:
        if tensor.shape[-1] != 3:
            raise ValueError(f"a uint8 image must be H x W x 3, got shape {tuple(tensor.shape)}")
        return (tensor.permute(2, 0, 1).to(torch.float32) / 255.0)[None]
    if tensor.shape[0] != 3:
        raise ValueError(f"a float image must be 3 x H x W in [0, 1], got shape {tuple(tensor.shape)}")
    return tensor.to(torch.float32)[None]


def resize_with_pad(image: torch.Tensor, height: int, width: int, *, centred: bool) -> torch.Tensor:
    """(B, 3, h, w) float in [0, 1] resized keeping the aspect ratio (bilinear) and padded with 0 to
    height x width: on the left and top (SmolVLA) or centred (pi0, which also clamps to [0, 1])."""
    h, w = image.shape[2:]
    if (h, w) == (height, width):
        return image
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    resized = F.interpolate(image, size=(new_h, new_w), mode="bilinear", align_corners=False)
    if not centred:
        return F.pad(resized, (max(0, width - new_w), 0, max(0, height - new_h), 0), value=0.0)
    resized = resized.clamp(0.0, 1.0)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    return F.pad(resized, (left, width - new_w - left, top, height - new_h - top), value=0.0)
