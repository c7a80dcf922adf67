"""The token VLAs at their published shapes with random weights, made directly on the device (no
checkpoint is read or written): what ``vla-accel cost`` times for ``openvla``, ``oft`` and ``hf``.

- ``openvla``: openvla-7b: DINOv2 ViT-L/14 with 4 registers (1024 wide, 24 blocks) and SigLIP
  so400m/14 (1152 wide, 27 blocks) at 224 px, the fused 3-layer GELU projector, Llama-2-7B (4096
  wide, 32 layers, 32 heads, MLP 11008, 32000 + 64 vocabulary rows), OpenVLA's processor and prompt;
- ``oft``: OpenVLA-OFT as fine-tuned for LIBERO: the same backbone, two images (third person and
  wrist), a state of 8 through the proprio projector, the L1 MLP-ResNet head (4096 wide, 2 blocks)
  over a chunk of 8 actions of 7 values, one bidirectional pass;
- ``hf``: a Llava-style VLA of the same size: the SigLIP so400m/14 tower at 224 px (its 256 patch
  features), Llava's 2-layer projector and the same Llama.

``layers`` keeps that many of the Llama's layers (the towers stay whole). The text tokenizer is a
Llama-style BPE vocabulary of 32000 ids built in memory (the action ids its top 256, OpenVLA's
prompt words whole tokens), so prompts are as long as OpenVLA's. Matrices are drawn from
N(0, 1/fan-in), norms set to one, so that activations stay finite through the stack.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_accel_ros.models.openvla.config import DINOV2_L_REG4, PIL_BICUBIC, SIGLIP_SO400M, ImageProcessing
from vla_accel_ros.models.openvla.vision import TowerConfig
from vla_accel_ros.models.tokenizer import ACTION_DIM

TOKEN_FAMILIES = ("openvla", "oft", "hf")
TEXT_VOCAB = 32000
PADDED_VOCAB = 32064  # OpenVLA pads the embedding rows to a multiple of 64
LLAMA_2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6}
IMAGE_SIZE = 224
PATCH = 14
DINO_TOWER = TowerConfig(width=1024, depth=24, heads=1024 // DINOV2_L_REG4.head_width, mlp_width=4096,
                         patch_size=PATCH, image_size=IMAGE_SIZE, prefix_tokens=DINOV2_L_REG4.prefix_tokens,
                         layer_scale=DINOV2_L_REG4.layer_scale)
SIGLIP_TOWER = TowerConfig(width=1152, depth=27, heads=1152 // SIGLIP_SO400M.head_width, mlp_width=4304,
                           patch_size=PATCH, image_size=IMAGE_SIZE, prefix_tokens=SIGLIP_SO400M.prefix_tokens,
                           layer_scale=SIGLIP_SO400M.layer_scale)
# openvla-7b's preprocessor_config.json: DINOv2's ImageNet mean/std (bfloat16-rounded as stored), SigLIP's 0.5
OPENVLA_PROCESSING = ImageProcessing(size=IMAGE_SIZE, resample=PIL_BICUBIC,
                                     means=((0.484375, 0.455078125, 0.40625), (0.5, 0.5, 0.5)),
                                     stds=((0.228515625, 0.2236328125, 0.224609375), (0.5, 0.5, 0.5)))


@dataclass(frozen=True)
class TokenVLAShape:
    """A token VLA's sizes: the Llama's ``LlamaConfig`` arguments and the two towers (OpenVLA's
    DINOv2 and SigLIP; a Llava-style VLA takes the SigLIP one), whose image size is the model's."""

    llama: dict[str, float] = field(default_factory=lambda: dict(LLAMA_2_7B))
    towers: tuple[TowerConfig, TowerConfig] = (DINO_TOWER, SIGLIP_TOWER)

    @property
    def image_size(self) -> int:
        return self.towers[0].image_size


OPENVLA_7B = TokenVLAShape()
OFT_CHUNK, OFT_IMAGES, OFT_STATE, OFT_HEAD_BLOCKS = 8, 2, 8, 2
SOURCE = "<{family} published shape, random weights>"


@dataclass(frozen=True)
class PublishedModel:
    """A policy at a published shape: the policy, the Llama layers built and at the real depth, and
    the modules whose weights its passes read (for the weight bytes)."""

    policy: Any
    layers_built: int
    layers_real: int
    modules: list[torch.nn.Module]


@contextmanager
def made_on(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Modules built inside are made on ``device`` in ``dtype`` (no copy through the CPU), their
    parameters left unset (:func:`randomise` draws them once)."""
    from transformers.initialization import no_init_weights

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), no_init_weights():
            yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def randomise(module: torch.nn.Module, seed: int = 0) -> None:
    """Matrices from N(0, 1/fan-in), norm weights one, other vectors N(0, 0.02), LayerScale 0.1,
    drawn on the parameters' own device."""
    generator = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    for name, parameter in module.named_parameters():
        if parameter.dim() >= 2:
            fan_in = math.prod(parameter.shape[1:])
            parameter.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=generator)
        elif name.endswith(("gamma", "scale_factor")):
            parameter.fill_(0.1)
        elif "norm" in name and name.endswith("weight"):
            parameter.fill_(1.0)
        else:
            parameter.normal_(0.0, 0.02, generator=generator)


def text_tokenizer(image_token: str | None) -> Any:
    """The 32000-id Llama-style tokenizer (module docstring): pad ``<PAD>`` at 32000 (OpenVLA's
    image-token id), or with ``image_token`` also that token above it (Llava's)."""
    from transformers import LlamaTokenizer

    from vla_accel_ros.training.hf_vla import build_vocabulary

    vocab, merges = build_vocabulary(TEXT_VOCAB)
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges)
    specials: dict[str, Any] = {"pad_token": "<PAD>"}
    if image_token is not None:
        specials["additional_special_tokens"] = [image_token]
    tokenizer.add_special_tokens(specials)
    return tokenizer


def llama_config(shape: TokenVLAShape, layers: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**(shape.llama | {"num_hidden_layers": layers}), vocab_size=PADDED_VOCAB, bos_token_id=1,
                       eos_token_id=2, pad_token_id=TEXT_VOCAB, attn_implementation="sdpa")


def action_statistics(family: str) -> Any:
    """Statistics of one made-up dataset (the bins' values do not change a pass's cost)."""
    from vla_accel_ros.models.token_vla.statistics import ActionStatistics

    q01 = np.array([-0.02] * 6 + [0.0])
    q99 = np.array([0.02] * 6 + [1.0])
    return ActionStatistics("random", q01, q99, np.array([True] * 6 + [False]), Path(SOURCE.format(family=family)))


def build(family: str, layers: int, device: torch.device, dtype: torch.dtype,
          shape: TokenVLAShape = OPENVLA_7B) -> PublishedModel:
    """The ``family``'s policy at ``shape`` (the published one unless given) with ``layers`` Llama
    layers (0: all of them)."""
    if family not in TOKEN_FAMILIES:
        raise ValueError(f"family {family!r}: the published shapes here are {', '.join(TOKEN_FAMILIES)}")
    real = int(shape.llama["num_hidden_layers"])
    built = layers or real
    if not 1 <= built <= real:
        raise ValueError(f"--layers must be between 1 and {real} (0: all), got {layers}")
    if family == "hf":
        return _llava(shape, built, real, device, dtype)
    return _openvla(family, shape, built, real, device, dtype)


def _openvla(family: str, shape: TokenVLAShape, built: int, real: int, device: torch.device,
             dtype: torch.dtype) -> PublishedModel:
    from transformers import LlamaForCausalLM

    from vla_accel_ros.models.openvla.modules import OpenVLAModel, OpenVLAModules
    from vla_accel_ros.models.openvla.vision import FusedVisionBackbone
    from vla_accel_ros.models.token_vla.spec import VLASpec
    from vla_accel_ros.models.token_vla.statistics import OpenVLAActionTokenizer

    tokenizer = text_tokenizer(None)
    text = llama_config(shape, built)
    processing = replace(OPENVLA_PROCESSING, size=shape.image_size)
    with made_on(device, dtype):
        model = OpenVLAModel(FusedVisionBackbone(list(shape.towers), text.hidden_size, True),
                             LlamaForCausalLM(text))
        randomise(model)
        model.requires_grad_(False).eval()
        modules = OpenVLAModules(model, processing, image_token_id=int(tokenizer.pad_token_id))
        source = SOURCE.format(family=family)
        spec = VLASpec(image_size=shape.image_size, device=str(device), dtype=str(dtype).removeprefix("torch."))
        statistics = action_statistics(family)
        if family == "openvla":
            from vla_accel_ros.models.openvla.policy import OpenVLAPolicy

            action_tokenizer = OpenVLAActionTokenizer(statistics.q01, statistics.q99, statistics.mask)
            policy: Any = OpenVLAPolicy(modules, tokenizer, spec, action_tokenizer, source=source,
                                        statistics=statistics)
            return PublishedModel(policy, built, real, [model])
        from vla_accel_ros.models.oft.config import ChunkSpec, ChunkStatistics
        from vla_accel_ros.models.oft.modules import HeadShape, L1ActionHead, ProprioProjector
        from vla_accel_ros.models.oft.policy import OFTPolicy

        width = int(text.hidden_size)
        head = L1ActionHead(HeadShape(action_dim=ACTION_DIM, width=width, hidden=width, blocks=OFT_HEAD_BLOCKS))
        projector = ProprioProjector(OFT_STATE, width)
        for part in (head, projector):
            randomise(part)
            part.requires_grad_(False).eval()
    ones = np.ones(ACTION_DIM)
    chunk_statistics = ChunkStatistics("random", -ones, ones, np.ones(ACTION_DIM, dtype=bool), Path(source),
                                       -np.ones(OFT_STATE), np.ones(OFT_STATE), np.ones(OFT_STATE, dtype=bool))
    chunk = ChunkSpec(OFT_CHUNK, ACTION_DIM, n_images=OFT_IMAGES)
    policy = OFTPolicy(modules, tokenizer, spec, chunk, chunk_statistics, head, projector, source=source)
    return PublishedModel(policy, built, real, [model, head, projector])


def _llava(shape: TokenVLAShape, built: int, real: int, device: torch.device, dtype: torch.dtype) -> PublishedModel:
    from transformers import LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

    from vla_accel_ros.models.hf.policy import HFPolicy
    from vla_accel_ros.models.token_vla.spec import VLASpec
    from vla_accel_ros.models.token_vla.statistics import OpenVLAActionTokenizer

    tokenizer = text_tokenizer("<image>")
    siglip = shape.towers[1]
    tower = SiglipVisionConfig(hidden_size=siglip.width, intermediate_size=siglip.mlp_width,
                               num_hidden_layers=siglip.depth, num_attention_heads=siglip.heads,
                               image_size=siglip.image_size, patch_size=siglip.patch_size, vision_use_head=False)
    text = llama_config(shape, built)
    text.vocab_size = max(PADDED_VOCAB, len(tokenizer))
    config = LlavaConfig(vision_config=tower, text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         image_seq_length=siglip.n_patches, vision_feature_select_strategy="full",
                         vision_feature_layer=-1)
    with made_on(device, dtype):
        model = LlavaForConditionalGeneration(config)
        randomise(model)
        model.requires_grad_(False).eval()
    spec = VLASpec(image_size=siglip.image_size, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
                   device=str(device), dtype=str(dtype).removeprefix("torch."))
    statistics = action_statistics("hf")
    action_tokenizer = OpenVLAActionTokenizer(statistics.q01, statistics.q99, statistics.mask)
    policy = HFPolicy.from_model(model, tokenizer, spec, action_tokenizer, device=device,
                                 source=SOURCE.format(family="hf"), statistics=statistics)
    return PublishedModel(policy, built, real, [model])
