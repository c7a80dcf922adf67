"""The settings of every trainer (``vla-accel train``, ``train-flow``, ``train-parallel-draft``,
``train-world``, ``train-hf``, ``train-draft``, ``build-store``) as frozen dataclasses, checked at
construction, and the command line that rebuilds one. Importable without torch: the commands take
their flags' defaults from here, so that ``--help`` answers at once; each trainer module imports its
own config from here.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from vla_accel_ros.models.token_vla.spec import DTYPES, OPENVLA_PROMPT

VISIONS = ("siglip", "clip")
AUTOCAST_DTYPES = ("float32", "bfloat16")  # precision of the training forward
# Where the image tokens go: OpenVLA's (first, so no image token sees the instruction) or after the
# instruction (every image token attends to it, as the built-in policy's FiLM-conditioned encoder does).
# "+proprio" adds the joints and the gripper as binned tokens after the image (vla_spec.PROPRIO_FIELD):
# the arm's own state, which the built-in policy reads too.
PROMPT_LAYOUTS = {"image_first": OPENVLA_PROMPT, "instruction_first": OPENVLA_PROMPT.replace("?\n", "?{image}\n"),
                  "instruction_first+proprio": OPENVLA_PROMPT.replace("?\n", "?{image}{proprio}\n")}
# The action tokens the target consumes while its features are collected: the demo's (one pass a
# step) or its own greedy rollout (seven).
TEACHERS = ("expert", "target")
DEFAULT_DATA = Path("data/demos_v3")  # the clean expert demonstrations


# --- checks and the command line, shared by the configs ----------------------------------------
def check_hyperparameters(cfg: Any, positive: Sequence[str], non_negative: Sequence[str], rates: Sequence[str]) -> None:
    """Reject bad sizes, epoch counts and learning rates of the config dataclass ``cfg`` by field
    name, at construction: a typo on the command line fails before minutes of data loading."""
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    for name in non_negative:
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if any(getattr(cfg, name) <= 0 for name in rates):
        raise ValueError("learning rates must be positive")


def check_data_selection(cfg: Any) -> None:
    """Reject a held-out share outside [0, 1) or a non-positive episode cap (``cfg.val_fraction``,
    ``cfg.max_episodes``): both would leave a split with nothing to train on."""
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {cfg.val_fraction}")
    if cfg.max_episodes is not None and cfg.max_episodes <= 0:
        raise ValueError(f"max_episodes must be positive, got {cfg.max_episodes}")


def command_line(cfg: Any, subcommand: str) -> str:
    """``vla-accel SUBCOMMAND`` with the flags that rebuild the config dataclass ``cfg`` (one flag a
    field; booleans as ``--x`` / ``--no-x``): the required fields always, the others only where they
    differ from the defaults, so the command recorded with a checkpoint stays short and reproduces it."""
    required = [f.name for f in fields(cfg) if f.default is MISSING and f.default_factory is MISSING]
    defaults = type(cfg)(**{name: "" for name in required})
    parts = ["vla-accel", subcommand]
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in required or value != getattr(defaults, f.name):
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                parts.append(flag if value else "--no-" + f.name.replace("_", "-"))
            else:
                parts += [flag, str(value)]
    return shlex.join(parts)


@dataclass(frozen=True)
class TrainConfig:
    data: str
    out: str
    epochs: int = 5
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 100
    grad_clip: float = 1.0
    augment_shift: int = 3  # max random image shift in pixels (0 = off)
    draft_epochs: int = 2
    draft_lr: float = 1e-3
    feature_weight: float = 1.0  # weight of the draft's feature regression next to its token loss
    aux_weight: float = 1.0  # weight of the target's auxiliary cube/TCP position loss (0 = off)
    seed: int = 0
    max_episodes: int | None = None
    val_fraction: float = 0.1
    include_failures: bool = False
    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 4
    vision_layers: int = 1
    max_text_len: int = 32
    patch_size: int = 16
    local_channels: int = 32
    keypoints: int = 16
    text_layers: int = 1
    keypoint_weight: float = 1.0  # weight of the keypoint grounding loss (0 = off)
    init: str | None = None  # checkpoint to fine-tune instead of a fresh model (DAgger rounds)
    eval_batch_size: int = 256
    save_dtype: str = "float32"
    device: str = "cpu"
    threads: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        check_hyperparameters(self, positive=("batch_size", "eval_batch_size", "threads"),
                              non_negative=("epochs", "draft_epochs", "warmup_steps", "augment_shift"),
                              rates=("lr", "draft_lr"))
        check_data_selection(self)

    def command(self) -> str:
        """The ``vla-accel train`` command line that reproduces this run."""
        return command_line(self, "train")


@dataclass(frozen=True)
class FlowTrainConfig:
    checkpoint: str
    data: str
    out: str | None = None  # None = write into the checkpoint directory
    epochs: int = 40
    distill_epochs: int = 20
    batch_size: int = 256
    lr: float = 1e-3
    hidden: int = 256
    layers: int = 3
    student_hidden: int = 0  # 0 = the teacher's width (the student then starts as the teacher)
    horizon: int = 1  # actions per sample: > 1 makes a chunked policy (H consecutive action steps)
    cameras: int = 1  # image slots: 2 reads the demos' wrist images as well as the front camera's
    teacher_from: str | None = None  # a checkpoint whose flow head's teacher is reused (no teacher training)
    method: str = "distilled"  # a LeRobot policy's 2-step sampler: distilled, or two_anchor (the adapter)
    student_from: str | None = None  # a LeRobot policy: continue the 2-step sampler kept in this directory
    seed: int = 0
    val_fraction: float = 0.1
    max_episodes: int | None = None
    threads: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("epochs", "distill_epochs", "batch_size", "hidden", "layers", "threads", "horizon", "cameras"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.student_hidden < 0:
            raise ValueError(f"student_hidden must be >= 0, got {self.student_hidden}")
        if self.cameras > 2:
            raise ValueError(f"cameras must be 1 (front) or 2 (front and wrist), got {self.cameras}")
        if self.method not in ("distilled", "two_anchor"):
            raise ValueError(f"method must be distilled or two_anchor, got {self.method!r}")


@dataclass(frozen=True)
class ParallelDraftTrainConfig:
    checkpoint: str
    data: str
    out: str | None = None  # a new directory: a copy of the checkpoint plus the head
    in_place: bool = False  # write the head into --checkpoint itself (instead of --out)
    epochs: int = 1
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    feature_weight: float = 1.0  # weight of the feature regression next to the token loss
    seed: int = 0
    max_episodes: int | None = None
    val_fraction: float = 0.1
    eval_batch_size: int = 256
    threads: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        check_hyperparameters(self, positive=("batch_size", "eval_batch_size", "threads"),
                              non_negative=("epochs", "warmup_steps", "weight_decay", "feature_weight"),
                              rates=("lr",))
        check_data_selection(self)
        if self.out is not None and self.in_place:
            raise ValueError("give either --out or --in-place, not both")

    def destination(self) -> Path:
        """Where the head goes: ``out``, or the checkpoint itself with ``in_place``. Checked before
        any work, so that a forgotten ``--out`` cannot silently write into the checkpoint."""
        if self.in_place:
            return Path(self.checkpoint)
        if not self.out:
            raise ValueError("--out is required (or --in-place to add the head to --checkpoint itself)")
        if Path(self.out).resolve() == Path(self.checkpoint).resolve():
            raise ValueError("--out is --checkpoint: pass --in-place to write into the checkpoint itself")
        return Path(self.out)

    def command(self) -> str:
        """The ``vla-accel train-parallel-draft`` command line that reproduces this run."""
        return command_line(self, "train-parallel-draft")


@dataclass(frozen=True)
class HFTrainConfig:
    data: str
    out: str
    epochs: int = 4
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 100
    grad_clip: float = 1.0
    augment_shift: int = 0  # max random image shift in pixels (0 = off)
    aux_weight: float = 1.0  # weight of the auxiliary cube/TCP position loss (0 = off)
    keypoint_weight: float = 0.0  # weight of the image tokens' cube/TCP keypoint loss (0 = off)
    seed: int = 0
    max_episodes: int | None = None
    val_fraction: float = 0.1
    include_failures: bool = False
    vision: str = "siglip"
    patch_size: int = 16
    vision_hidden: int = 96
    vision_layers: int = 2
    vision_heads: int = 4
    hidden_size: int = 128
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    text_vocab: int = 448  # ids below the added <image>/<pad>; the top 256 are the action ids
    prompt_layout: str = "image_first"  # one of PROMPT_LAYOUTS; with --init, the model's own is kept
    init: str | None = None  # hf:DIR to fine-tune instead of a fresh model
    dagger_rounds: int = 0
    dagger_episodes: int = 100  # episodes recorded per DAgger round
    dagger_share: float = 0.5  # share of those episodes' steps the model drives
    dagger_seed: int = 20000  # seed of the first DAgger episode (rounds continue from there)
    dagger_epochs: int = 2  # fine-tuning epochs per DAgger round
    dagger_lr: float = 5e-4
    eval_batch_size: int = 128
    save_dtype: str = "float32"
    autocast: str = "float32"  # "bfloat16": the forward's matmuls in bfloat16 (weights and optimizer stay float32)
    threads: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        check_hyperparameters(self, positive=("batch_size", "eval_batch_size", "threads", "patch_size",
                                              "vision_hidden", "hidden_size", "heads", "kv_heads",
                                              "intermediate_size", "dagger_episodes"),
                              non_negative=("epochs", "warmup_steps", "augment_shift", "vision_layers", "layers",
                                            "dagger_rounds", "dagger_epochs", "aux_weight", "keypoint_weight"),
                              rates=("lr", "dagger_lr"))
        check_data_selection(self)
        if self.prompt_layout not in PROMPT_LAYOUTS:
            raise ValueError(f"prompt_layout must be one of {', '.join(PROMPT_LAYOUTS)}, got {self.prompt_layout!r}")
        if self.vision not in VISIONS:
            raise ValueError(f"vision must be one of {', '.join(VISIONS)}, got {self.vision!r}")
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden_size must divide by heads, and heads by kv_heads")
        if self.vision_hidden % self.vision_heads:
            raise ValueError("vision_hidden must divide by vision_heads")
        if not 0.0 < self.dagger_share <= 1.0:
            raise ValueError(f"dagger_share must be in (0, 1], got {self.dagger_share}")
        if self.save_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"save_dtype must be float32, bfloat16 or float16, got {self.save_dtype!r}")
        if self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast must be one of {', '.join(AUTOCAST_DTYPES)}, got {self.autocast!r}")

    def command(self) -> str:
        """The ``vla-accel train-hf`` command line that reproduces this run."""
        return command_line(self, "train-hf")


@dataclass(frozen=True)
class HFDraftTrainConfig:
    checkpoint: str  # DIR (or hf:DIR): the model; the head is written into DIR unless out is given
    data: str
    out: str | None = None  # the head's directory, outside a read-only model (None: DIR)
    epochs: int = 20
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 20
    feature_weight: float = 1.0  # weight of the feature regression next to the token cross-entropy
    teacher: str = "expert"  # the tokens the target consumes while its features are collected (TEACHERS)
    width: int | None = None  # the head's inner width (None: the model's hidden size, at most 1024)
    blocks: int = 2  # residual MLP blocks of the head
    seed: int = 0
    max_episodes: int | None = None
    val_fraction: float = 0.1
    include_failures: bool = False
    unnorm_key: str | None = None  # the action statistics' dataset (None: the file's only one)
    device: str = "cpu"
    dtype: str | None = None  # the model's weights (None: vla_spec.json's, else float32)
    threads: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        check_hyperparameters(self, positive=("batch_size", "blocks", "threads"),
                              non_negative=("epochs", "warmup_steps", "weight_decay", "feature_weight"),
                              rates=("lr",))
        check_data_selection(self)
        if self.width is not None and self.width <= 0:
            raise ValueError(f"width must be positive, got {self.width}")
        if self.teacher not in TEACHERS:
            raise ValueError(f"teacher must be one of {list(TEACHERS)}, got {self.teacher!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")

    def command(self) -> str:
        """The ``vla-accel train-draft`` command line that reproduces this run."""
        return command_line(self, "train-draft")


@dataclass(frozen=True)
class WorldTrainConfig:
    checkpoint: str
    data: str
    out: str
    ae_epochs: int = 10
    bias_epochs: int = 60
    finetune_epochs: int = 4  # target epochs on the biased embeddings
    draft_epochs: int = 2  # draft + contact head epochs after that
    batch_size: int = 64
    lr: float = 1e-3  # autoencoder and bias module
    finetune_lr: float = 3e-4  # peak learning rate of the target and the heads in phase (c)
    latent_channels: int = 8
    width: int = 16
    hidden: int = 64
    head_hidden: int = 64
    latent_l2: float = 1e-3  # keeps the autoencoder's latent near unit scale
    bias_l2: float = 1e-3  # keeps the bias (the perturbation of the target's tokens) small
    scene_weight: float = 0.0  # weight of the scene probe's loss on the bias (contact, cube and TCP); 0 = off
    seed: int = 0
    max_episodes: int | None = None
    val_fraction: float = 0.1
    threads: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        check_hyperparameters(
            self, positive=("batch_size", "latent_channels", "width", "hidden", "head_hidden", "threads"),
            non_negative=("ae_epochs", "bias_epochs", "finetune_epochs", "draft_epochs"), rates=("lr", "finetune_lr"),
        )
        if self.bias_l2 < 0 or self.latent_l2 < 0 or self.scene_weight < 0:
            raise ValueError(f"bias_l2, latent_l2 and scene_weight must be >= 0, got {self.bias_l2}, "
                             f"{self.latent_l2}, {self.scene_weight}")
        check_data_selection(self)

    def command(self) -> str:
        """The ``vla-accel train-world`` command line that reproduces this run."""
        return command_line(self, "train-world")


@dataclass(frozen=True)
class BuildStoreConfig:
    checkpoint: str
    data: str
    out: str | None = None  # None = CHECKPOINT/retrieval_store
    max_episodes: int | None = None
    stride: int = 1
    holdout_episodes: int = 8
    horizon: int = 4
    index: str = "auto"
    threads: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        if self.stride < 1:
            raise ValueError(f"--stride must be >= 1, got {self.stride}")
        if self.max_episodes is not None and self.max_episodes < 1:
            raise ValueError(f"--max-episodes must be >= 1, got {self.max_episodes}")
        if self.holdout_episodes < 0:
            raise ValueError(f"--holdout-episodes must be >= 0, got {self.holdout_episodes}")
        if self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        from vla_accel_ros.decoding.retrieval import RetrievalStoreConfig  # torch: only when a store is built

        RetrievalStoreConfig(horizon=self.horizon, index=self.index)  # validates both


@dataclass(frozen=True)
class SmolVLATrainConfig:
    data: str
    out: str
    vlm_from: str  # a Hugging Face VLA in Llava's layout (``vla-accel train-hf``): its vision tower and text layers
    vlm_layers: int = 3  # the first N text layers of vlm_from (SmolVLA keeps the first half of SmolVLM2's)
    scale_factor: int = 2  # the connector's pixel shuffle: image tokens per camera = (patches per side / s)^2
    chunk_size: int = 8
    epochs: int = 6
    batch_size: int = 64
    noise_samples: int = 4  # flow (noise, time) draws per prefix: the expert is cheap beside the prefix
    lr: float = 1e-3
    vlm_lr_scale: float = 0.3  # the text layers start trained: a smaller step for them
    aux_weight: float = 1.0  # where the named cube is, from the state token at the last layer's input (training aid)
    state_dropout: float = 0.3  # share of samples whose state is zeroed: the scene, not the arm's motion, must lead
    keypoint_weight: float = 1.0  # the front camera's tokens place the named cube and the gripper (a training aid)
    init: str | None = None  # a policy written by train-smolvla to start from
    tokenizer_max_length: int = 16
    seed: int = 0
    val_fraction: float = 0.1
    max_episodes: int | None = None
    threads: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("vlm_layers", "scale_factor", "chunk_size", "epochs", "batch_size", "noise_samples", "threads",
                     "tokenizer_max_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.state_dropout < 1.0:
            raise ValueError(f"state_dropout must be in [0, 1), got {self.state_dropout}")
        if self.lr <= 0 or min(self.vlm_lr_scale, self.aux_weight, self.keypoint_weight) < 0:
            raise ValueError(f"lr must be positive, vlm_lr_scale, aux_weight and keypoint_weight >= 0, got {self.lr}, "
                             f"{self.vlm_lr_scale}, {self.aux_weight}, {self.keypoint_weight}")
