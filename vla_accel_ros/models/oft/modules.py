"""OpenVLA-OFT's two small modules, named as its state dicts name them (``module.`` stripped).

- :class:`L1ActionHead`: the L1 regression head. The language model's last hidden states at the
  chunk's D x H action positions, D consecutive ones per action, concatenated (D x width), go
  through an MLP-ResNet: LayerNorm -> fc1 (D x width -> hidden) -> ReLU -> residual blocks
  ``x + ReLU(Linear(LayerNorm(x)))`` -> LayerNorm -> fc2 (-> D). The outputs are the normalised
  actions, neither squashed nor clipped.
- :class:`ProprioProjector`: the state (P,) -> width, exact GELU, -> width: one token of the sequence.

:func:`head_shape` reads the sizes from the tensors' shapes, so that any OFT head loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class HeadShape:
    """An action head's sizes: ``action_dim`` values per action, each read from ``action_dim``
    hidden states of ``width``; ``hidden`` the MLP's width, ``blocks`` its residual blocks."""

    action_dim: int
    width: int
    hidden: int
    blocks: int


def head_shape(shapes: dict[str, tuple[int, ...]], source: str) -> HeadShape:
    """The :class:`HeadShape` of an action head's tensor ``shapes``; ValueError naming ``source``
    when they are not an MLP-ResNet L1 head's."""
    needed = ("model.fc1.weight", "model.fc2.weight", "model.layer_norm1.weight")
    missing = [name for name in needed if name not in shapes]
    if missing:
        raise ValueError(f"{source}: not an OFT L1 regression head (no tensor {missing[0]})")
    hidden, fed = shapes["model.fc1.weight"]
    action_dim, fc2_in = shapes["model.fc2.weight"]
    if fc2_in != hidden or fed % action_dim:
        raise ValueError(f"{source}: fc1 {shapes['model.fc1.weight']} and fc2 {shapes['model.fc2.weight']} do not "
                         "make an L1 head (fc1 reads action_dim hidden states, fc2 gives action_dim values)")
    blocks = len({name.split(".")[2] for name in shapes if name.startswith("model.mlp_resnet_blocks.")})
    return HeadShape(action_dim=action_dim, width=fed // action_dim, hidden=hidden, blocks=blocks)


class ResidualBlock(nn.Module):
    """``x + ReLU(Linear(LayerNorm(x)))`` (pre-norm)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        fed = shape.action_dim * shape.width
        self.layer_norm1 = nn.LayerNorm(fed)
        self.fc1 = nn.Linear(fed, shape.hidden)
        self.mlp_resnet_blocks = nn.ModuleList(ResidualBlock(shape.hidden) for _ in range(shape.blocks))
        self.layer_norm2 = nn.LayerNorm(shape.hidden)
        self.fc2 = nn.Linear(shape.hidden, shape.action_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1ActionHead(nn.Module):
    """The L1 regression head (module docstring)."""

    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        self.shape = shape
        self.model = MLPResNet(shape)

    def forward(self, action_hidden: torch.Tensor) -> torch.Tensor:
        """(B, H x D, width) hidden states -> (B, H, D) normalised actions."""
        batch, positions, width = action_hidden.shape
        d = self.shape.action_dim
        if positions % d or width != self.shape.width:
            raise ValueError(f"the head reads (B, H x {d}, {self.shape.width}) hidden states, got "
                             f"{tuple(action_hidden.shape)}")
        return self.model(action_hidden.reshape(batch, positions // d, d * width))


class ProprioProjector(nn.Module):
    """The state (B, P) -> its token (B, width): fc1, exact GELU, fc2."""

    def __init__(self, state_dim: int, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(state_dim, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(state)))
