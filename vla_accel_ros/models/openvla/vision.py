"""OpenVLA's vision backbone and projector, written out: two ViT towers (DINOv2 with registers and
SigLIP), each read at its second-to-last block, their patch features concatenated per patch, and
the MLP that projects them into the language model's width.

The arithmetic is timm's ``VisionTransformer`` as OpenVLA runs it (``get_intermediate_layers`` at
block ``depth - 2``, no final norm, prefix tokens dropped):

- patch embedding: a convolution with stride = kernel = patch size;
- DINOv2 with registers adds its position embedding to the patches only, then puts the class and
  the 4 register tokens in front; SigLIP has no prefix tokens and adds its position embedding to
  the patches;
- pre-norm blocks: ``x + ls1(attn(norm1(x)))``, ``x + ls2(mlp(norm2(x)))``, LayerNorm eps 1e-6,
  fused qkv with bias, exact GELU; LayerScale (``ls1``/``ls2``) in DINOv2 only.

Only the blocks whose output is read are built: the last block, the final norm and SigLIP's
attention-pool head are in the checkpoint but never run.

:meth:`FusedVisionBackbone.tower_pass` runs the towers on some of the patches only, attending in
every layer to the keys and values an earlier pass left for the others (the incremental prefill's
tower reuse, :mod:`vla_accel_ros.models.token_vla.incremental`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.models.token_vla.cache import TowerCache

LAYER_NORM_EPS = 1e-6


@dataclass(frozen=True)
class TowerConfig:
    """One ViT tower. ``depth``: blocks in the checkpoint (the output read is block ``depth - 2``'s);
    ``prefix_tokens``: class + register tokens in front of the patches; ``layer_scale``: blocks scale
    their branches (DINOv2); ``image_size``: the square input side."""

    width: int
    depth: int
    heads: int
    mlp_width: int
    patch_size: int
    image_size: int
    prefix_tokens: int = 0
    layer_scale: bool = False

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.grid ** 2

    @property
    def blocks_run(self) -> int:
        """Blocks that run: up to and including block ``depth - 2``."""
        return self.depth - 1


class LayerScale(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values (B, heads, N, head_dim) of x (B, N, width)."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def output(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, _, n, _ = q.shape
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, config: TowerConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width, eps=LAYER_NORM_EPS)
        self.attn = Attention(config.width, config.heads)
        self.norm2 = nn.LayerNorm(config.width, eps=LAYER_NORM_EPS)
        self.mlp = MLP(config.width, config.mlp_width)
        self.ls1 = LayerScale(config.width) if config.layer_scale else nn.Identity()
        self.ls2 = LayerScale(config.width) if config.layer_scale else nn.Identity()

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
                rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The block over tokens x (B, n, width); its keys and values (B, heads, N, head_dim) are
        returned. With ``keys``/``values`` of every token from an earlier pass, x holds only the
        tokens ``rows`` (n of N): theirs replace those rows, the others' are attended to as cached."""
        q, k, v = self.attn.qkv_heads(self.norm1(x))
        if keys is not None and values is not None and rows is not None:
            k, v = keys.index_copy(2, rows, k), values.index_copy(2, rows, v)
        x = x + self.ls1(self.attn.output(q, k, v))
        x = x + self.ls2(self.mlp(self.norm2(x)))
        return x, k, v


class VisionTower(nn.Module):
    """One ViT tower read at its second-to-last block (module docstring)."""

    def __init__(self, config: TowerConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = nn.Conv2d(3, config.width, config.patch_size, stride=config.patch_size)
        if config.prefix_tokens:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, config.width))
            self.reg_token = nn.Parameter(torch.zeros(1, config.prefix_tokens - 1, config.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, config.n_patches, config.width))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.blocks_run))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Patch features (B, n_patches, width) of pixels (B, 3, S, S)."""
        return self.pass_over(pixels)[0]

    def pass_over(self, pixels: torch.Tensor, rows: torch.Tensor | None = None,
                  cache: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]] | None = None,
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """Features (B, n, width) and every block's keys and values. ``rows`` None: every patch.
        ``rows`` (m,), row-major patch indices, with the ``cache`` (keys, values) of an earlier pass:
        only those patches and the prefix tokens run (batch 1), the other patches attended to as
        cached."""
        config = self.config
        weight = self.patch_embed.weight
        pixels = pixels.to(weight.dtype)
        if rows is None:
            x = self.patch_embed(pixels).flatten(2).transpose(1, 2) + self.pos_embed
            if config.prefix_tokens:
                b = x.shape[0]
                x = torch.cat([self.cls_token.expand(b, -1, -1), self.reg_token.expand(b, -1, -1), x], dim=1)
            token_rows = None
        else:
            if cache is None:
                raise ValueError("a tower pass over some of the patches needs the cache of an earlier pass")
            p, grid = config.patch_size, config.grid
            # a stride-p convolution is one product per patch, in the kernel's (channel, y, x) order
            patches = pixels.reshape(3, grid, p, grid, p).permute(1, 3, 0, 2, 4).reshape(grid * grid, -1)
            x = F.linear(patches[rows], weight.reshape(config.width, -1), self.patch_embed.bias)
            x = (x + self.pos_embed[0, rows])[None]
            token_rows = rows + config.prefix_tokens
            if config.prefix_tokens:  # the class and register tokens see every patch: they run too
                x = torch.cat([self.cls_token, self.reg_token, x], dim=1)
                token_rows = torch.cat([torch.arange(config.prefix_tokens, device=rows.device), token_rows])
        keys, values = [], []
        for index, block in enumerate(self.blocks):
            cached_k = cache[0][index] if token_rows is not None and cache is not None else None
            cached_v = cache[1][index] if token_rows is not None and cache is not None else None
            x, k, v = block(x, cached_k, cached_v, token_rows)
            keys.append(k)
            values.append(v)
        return x[:, config.prefix_tokens:], tuple(keys), tuple(values)


class Projector(nn.Module):
    """``fused-gelu-mlp``: fc1 (vision -> 4 x vision), GELU, fc2 (-> text width), GELU, fc3; or
    ``gelu-mlp``: fc1 (vision -> text width), GELU, fc2. Exact GELU, biases throughout."""

    def __init__(self, vision_width: int, text_width: int, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1 = nn.Linear(vision_width, 4 * vision_width)
            self.fc2 = nn.Linear(4 * vision_width, text_width)
            self.fc3 = nn.Linear(text_width, text_width)
        else:
            self.fc1 = nn.Linear(vision_width, text_width)
            self.fc2 = nn.Linear(text_width, text_width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc2(F.gelu(self.fc1(x)))
        return self.fc3(F.gelu(x)) if self.fused else x


class FusedVisionBackbone(nn.Module):
    """The towers and the projector: model input (B, 3 x towers, S, S), each tower's channels in
    order, to projected image features (B, n_patches, text width)."""

    def __init__(self, towers: list[TowerConfig], text_width: int, fused_projector: bool) -> None:
        super().__init__()
        if len({(t.n_patches, t.image_size) for t in towers}) != 1:
            raise ValueError("the towers must cut the image into the same patches")
        self.towers = nn.ModuleList(VisionTower(t) for t in towers)
        self.projector = Projector(sum(t.width for t in towers), text_width, fused_projector)

    @property
    def n_patches(self) -> int:
        return self.towers[0].config.n_patches

    def patch_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The towers' concatenated features (B, n_patches, sum of widths), before the projector."""
        return torch.cat([tower(part) for tower, part in zip(self.towers, pixels.split(3, dim=1))], dim=2)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.projector(self.patch_features(pixels))

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        return self(pixels)

    def tower_pass(self, pixels: torch.Tensor, rows: torch.Tensor | None = None,
                   cache: TowerCache | None = None) -> TowerCache:
        """Every tower and the projector over the model input ``pixels`` (1, 3 x towers, S, S),
        with what a later pass may reuse (the keys and values of every tower's blocks, in tower
        order). ``rows`` None: every patch. ``rows`` (m,) with the ``cache`` of an earlier pass:
        only those patches (and each tower's prefix tokens) run, attending to the cached keys and
        values of the others, which keep their features; with every patch in ``rows`` the result
        is the full pass's to float rounding."""
        if rows is not None and cache is None:
            raise ValueError("a tower pass over some of the patches needs the cache of an earlier pass")
        features, keys, values = [], [], []
        start = 0
        for tower, part in zip(self.towers, pixels.split(3, dim=1)):
            depth = len(tower.blocks)
            cached = None if cache is None or rows is None else (cache.keys[start:start + depth],
                                                                  cache.values[start:start + depth])
            x, k, v = tower.pass_over(part, rows, cached)
            features.append(x)
            keys += k
            values += v
            start += depth
        projected = self.projector(torch.cat(features, dim=2))
        if rows is not None and cache is not None:
            projected = cache.features.index_copy(1, rows, projected)
        return TowerCache(tuple(keys), tuple(values), projected)
