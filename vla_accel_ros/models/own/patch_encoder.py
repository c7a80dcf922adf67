"""The own VLA's patch encoder: each image patch encoded on its own, so that a changed patch can be
re-encoded alone (incremental vision), FiLM-conditioned on the instruction, with optional
spatial-softmax keypoints kept per patch."""

from __future__ import annotations

import math

import torch
from torch import nn

from vla_accel_ros.models.kernels import dense

KEYPOINT_INIT_SCALE = 10.0


class PatchEncoder(nn.Module):
    """Encodes each patch on its own (no cross-patch context), so a changed patch can be re-encoded
    alone. A stride-4 "stem" (a linear map of every 4x4 sub-patch, i.e. a 4x4/4 convolution written
    as one matmul, which is far faster than conv2d on CPU) and then an MLP over the sub-patch grid.
    Pixels enter as RGB scaled to [-1, 1] with no per-channel normalisation: the task turns on
    colour (red/green/blue cube), which must survive into the tokens.

    With ``keypoints`` K > 0 each patch also reports, per keypoint, the log of its softmax mass
    (logsumexp of the keypoint's logits over the patch's sub-cells) and the mass-weighted mean
    sub-cell position inside the patch. A softmax over patches of those masses then gives exactly
    the image-wide spatial softmax (as in end-to-end visuomotor policies), yet stays per patch and
    so cacheable. It turns "where is the named cube" into a coordinate, not a pattern to learn."""

    SUB = 4  # sub-patch side of the stem

    def __init__(self, patch_size: int, channels: int, d_model: int, keypoints: int = 0) -> None:
        super().__init__()
        self.grid = patch_size // self.SUB
        self.keypoints = keypoints
        self.stem = nn.Linear(3 * self.SUB * self.SUB, channels)
        # FiLM from the instruction (as in language-conditioned grasping policies): the stem's
        # features are scaled and shifted per instruction, so a patch showing the named colour
        # stands out before any attention. Still per patch: no patch sees another.
        self.film = nn.Linear(d_model, 2 * channels)
        self.fc = nn.Linear(self.grid * self.grid * channels, 2 * d_model)
        self.proj = nn.Linear(2 * d_model, d_model)
        if keypoints:
            self.keypoint_logits = nn.Linear(channels, keypoints)
            # A spatial softmax over ~1000 sub-cells is flat unless the logits are large: a learned
            # log-temperature, starting sharp, lets a keypoint commit to one place from the start.
            self.keypoint_log_scale = nn.Parameter(torch.tensor(math.log(KEYPOINT_INIT_SCALE)))
            centres = (torch.arange(self.grid, dtype=torch.float32) + 0.5) / self.grid  # in patch widths
            ys, xs = torch.meshgrid(centres, centres, indexing="ij")
            self.register_buffer("sub_xy", torch.stack([xs.flatten(), ys.flatten()], dim=-1), persistent=False)

    def film_params(self, condition: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The FiLM (scale, shift), each (B, 1, 1, channels), of an instruction condition (B, d);
        a caller encoding many frames under one instruction computes them once."""
        gamma, beta = self.film(condition)[:, None, None, :].chunk(2, dim=-1)
        return 1.0 + gamma, beta

    def forward(
        self,
        patches: torch.Tensor,
        condition: torch.Tensor | None = None,
        film: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """patches (B, P, 3, ps, ps) float in [-1, 1], instruction condition (B, d) or its
        ``film_params`` -> local encodings (B, P, d + 3K): token, K keypoint log-masses, K x-offsets,
        K y-offsets."""
        return self.encode_cells(self.cells(patches), condition, film)

    def cells(self, patches: torch.Tensor) -> torch.Tensor:
        """patches (B, P, 3, ps, ps) -> the stem's input (B, P, cells, 3*SUB*SUB): each sub-patch's
        values, channel-major, the sub-patches row-major."""
        b, p, g, s = patches.shape[0], patches.shape[1], self.grid, self.SUB
        return patches.reshape(b, p, 3, g, s, g, s).permute(0, 1, 3, 5, 2, 4, 6).reshape(b, p, g * g, 3 * s * s)

    def encode_cells(
        self,
        cells: torch.Tensor,
        condition: torch.Tensor | None = None,
        film: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` from the stem's input (B, P, cells, 3*SUB*SUB) (:meth:`cells`,
        ``VLATarget.patch_cells``)."""
        b, p = cells.shape[:2]
        x = dense(cells, self.stem, gelu=True)
        if film is None and condition is not None:
            film = self.film_params(condition)
        if film is not None:
            x = x * film[0] + film[1]
        token = dense(dense(x.reshape(b, p, -1), self.fc, gelu=True), self.proj)
        if not self.keypoints:
            return token
        logits = dense(x, self.keypoint_logits) * self.keypoint_log_scale.exp()  # (B, P, g*g, K)
        # logsumexp and softmax over the sub-cells from one shared exp: torch.logsumexp and
        # torch.softmax each redo it (and logsumexp guards infinities a finite logit never has),
        # which made them a third of the encoder's time on the few patches of an incremental frame.
        peak = logits.amax(dim=2, keepdim=True)
        exp = (logits - peak).exp()  # out of place: training differentiates through it
        total = exp.sum(dim=2, keepdim=True)
        log_mass = (peak + total.log()).squeeze(2)  # (B, P, K)
        weights = exp / total  # (B, P, g*g, K)
        offset = (weights.transpose(2, 3) @ self.sub_xy).transpose(2, 3).reshape(b, p, 2 * self.keypoints)
        return torch.cat([token, log_mass, offset], dim=-1)
