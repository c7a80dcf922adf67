"""What a token VLA needs besides its weights to act as one of our policies: the prompt, the action
token ids, where its action statistics lie, the image preprocessing, the gripper convention and
where it runs (:class:`VLASpec`). The statistics themselves and the action tokenizer made of them
are :mod:`.statistics`'.

The defaults are OpenVLA's:

- prompt ``In: What action should the robot take to {instruction}?\\nOut:`` (instruction lower-cased)
  after BOS and the image tokens (an ``{image}`` field in a prompt places them elsewhere; a
  ``{proprio}`` field after the image adds the joints and gripper as binned tokens), then id
  29871 (Llama's "▁") appended when the text vocabulary holds it;
- the action ids are the top 256 of the TEXT vocabulary (``tokenizer.vocab_size``, not the padded
  embedding size): our bin b (0..255) is id ``vocab_size - 1 - b``;
- ``dataset_statistics.json`` beside the weights (or ``norm_stats`` in ``config.json``), one key
  picked by ``unnorm_key`` (:mod:`.statistics`).

:func:`load_spec` reads the image size and mean/std from the processor's files, and then the
overrides of a ``vla_spec.json`` beside the weights (every field of :class:`VLASpec` may be set
there, and ``robot``, the robot record of ``core/robot_record.py``, and how the model runs unless the
user sets it: ``temperature``, ``kinematic_r_bounds``, ``kf_fill_check``, read by
:func:`~vla_accel_ros.models.configuration.declared_run_defaults`; an unknown key is refused).
Every function that may read ``config.json`` takes it already parsed (``config``; None: read it
here). Torch-free: nothing here needs more than numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.robot_record import ROBOT_KEY
from vla_accel_ros.models.configuration import RUN_DEFAULT_KEYS
from vla_accel_ros.models.files import read_config, read_json_object
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS

OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
IMAGE_FIELD = "{image}"  # where a prompt template puts the image tokens (default: first)
# Where a prompt template puts the proprioception tokens (default: none, as in OpenVLA): one token
# per joint and one for the gripper, each the action id of its bin on the dataset's proprio q01/q99.
PROPRIO_FIELD = "{proprio}"
OPENVLA_APPENDED_ID = 29871  # Llama-2's "▁": OpenVLA appends it when the prompt does not end with it
SPEC_FILE = "vla_spec.json"
STATISTICS_FILE = "dataset_statistics.json"
# vla_spec.json keys of an OpenVLA-OFT directory: what its checkpoint does not store (models/oft/config.py)
CHUNK_KEYS = ("chunk_size", "action_dim", "bounds", "n_images")
# The processor's image settings: the legacy file, then the processor file that nests them.
PREPROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_IMAGE_SIZE = 224
GRIPPER_INDEX = ACTION_DIM - 1
# How the policy's gripper value g maps to ours (1 = open, 0 = closed, in [0, 1]):
#   "0_1_open_high":      g in [0, 1], 1 = open   -> g         (OpenVLA's OXE and LIBERO data)
#   "0_1_open_low":       g in [0, 1], 1 = closed -> 1 - g
#   "minus1_1_open_high": g in [-1, 1], +1 = open -> (g + 1) / 2
#   "minus1_1_open_low":  g in [-1, 1], -1 = open -> (1 - g) / 2   (LIBERO's own action space)
# each clipped to [0, 1]. The default is OpenVLA's own: its data pipelines (OXE, and LIBERO as
# OpenVLA prepares it) keep the gripper in [0, 1] with 1 = open and masked out of normalisation, so
# the decoded value is already ours; a fine-tune with another convention names it in vla_spec.json.
GRIPPER_CONVENTIONS = ("0_1_open_high", "0_1_open_low", "minus1_1_open_high", "minus1_1_open_low")
DTYPES = ("float32", "bfloat16", "float16")
GPU_DTYPE = "bfloat16"  # a token VLA's dtype on a GPU unless one is asked for (on the CPU: float32)
RESAMPLE_MODES = ("nearest", "bilinear", "bicubic")
_PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's codes in processor configs


@dataclass(frozen=True)
class VLASpec:
    """Everything :class:`vla_accel_ros.models.token_vla.policy.HFTokenVLA` reads besides the weights.

    prompt: template with one ``{instruction}`` field and at most one ``{image}`` field, where the
        image tokens go (without one they come first, after BOS: OpenVLA's layout; a template that
        puts the image after the instruction lets every image token attend to it), and at most one
        ``{proprio}`` field after the image (so a prefill that reuses image rows recomputes it
        with the text): the joints and the gripper, each binned on the statistics' proprio
        q01/q99 and written as that bin's action id;
        lowercase_instruction: lower-case the instruction first.
    appended_ids: ids after the prompt (unless it already ends with them); None = OpenVLA's rule,
        (29871,) when the text vocabulary holds id 29871, else none.
    action_id_first / action_id_step: our bin b is HF id ``first + step * b``; first None =
        ``vocab_size - 1`` (with step -1: OpenVLA's top-of-vocabulary rule).
    statistics_file / unnorm_key: the action statistics and the dataset key in them (None: the
        file's only key).
    image_size, image_mean, image_std, resample: the image is resized to image_size squared
        (``resample``, antialiased), scaled to [0, 1], then normalised per channel.
    gripper: one of ``GRIPPER_CONVENTIONS`` (see there), the policy's gripper value -> ours.
    device / dtype: where the model runs and its weights' dtype (one of ``DTYPES``).
    direct_forward: run a supported model (a SigLIP tower and a Llama text model) op by op
        (:mod:`vla_accel_ros.models.hf.direct`, the modules' own results, faster on a CPU);
        false = through transformers' modules.
    """

    prompt: str = OPENVLA_PROMPT
    lowercase_instruction: bool = True
    appended_ids: tuple[int, ...] | None = None
    action_id_first: int | None = None
    action_id_step: int = -1
    statistics_file: str = STATISTICS_FILE
    unnorm_key: str | None = None
    image_size: int = DEFAULT_IMAGE_SIZE
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    resample: str = "bicubic"
    gripper: str = "0_1_open_high"
    device: str = "cpu"
    dtype: str = "float32"
    direct_forward: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or self.prompt.count("{instruction}") != 1:
            raise ValueError(f"prompt must be a string with one '{{instruction}}' field, got {self.prompt!r}")
        for field in (IMAGE_FIELD, PROPRIO_FIELD):
            if self.prompt.count(field) > 1:
                raise ValueError(f"prompt may hold at most one '{field}' field, got {self.prompt!r}")
        if self.reads_proprio and self.prompt.find(PROPRIO_FIELD) < self.prompt.find(IMAGE_FIELD):
            raise ValueError(f"the prompt's '{PROPRIO_FIELD}' field must come after its '{IMAGE_FIELD}' field, "
                             f"got {self.prompt!r}")
        try:
            self.prompt.format(instruction="", image="", proprio="")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"prompt {self.prompt!r} is not a valid template ({error!r}); "
                             "write a literal brace as '{{' or '}}'") from None
        _check_type("lowercase_instruction", self.lowercase_instruction, bool)
        _check_type("direct_forward", self.direct_forward, bool)
        if self.appended_ids is not None:
            ids = tuple(self.appended_ids) if isinstance(self.appended_ids, (list, tuple)) else None
            if ids is None or not all(_is_int(i) and i >= 0 for i in ids):
                raise ValueError(f"appended_ids must be a list of token ids >= 0, got {self.appended_ids!r}")
            object.__setattr__(self, "appended_ids", ids)
        if self.action_id_first is not None and not (_is_int(self.action_id_first) and self.action_id_first >= 0):
            raise ValueError(f"action_id_first must be a token id >= 0 or null, got {self.action_id_first!r}")
        if self.action_id_step not in (-1, 1) or not _is_int(self.action_id_step):
            raise ValueError(f"action_id_step must be -1 or 1, got {self.action_id_step!r}")
        _check_type("statistics_file", self.statistics_file, str)
        if self.unnorm_key is not None:
            _check_type("unnorm_key", self.unnorm_key, str)
        if not (_is_int(self.image_size) and self.image_size > 0):
            raise ValueError(f"image_size must be a positive integer, got {self.image_size!r}")
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if not (isinstance(value, (list, tuple)) and len(value) == 3
                    and all(_is_number(v) and np.isfinite(v) for v in value)):
                raise ValueError(f"{name} must be 3 finite numbers (R, G, B), got {value!r}")
            object.__setattr__(self, name, tuple(float(v) for v in value))
        if min(self.image_std) <= 0:
            raise ValueError(f"image_std must be positive, got {self.image_std}")
        for name, allowed in (("resample", RESAMPLE_MODES), ("gripper", GRIPPER_CONVENTIONS), ("dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        _check_type("device", self.device, str)

    @property
    def reads_proprio(self) -> bool:
        """Whether the prompt holds the proprioception tokens."""
        return PROPRIO_FIELD in self.prompt

    def format_prompt(self, instruction: str) -> tuple[str, str, str]:
        """The prompt text of one instruction before the image tokens, between them and the
        proprioception tokens, and after those (no BOS, no image or proprioception tokens, no
        appended ids); the first is empty in OpenVLA's layout (image first), the last without a
        ``{proprio}`` field."""
        text = instruction.lower() if self.lowercase_instruction else instruction
        before, _, after = self.prompt.rpartition(IMAGE_FIELD)
        middle, _, tail = after.partition(PROPRIO_FIELD)
        return tuple(part.format(instruction=text, image="", proprio="") for part in (before, middle, tail))  # type: ignore[return-value]

    def resolved_appended_ids(self, vocab_size: int) -> tuple[int, ...]:
        """The ids appended after the prompt for a text vocabulary of ``vocab_size`` tokens."""
        if self.appended_ids is not None:
            return self.appended_ids
        return (OPENVLA_APPENDED_ID,) if vocab_size > OPENVLA_APPENDED_ID else ()

    def action_ids(self, vocab_size: int) -> np.ndarray:
        """(256,) int64: the HF id of each of our bins, for a text vocabulary of ``vocab_size``
        tokens; ValueError when the vocabulary cannot hold them."""
        if vocab_size < N_BINS:
            raise ValueError(f"a text vocabulary of {vocab_size} tokens is too small for {N_BINS} action ids")
        first = vocab_size - 1 if self.action_id_first is None else self.action_id_first
        ids = first + self.action_id_step * np.arange(N_BINS, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"action ids {int(ids.min())}..{int(ids.max())} (action_id_first={first}, "
                             f"action_id_step={self.action_id_step}) leave the text vocabulary of {vocab_size} tokens")
        return ids


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def _check_type(name: str, value: Any, kind: type) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{name} must be a {kind.__name__}, got {value!r}")  # noqa: TRY004 (a bad file value)


def image_settings(directory: Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The image size, mean/std and resampling the model's processor uses: from
    ``preprocessor_config.json`` (or the ``image_processor`` entry of ``processor_config.json``) if
    present, else the vision config's image size (``config.json``, or ``config`` as parsed) and
    CLIP's mean/std."""
    settings: dict[str, Any] = {}
    processor: dict[str, Any] | None = None
    if (directory / PREPROCESSOR_FILE).is_file():
        processor = read_json_object(directory / PREPROCESSOR_FILE)
    elif (directory / PROCESSOR_FILE).is_file():
        nested = read_json_object(directory / PROCESSOR_FILE).get("image_processor")
        processor = nested if isinstance(nested, dict) else None
    if processor is not None:
        size = processor.get("crop_size") if processor.get("do_center_crop", True) else None
        size = size or processor.get("size")
        if isinstance(size, dict):
            size = size.get("height", size.get("shortest_edge"))
        if _is_int(size):
            settings["image_size"] = int(size)
        if processor.get("do_normalize", True):
            for key in ("image_mean", "image_std"):
                if isinstance(processor.get(key), list):
                    settings[key] = tuple(processor[key])
        else:
            settings |= {"image_mean": (0.0, 0.0, 0.0), "image_std": (1.0, 1.0, 1.0)}
        if processor.get("resample") in _PIL_RESAMPLE:
            settings["resample"] = _PIL_RESAMPLE[processor["resample"]]
    if "image_size" not in settings:
        vision = (parsed_config(directory, config) or {}).get("vision_config")
        if isinstance(vision, dict) and _is_int(vision.get("image_size")):
            settings["image_size"] = int(vision["image_size"])
    return settings


def parsed_config(directory: Path, config: dict[str, Any] | None) -> dict[str, Any] | None:
    """``config`` when the caller parsed ``config.json`` already, else the directory's (None: none)."""
    return config if config is not None else read_config(directory)


def load_spec(directory: Path | str, config: dict[str, Any] | None = None) -> VLASpec:
    """The spec of the model in ``directory``: OpenVLA's defaults, the processor's image settings,
    then the overrides of ``vla_spec.json`` if present (unknown keys or bad values: ValueError
    naming the file). ``config``: its ``config.json`` as parsed (None: read when needed)."""
    directory = Path(directory)
    values = image_settings(directory, config)
    path = directory / SPEC_FILE
    if path.is_file():
        overrides = read_json_object(path)
        known = {f.name for f in fields(VLASpec)} | {ROBOT_KEY, *CHUNK_KEYS, *RUN_DEFAULT_KEYS}
        for key in overrides:
            if key not in known:
                raise ValueError(f"{path}: unknown key '{key}' (known keys: {', '.join(sorted(known))})")
        overrides.pop(ROBOT_KEY, None)  # the robot the model was made for: core/robot_record.py reads it
        for key in (*CHUNK_KEYS, *RUN_DEFAULT_KEYS):  # read elsewhere: models/oft/config.py, configuration.py
            overrides.pop(key, None)
        values |= overrides
    try:
        return VLASpec(**values)
    except ValueError as error:
        source = path if path.is_file() else directory
        raise ValueError(f"{source}: {error}") from None


def default_dtype(directory: Path | str, device: str | None, cpu_default: str) -> str:
    """The dtype a token VLA in ``directory`` loads in when none is asked for: its ``vla_spec.json``'s,
    else ``GPU_DTYPE`` on a GPU (``device``, else ``vla_spec.json``'s) and ``cpu_default`` on the CPU."""
    path = Path(directory) / SPEC_FILE
    declared = read_json_object(path) if path.is_file() else {}
    if declared.get("dtype"):
        return str(declared["dtype"])
    where = device or declared.get("device") or "cpu"
    return GPU_DTYPE if str(where).startswith("cuda") else cpu_default


def with_overrides(spec: VLASpec, **changes: Any) -> VLASpec:
    """``spec`` with the fields in ``changes`` that are not None replaced (and checked)."""
    return replace(spec, **{k: v for k, v in changes.items() if v is not None})
