"""The own VLA's configuration (:class:`VLAConfig`): its image and patch sizes, widths and depths,
checked, the sequence lengths that follow from them (``model.json``'s ``config``), and the tensor
shapes they imply (:func:`expected_shapes`). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vla_accel_ros.core.json_config import JsonConfig
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS
from vla_accel_ros.models.weights_check import ExpectedShapes

PROPRIO_DIM = 8


@dataclass(frozen=True)
class VLAConfig(JsonConfig):
    image_size: int = 128
    patch_size: int = 16
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 3  # decoder
    vision_layers: int = 1  # global vision transformer
    mlp_ratio: int = 4
    max_text_len: int = 32
    local_channels: int = 32  # width of the per-patch stem
    keypoints: int = 0  # spatial-softmax keypoints over the stem features (0 = none)
    text_layers: int = 0  # transformer layers over the instruction bytes before FiLM pooling (0 = plain mean)
    draft_mlp_ratio: int = 2
    contact_hidden: int = 64
    n_action_tokens: int = ACTION_DIM
    proprio_dim: int = PROPRIO_DIM

    def __post_init__(self) -> None:
        positive = ("image_size", "patch_size", "d_model", "n_heads", "n_layers", "mlp_ratio", "max_text_len",
                    "local_channels", "draft_mlp_ratio", "contact_hidden", "n_action_tokens", "proprio_dim")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"VLAConfig.{name} must be a positive int, got {value!r}")
        for name in ("vision_layers", "keypoints", "text_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"VLAConfig.{name} must be an int >= 0, got {value!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.patch_size % 4:
            raise ValueError(f"patch_size must be a multiple of 4 (the 4x4 patch stem), got {self.patch_size}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_action_tokens != ACTION_DIM:
            raise ValueError(f"n_action_tokens must be {ACTION_DIM}, got {self.n_action_tokens}")
        if self.proprio_dim != PROPRIO_DIM:
            raise ValueError(f"proprio_dim must be {PROPRIO_DIM}, got {self.proprio_dim}")

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def n_vision_tokens(self) -> int:
        """Vision tokens in the prefix: one per patch, plus the keypoint token when there are keypoints."""
        return self.n_patches + (1 if self.keypoints else 0)

    @property
    def local_width(self) -> int:
        """Width of one patch's local encoding: its token, then per keypoint a log-mass and an (x, y) offset."""
        return self.d_model + 3 * self.keypoints

    @property
    def prefix_len(self) -> int:
        """Decoder positions before the first action token: vision, text, proprio, BOS."""
        return self.n_vision_tokens + self.max_text_len + 2

    @property
    def n_bins(self) -> int:
        """Vocabulary of action bins."""
        return N_BINS

    @property
    def max_len(self) -> int:
        return self.prefix_len + self.n_action_tokens


def expected_shapes(config: VLAConfig, meta_file: Path) -> ExpectedShapes:
    """The shapes of ``model.safetensors``'s target network that ``model.json``'s ``config``
    implies (torch-free, compared with the header before the network is built): each field's
    tensors, and each stack's depth."""
    d, stem = config.d_model, 3 * 4 * 4  # the patch stem: 4x4 RGB patches
    expected = ExpectedShapes(meta_file)
    expected.add("target.pos_emb", (config.max_len, None), "config.image_size/patch_size/max_text_len/keypoints")
    expected.add("target.pos_emb", (None, d), "config.d_model")
    expected.add("target.vision_pos", (config.n_patches, None), "config.image_size/patch_size")
    expected.add("target.patch_encoder.stem.weight", (config.local_channels, stem), "config.local_channels")
    expected.add("target.proprio_proj.weight", (d, config.proprio_dim), "config.d_model")
    for stack, layers, depth_field in (("blocks", config.n_layers, "n_layers"),
                                       ("vision_blocks", config.vision_layers, "vision_layers"),
                                       ("text_blocks", config.text_layers, "text_layers")):
        expected.add_depth(f"target.{stack}.", layers, f"config.{depth_field}")
        for i in range(layers):
            block = f"target.{stack}.{i}."
            expected.add(block + "attn.qkv.weight", (3 * d, d), "config.d_model")
            expected.add(block + "mlp.fc.weight", (config.mlp_ratio * d, None), "config.mlp_ratio")
    if config.text_layers:
        expected.add("target.text_pos", (config.max_text_len, d), "config.max_text_len")
    if config.keypoints:
        expected.add("target.patch_encoder.keypoint_logits.weight", (config.keypoints, config.local_channels),
                     "config.keypoints")
    expected.add("draft.mlp.fc.weight", (config.draft_mlp_ratio * d, d), "config.draft_mlp_ratio", required=False)
    expected.add("contact_head.net.0.weight", (config.contact_hidden, d), "config.contact_hidden", required=False)
    return expected
