"""What a Hugging Face VLA needs besides its weights to act as one of our policies: the prompt, the
action token ids, the action statistics, the image preprocessing, the gripper convention and where
it runs (:class:`VLASpec`), and the action tokenizer that decodes its tokens (:class:`OpenVLAActionTokenizer`).

The defaults are OpenVLA's:

- prompt ``In: What action should the robot take to {instruction}?\\nOut:`` (instruction lower-cased)
  after BOS and the image tokens (an ``{image}`` field in a prompt places them elsewhere; a
  ``{proprio}`` field after the image adds the joints and gripper as binned tokens), then id
  29871 (Llama's "▁") appended when the text vocabulary holds it;
- the action ids are the top 256 of the TEXT vocabulary (``tokenizer.vocab_size``, not the padded
  embedding size): our bin b (0..255) is id ``vocab_size - 1 - b``;
- ``dataset_statistics.json`` beside the weights, ``{key: {"action": {"q01", "q99", "mask"}, ...}}``
  (or ``norm_stats`` in ``config.json``), one key picked by ``unnorm_key``; masked-out dimensions
  (mask false, usually the gripper) are returned normalised, not unnormalised.

:func:`load_spec` reads the image size and mean/std from the processor's files, and then the
overrides of a ``vla_spec.json`` beside the weights (every field of :class:`VLASpec` may be set
there, and ``robot``, the robot record of ``core/robot_record.py``; an unknown key is refused).
Torch-free: nothing here needs more than numpy.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.core.robot_record import ROBOT_KEY
from vla_accel_ros.models.tokenizer import (
    ACTION_DIM,
    BIN_EDGES,
    N_BINS,
    N_CENTRES,
    ActionTokenizer,
    digitise,
)

OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
IMAGE_FIELD = "{image}"  # where a prompt template puts the image tokens (default: first)
# Where a prompt template puts the proprioception tokens (default: none, as in OpenVLA): one token
# per joint and one for the gripper, each the action id of its bin on the dataset's proprio q01/q99.
PROPRIO_FIELD = "{proprio}"
OPENVLA_APPENDED_ID = 29871  # Llama-2's "▁": OpenVLA appends it when the prompt does not end with it
SPEC_FILE = "vla_spec.json"
STATISTICS_FILE = "dataset_statistics.json"
# vla_spec.json keys of an OpenVLA-OFT directory: what its checkpoint does not store (models/oft/spec.py)
CHUNK_KEYS = ("chunk_size", "action_dim", "bounds", "n_images")
CONFIG_FILE = "config.json"
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
RESAMPLE_MODES = ("nearest", "bilinear", "bicubic")
_PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's codes in processor configs


@dataclass(frozen=True)
class VLASpec:
    """Everything :class:`vla_accel_ros.models.hf.hf_vla.HFTokenVLA` reads besides the weights.

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
        (:mod:`vla_accel_ros.models.hf.hf_direct`, the modules' own results, faster on a CPU);
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

    def proprio_bins(self, proprio: np.ndarray, statistics: ActionStatistics) -> np.ndarray:
        """Our bins (n,) int64 of one proprioception vector (joints then gripper): normalised to
        [-1, 1] by the statistics' proprio q01/q99, clipped, and digitised as the actions are.
        ValueError when the statistics have none, or the vector is not finite or of their size."""
        if statistics.proprio_q01 is None or statistics.proprio_q99 is None:
            raise ValueError(f"{statistics.source}: dataset '{statistics.key}' has no proprio q01/q99, which the "
                             f"prompt's '{PROPRIO_FIELD}' field needs")
        values = np.asarray(proprio, dtype=np.float64).reshape(-1)
        low, high = statistics.proprio_q01, statistics.proprio_q99
        if values.shape != low.shape:
            raise ValueError(f"the policy reads {low.size} proprioception values (joints then gripper), "
                             f"got {values.size}")
        if not np.all(np.isfinite(values)):
            raise ValueError("the proprioception (joint positions, gripper) holds NaN or inf")
        span = high - low
        normalised = np.clip(2.0 * (values - low) / np.where(span > 0, span, 1.0) - 1.0, -1.0, 1.0)
        return digitise(np.where(span > 0, normalised, 0.0))

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


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that holds an object; ValueError naming the file otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot be read as JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")  # noqa: TRY004
    return data


def image_settings(directory: Path) -> dict[str, Any]:
    """The image size, mean/std and resampling the model's processor uses: from
    ``preprocessor_config.json`` (or the ``image_processor`` entry of ``processor_config.json``) if
    present, else the vision config's image size (``config.json``) and CLIP's mean/std."""
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
    if "image_size" not in settings and (directory / CONFIG_FILE).is_file():
        vision = read_json_object(directory / CONFIG_FILE).get("vision_config")
        if isinstance(vision, dict) and _is_int(vision.get("image_size")):
            settings["image_size"] = int(vision["image_size"])
    return settings


def load_spec(directory: Path | str) -> VLASpec:
    """The spec of the model in ``directory``: OpenVLA's defaults, the processor's image settings,
    then the overrides of ``vla_spec.json`` if present (unknown keys or bad values: ValueError
    naming the file)."""
    directory = Path(directory)
    values = image_settings(directory)
    path = directory / SPEC_FILE
    if path.is_file():
        overrides = read_json_object(path)
        known = {f.name for f in fields(VLASpec)} | {ROBOT_KEY, *CHUNK_KEYS}
        for key in overrides:
            if key not in known:
                raise ValueError(f"{path}: unknown key '{key}' (known keys: {', '.join(sorted(known))})")
        overrides.pop(ROBOT_KEY, None)  # the robot the model was made for: core/robot_record.py reads it
        for key in CHUNK_KEYS:  # an OFT model's chunk: models/oft/spec.py reads them
            overrides.pop(key, None)
        values |= overrides
    try:
        return VLASpec(**values)
    except ValueError as error:
        source = path if path.is_file() else directory
        raise ValueError(f"{source}: {error}") from None


def with_overrides(spec: VLASpec, **changes: Any) -> VLASpec:
    """``spec`` with the fields in ``changes`` that are not None replaced (and checked)."""
    return replace(spec, **{k: v for k, v in changes.items() if v is not None})


# --- action statistics ------------------------------------------------------------------------
@dataclass(frozen=True)
class ActionStatistics:
    """The action statistics of one dataset: q01/q99/mask (7,), where they came from, and the
    proprioception's q01/q99 (n,) when the file has them (None otherwise)."""

    key: str
    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray
    source: Path
    proprio_q01: np.ndarray | None = None
    proprio_q99: np.ndarray | None = None


def dataset_statistics(directory: Path, file: str, unnorm_key: str | None) -> tuple[Path, str, Any]:
    """Where the statistics were read (``file`` in ``directory``, else ``config.json`` for its
    ``norm_stats``), the dataset ``unnorm_key`` picks (None: the only one) and its entry;
    ValueError naming the file when there are none, or the key is missing or ambiguous."""
    path = directory / file
    if path.is_file():
        table = read_json_object(path)
    elif ((directory / CONFIG_FILE).is_file()
          and isinstance(read_json_object(directory / CONFIG_FILE).get("norm_stats"), dict)):
        path = directory / CONFIG_FILE
        table = read_json_object(path)["norm_stats"]
    else:
        raise ValueError(f"{path}: no action statistics (and no norm_stats in {CONFIG_FILE}); the "
                         "policy's actions cannot be unnormalised without them")
    keys = sorted(table)
    if unnorm_key is None:
        if len(keys) != 1:
            raise ValueError(f"{path}: holds the statistics of {len(keys)} datasets {keys}; "
                             "pick one with unnorm_key")
        unnorm_key = keys[0]
    elif unnorm_key not in table:
        raise ValueError(f"{path}: no dataset '{unnorm_key}' (unnorm_key); it holds {keys}")
    return path, unnorm_key, table[unnorm_key]


def load_action_statistics(directory: Path | str, spec: VLASpec) -> ActionStatistics:
    """The action statistics of ``spec.unnorm_key`` from ``spec.statistics_file`` in ``directory``
    (or, without that file, the ``norm_stats`` of ``config.json``). ValueError naming the file when
    it is missing, the key is missing or ambiguous, or the action is not 7-D."""
    path, key, dataset = dataset_statistics(Path(directory), spec.statistics_file, spec.unnorm_key)
    entry = dataset.get("action") if isinstance(dataset, dict) else None
    if not isinstance(entry, dict) or "q01" not in entry or "q99" not in entry:
        raise ValueError(f"{path}: dataset '{key}' has no action q01/q99")
    try:
        q01 = np.asarray(entry["q01"], dtype=np.float64)
        q99 = np.asarray(entry["q99"], dtype=np.float64)
        mask = np.asarray(entry.get("mask", [True] * q01.size), dtype=bool)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: dataset '{key}' has malformed action statistics ({error})") from None
    for name, value in (("q01", q01), ("q99", q99), ("mask", mask)):
        if value.shape != (ACTION_DIM,):
            raise ValueError(f"{path}: dataset '{key}' has action {name} of shape {value.shape}; "
                             f"this policy's actions are {ACTION_DIM}-D")
    proprio = _proprio_quantiles(dataset.get("proprio"), path, key)
    return ActionStatistics(key=key, q01=q01, q99=q99, mask=mask, source=path,
                            proprio_q01=None if proprio is None else proprio[0],
                            proprio_q99=None if proprio is None else proprio[1])


def _proprio_quantiles(entry: Any, path: Path, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The proprio q01/q99 of a dataset's entry (None without them); ValueError when malformed."""
    if not isinstance(entry, dict) or "q01" not in entry or "q99" not in entry:
        return None
    try:
        q01 = np.asarray(entry["q01"], dtype=np.float64)
        q99 = np.asarray(entry["q99"], dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: dataset '{key}' has malformed proprio statistics ({error})") from None
    if q01.ndim != 1 or q01.shape != q99.shape or not q01.size or not np.all(np.isfinite(q01) & np.isfinite(q99)):
        raise ValueError(f"{path}: dataset '{key}' has proprio q01/q99 of shapes {q01.shape} and {q99.shape}; "
                         "they must be finite vectors of one length")
    return q01, q99


# --- the action tokenizer ---------------------------------------------------------------------
# Each gripper convention (GRIPPER_CONVENTIONS) both ways: ours -> the policy's, and back (unclipped).
_TO_POLICY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "0_1_open_high": lambda g: g,
    "0_1_open_low": lambda g: 1.0 - g,
    "minus1_1_open_high": lambda g: 2.0 * g - 1.0,
    "minus1_1_open_low": lambda g: 1.0 - 2.0 * g,
}
_FROM_POLICY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "0_1_open_high": lambda g: g,
    "0_1_open_low": lambda g: 1.0 - g,
    "minus1_1_open_high": lambda g: (g + 1.0) / 2.0,
    "minus1_1_open_low": lambda g: (1.0 - g) / 2.0,
}


def gripper_to_ours(value: np.ndarray, convention: str) -> np.ndarray:
    """A policy's gripper values in ``convention`` (``GRIPPER_CONVENTIONS``) as ours (1 = open),
    clipped to [0, 1]."""
    return np.clip(_FROM_POLICY[convention](np.asarray(value, dtype=np.float64)), 0.0, 1.0)


class OpenVLAActionTokenizer(ActionTokenizer):
    """:class:`ActionTokenizer` with OpenVLA's mask and a gripper convention: a token (our bin,
    0..254; 255 decodes as 254) decodes to OpenVLA's ``predict_action`` value (bin centre,
    unnormalised with q01/q99 where the mask is true, the normalised centre as is where it is
    false), then the gripper dimension goes through ``gripper`` into our [0, 1] (1 = open).
    ``encode`` is the inverse up to the bin. Unlike the parent, q01 == q99 is allowed (an axis
    the data never moves decodes to q01, as in OpenVLA)."""

    def __init__(self, q01: np.ndarray, q99: np.ndarray, mask: np.ndarray | None = None,
                 gripper: str = "0_1_open_high") -> None:
        # No super().__init__: it refuses q99 <= q01, which OpenVLA's statistics may hold.
        q01 = np.asarray(q01, dtype=np.float64).reshape(-1)
        q99 = np.asarray(q99, dtype=np.float64).reshape(-1)
        mask = np.ones(ACTION_DIM, dtype=bool) if mask is None else np.asarray(mask, dtype=bool).reshape(-1)
        if q01.shape != (ACTION_DIM,) or q99.shape != (ACTION_DIM,) or mask.shape != (ACTION_DIM,):
            raise ValueError(f"q01, q99 and mask must have shape ({ACTION_DIM},), "
                             f"got {q01.shape}, {q99.shape} and {mask.shape}")
        if not (np.all(np.isfinite(q01)) and np.all(np.isfinite(q99))):
            raise ValueError("q01 and q99 must be finite")
        if np.any(mask & (q99 < q01)):
            bad = np.nonzero(mask & (q99 < q01))[0].tolist()
            raise ValueError(f"q99 must not be below q01 in an unnormalised dimension; it is in dims {bad}")
        if gripper not in GRIPPER_CONVENTIONS:
            raise ValueError(f"gripper must be one of {list(GRIPPER_CONVENTIONS)}, got {gripper!r}")
        self.q01, self.q99, self.mask, self.gripper = q01, q99, mask, gripper
        self.edges = BIN_EDGES
        self.centres = (self.edges[:-1] + self.edges[1:]) / 2.0
        self._token_values = self.denormalise(np.repeat(self.centres[:, None], ACTION_DIM, axis=1))
        self._dims = np.arange(ACTION_DIM)
        self._q01, self._q99, self._edges = q01.tolist(), q99.tolist(), self.edges.tolist()
        self._mask = mask.tolist()

    @property
    def bin_width(self) -> np.ndarray:
        """Width of one bin in our action units, per dimension."""
        width = np.where(self.mask, (self.q99 - self.q01) / N_CENTRES, 2.0 / N_CENTRES)
        if self.gripper.startswith("minus1_1"):  # our [0, 1] is half the policy's [-1, 1]
            width[GRIPPER_INDEX] /= 2.0
        return width

    def to_policy_gripper(self, ours: np.ndarray) -> np.ndarray:
        """Our gripper values (1 = open, [0, 1]) in the policy's convention."""
        return _TO_POLICY[self.gripper](np.asarray(ours, dtype=np.float64))

    def from_policy_gripper(self, value: np.ndarray) -> np.ndarray:
        """The policy's gripper values in ours (1 = open), clipped to [0, 1]."""
        return gripper_to_ours(value, self.gripper)

    def normalise(self, values: np.ndarray) -> np.ndarray:
        """Our actions (..., 7) -> the policy's normalised values in [-1, 1]."""
        values = np.array(values, dtype=np.float64)
        values[..., GRIPPER_INDEX] = self.to_policy_gripper(values[..., GRIPPER_INDEX])
        span = self.q99 - self.q01
        scaled = 2.0 * (values - self.q01) / np.where(span > 0, span, 1.0) - 1.0
        scaled = np.where(span > 0, scaled, 0.0)  # a constant axis: any bin decodes to q01
        return np.clip(np.where(self.mask, scaled, values), -1.0, 1.0)

    def unnormalise(self, normalised: np.ndarray) -> np.ndarray:
        """The policy's normalised values (..., 7) -> its own actions, as OpenVLA's ``predict_action``
        returns them: unnormalised where the mask is true, the value as is where it is false."""
        normalised = np.clip(np.asarray(normalised, dtype=np.float64), -1.0, 1.0)
        return np.where(self.mask, 0.5 * (normalised + 1.0) * (self.q99 - self.q01) + self.q01, normalised)

    def denormalise(self, normalised: np.ndarray) -> np.ndarray:
        """The policy's normalised values (..., 7) -> our actions: :meth:`unnormalise`, then the
        gripper convention."""
        actions = self.unnormalise(normalised)
        actions[..., GRIPPER_INDEX] = self.from_policy_gripper(actions[..., GRIPPER_INDEX])
        return actions

    def encode_one(self, action: np.ndarray) -> np.ndarray:
        """:meth:`encode` of one finite action (7,), by the same arithmetic on plain floats."""
        values = np.asarray(action, dtype=np.float64).tolist()
        values[GRIPPER_INDEX] = float(self.to_policy_gripper(np.float64(values[GRIPPER_INDEX])))
        tokens = []
        for value, low, high, masked in zip(values, self._q01, self._q99, self._mask):
            if masked:
                value = 2.0 * (value - low) / (high - low) - 1.0 if high > low else 0.0
            normalised = min(max(value, -1.0), 1.0)
            tokens.append(min(max(bisect.bisect_right(self._edges, normalised) - 1, 0), N_CENTRES - 1))
        return np.array(tokens, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "openvla_bins_masked", "n_bins": N_BINS, "q01": self.q01.tolist(),
                "q99": self.q99.tolist(), "mask": self.mask.tolist(), "gripper": self.gripper}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpenVLAActionTokenizer:
        for key in ("q01", "q99"):
            if key not in data:
                raise ValueError(f"tokenizer entry is missing '{key}'")
        if int(data.get("n_bins", N_BINS)) != N_BINS:
            raise ValueError(f"tokenizer has n_bins={data['n_bins']}, this version supports {N_BINS}")
        return cls(np.asarray(data["q01"]), np.asarray(data["q99"]), data.get("mask"),
                   data.get("gripper", "0_1_open_high"))

    @classmethod
    def from_statistics(cls, statistics: ActionStatistics, gripper: str) -> OpenVLAActionTokenizer:
        return cls(statistics.q01, statistics.q99, statistics.mask, gripper)

    def __repr__(self) -> str:
        return (f"OpenVLAActionTokenizer(q01={np.round(self.q01, 5).tolist()}, q99={np.round(self.q99, 5).tolist()}, "
                f"mask={self.mask.tolist()}, gripper={self.gripper!r})")
