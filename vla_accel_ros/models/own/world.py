"""World-aware prefill (WA-SpecDec): a frozen frame autoencoder and a per-patch "world bias".

The mechanism changes no acceptance rule. It changes what the target (and therefore the draft
head, which reads the target's prefix) is conditioned on:

1. :class:`FrameAutoencoder` compresses a camera frame into a latent map with exactly the target's
   patch grid (one latent cell per 16x16 patch, e.g. 8 channels at 8x8 for a 128x128 image). It is
   trained once on sim frames with a plain L2 reconstruction loss and then frozen. It stands in for
   the large pre-trained, frozen image VAE of the method: the only thing the rest relies on is a
   fixed encoder whose latent cells line up with the patches, and a deterministic plain
   autoencoder gives that at a fraction of the cost (no sampling, no KL term, nothing random at
   inference).
2. :class:`WorldBias` turns the latent map into a bias w_t (B, P, d_model), one vector per patch,
   that is ADDED to the target's local patch tokens before its global vision layers (V + w_t).
   It is trained by a dense next-frame prediction loss: a small per-cell head must predict the
   next frame's latent map from (w_t, z_t). The head sees one cell at a time, so whatever it needs
   from the neighbourhood (where the arm is heading, what it is about to occlude) has to come
   through w_t, which is what makes the bias "world-aware". Its output layer is zero-initialised,
   so a fresh module leaves the target exactly unchanged.
3. :class:`WorldPrefill` bundles both; ``Policy.world`` holds one, and every prefill (and the
   training forward pass) adds its bias. The bias reads the current frame only: a prefill is a pure
   function of one observation, which the decoders, the incremental vision cache and the node all
   rely on; anticipating motion from a single frame is exactly what the next-frame loss teaches.

With a keypoint token (``VLAConfig.keypoints``), only the P patch tokens are biased: the bias is
added to the token part of each local encoding, never to its keypoint channels, so the keypoint
token is computed from unbiased features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.core.json_config import JsonConfig
from vla_accel_ros.models.own.config import VLAConfig


def _check_positive(owner: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


def images_to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (B, H, W, 3) -> float (B, 3, H, W) in [-1, 1] (the target's pixel scaling)."""
    if images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be (B, H, W, 3), got {tuple(images.shape)}")
    return images.permute(0, 3, 1, 2).to(torch.float32) * (2.0 / 255.0) - 1.0


# --- the frozen frame autoencoder -------------------------------------------------------------
@dataclass(frozen=True)
class FrameAutoencoderConfig(JsonConfig):
    image_size: int = 128
    patch_size: int = 16  # the latent map has one cell per patch of the target
    latent_channels: int = 8
    width: int = 16  # channels at the 1/4 resolution; twice that at the latent resolution

    def __post_init__(self) -> None:
        _check_positive("FrameAutoencoderConfig", self, ("image_size", "patch_size", "latent_channels", "width"))
        if self.patch_size % 4:
            raise ValueError(f"FrameAutoencoderConfig.patch_size must be a multiple of 4, got {self.patch_size}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")

    @property
    def grid(self) -> int:
        """Side of the latent map (= the target's patch grid)."""
        return self.image_size // self.patch_size


class FrameAutoencoder(nn.Module):
    """A small convolutional autoencoder: image (B, H, W, 3) -> latent (B, C, grid, grid) -> image.

    Downsampling uses non-overlapping convolutions (kernel = stride: 4, then patch_size / 4), so a
    latent cell's receptive field starts exactly at its patch; the two 3x3 layers add a little
    context. The latent is linear (a squashing tanh saturated in training and froze the latent);
    ``latent_l2`` in :meth:`loss` keeps its scale near one, the role the KL term plays in a VAE.
    """

    def __init__(self, config: FrameAutoencoderConfig) -> None:
        super().__init__()
        self.config = config
        w, c, down = config.width, config.latent_channels, config.patch_size // 4
        self.encoder = nn.Sequential(
            nn.Conv2d(3, w, 4, stride=4), nn.GELU(),
            nn.Conv2d(w, w, 3, padding=1), nn.GELU(),
            nn.Conv2d(w, 2 * w, down, stride=down), nn.GELU(),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.GELU(),
            nn.Conv2d(2 * w, c, 1),
        )
        self.decoder = nn.Sequential(
            nn.Conv2d(c, 2 * w, 1), nn.GELU(),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.GELU(),
            nn.ConvTranspose2d(2 * w, w, down, stride=down), nn.GELU(),
            nn.Conv2d(w, w, 3, padding=1), nn.GELU(),
            nn.ConvTranspose2d(w, 3, 4, stride=4),
        )

    def _check(self, images: torch.Tensor) -> None:
        s = self.config.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (s, s, 3):
            raise ValueError(f"images must be (B, {s}, {s}, 3), got {tuple(images.shape)}")

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (B, H, W, 3) -> latent map (B, C, grid, grid)."""
        self._check(images)
        return self.encoder(images_to_float(images))

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """Latent map -> reconstructed image (B, 3, H, W) on the [-1, 1] pixel scale."""
        return self.decoder(latent)

    def reconstruction_loss(self, images: torch.Tensor) -> torch.Tensor:
        """Mean squared pixel error (on the [-1, 1] scale) of encoding and decoding ``images``."""
        return self.loss(images, latent_l2=0.0)

    def loss(self, images: torch.Tensor, latent_l2: float = 1e-3) -> torch.Tensor:
        """Training loss: the reconstruction error plus ``latent_l2`` times the latent's mean square."""
        latent = self.encode(images)
        loss = F.mse_loss(self.decode(latent), images_to_float(images))
        return loss + latent_l2 * latent.pow(2).mean() if latent_l2 > 0 else loss


# --- the world-aware bias ---------------------------------------------------------------------
@dataclass(frozen=True)
class WorldBiasConfig(JsonConfig):
    latent_channels: int = 8
    grid: int = 8  # side of the latent map = the target's patch grid
    d_model: int = 128  # width of the target's patch tokens
    hidden: int = 64
    layers: int = 2  # 3x3 convolutions over the latent map before the output layer
    head_hidden: int = 64  # width of the per-cell next-frame head

    def __post_init__(self) -> None:
        _check_positive("WorldBiasConfig", self, ("latent_channels", "grid", "d_model", "hidden", "layers",
                                                   "head_hidden"))

    @property
    def n_patches(self) -> int:
        return self.grid * self.grid


class WorldBias(nn.Module):
    """Latent map (B, C, g, g) -> per-patch bias (B, g*g, d_model), row-major like the patches.

    A few 3x3 convolutions (plus a learned embedding of each cell's position) give every cell its
    neighbourhood; a zero-initialised linear layer maps that to the token width. ``next_latent``
    is the training-only dense head: from (bias, latent) of each cell on its own, the next frame's
    latent at that cell.
    """

    def __init__(self, config: WorldBiasConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        width = config.latent_channels
        for _ in range(config.layers):
            layers += [nn.Conv2d(width, config.hidden, 3, padding=1), nn.GELU()]
            width = config.hidden
        self.features = nn.Sequential(*layers)
        self.cell_emb = nn.Parameter(torch.zeros(config.n_patches, config.hidden))
        nn.init.normal_(self.cell_emb, std=0.02)
        self.norm = nn.LayerNorm(config.hidden)
        self.out = nn.Linear(config.hidden, config.d_model)
        nn.init.zeros_(self.out.weight)  # a fresh bias is exactly zero: the target is unchanged
        nn.init.zeros_(self.out.bias)
        self.next_head = nn.Sequential(
            nn.Linear(config.d_model + config.latent_channels, config.head_hidden), nn.GELU(),
            nn.Linear(config.head_hidden, config.latent_channels),
        )
        nn.init.zeros_(self.next_head[-1].weight)  # it starts by predicting "no change" (persistence)
        nn.init.zeros_(self.next_head[-1].bias)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        """Latent map (B, C, g, g) -> bias (B, P, d_model)."""
        c = self.config
        if latent.dim() != 4 or tuple(latent.shape[1:]) != (c.latent_channels, c.grid, c.grid):
            raise ValueError(f"latent must be (B, {c.latent_channels}, {c.grid}, {c.grid}), got {tuple(latent.shape)}")
        h = self.features(latent).flatten(2).transpose(1, 2)  # (B, P, hidden)
        return self.out(self.norm(F.gelu(h + self.cell_emb)))

    def next_latent(self, bias: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """Predicted next-frame latent map (B, C, g, g): the current one plus a per-cell change."""
        b, ch, g, _ = latent.shape
        cells = latent.flatten(2).transpose(1, 2)  # (B, P, C)
        delta = self.next_head(torch.cat([bias, cells], dim=-1))
        return latent + delta.transpose(1, 2).reshape(b, ch, g, g)

    def next_frame_loss(self, latent: torch.Tensor, next_latent: torch.Tensor,
                        bias_l2: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, bias): mean squared error of the predicted next latent map, plus ``bias_l2`` times
        the bias's mean square (which keeps the perturbation of the target's tokens small)."""
        bias = self(latent)
        loss = F.mse_loss(self.next_latent(bias, latent), next_latent)
        if bias_l2 > 0:
            loss = loss + bias_l2 * bias.pow(2).mean()
        return loss, bias


# --- the bundle the policy holds --------------------------------------------------------------
class WorldPrefill(nn.Module):
    """The frozen autoencoder and the bias module; ``info`` keeps the recipe and metrics that come
    with them in a checkpoint (not weights)."""

    def __init__(self, autoencoder: FrameAutoencoderConfig, bias: WorldBiasConfig,
                 info: dict[str, Any] | None = None) -> None:
        super().__init__()
        if (bias.latent_channels, bias.grid) != (autoencoder.latent_channels, autoencoder.grid):
            raise ValueError(
                f"the bias module reads {bias.latent_channels} x {bias.grid}x{bias.grid} latents, the autoencoder "
                f"gives {autoencoder.latent_channels} x {autoencoder.grid}x{autoencoder.grid}"
            )
        self.autoencoder = FrameAutoencoder(autoencoder)
        self.bias = WorldBias(bias)
        self.info: dict[str, Any] = dict(info or {})

    @classmethod
    def for_target(cls, config: VLAConfig, latent_channels: int = 8, width: int = 16, hidden: int = 64,
                   layers: int = 2, head_hidden: int = 64) -> WorldPrefill:
        """A fresh (zero-bias) component sized for the target ``config``."""
        ae = FrameAutoencoderConfig(config.image_size, config.patch_size, latent_channels, width)
        bias = WorldBiasConfig(latent_channels, ae.grid, config.d_model, hidden, layers, head_hidden)
        return cls(ae, bias)

    def check_target(self, config: VLAConfig) -> None:
        """ValueError when this component does not fit the target ``config``."""
        ae, bias = self.autoencoder.config, self.bias.config
        if (ae.image_size, ae.patch_size) != (config.image_size, config.patch_size):
            raise ValueError(
                f"the world autoencoder is for {ae.image_size}px images in {ae.patch_size}px patches, the target "
                f"uses {config.image_size}px / {config.patch_size}px"
            )
        if bias.d_model != config.d_model:
            raise ValueError(f"the world bias has width {bias.d_model}, the target's tokens {config.d_model}")

    def patch_bias(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (B, H, W, 3) -> the bias of every patch token (B, P, d_model)."""
        return self.bias(self.autoencoder.encode(images))
