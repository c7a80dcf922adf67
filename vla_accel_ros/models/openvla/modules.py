"""OpenVLA's model (:class:`OpenVLAModel`: the vision backbone and projector, and a transformers
``LlamaForCausalLM`` built from the shipped ``text_config``) and its model half of the token-VLA
passes (:class:`OpenVLAModules`, a :class:`~vla_accel_ros.models.token_vla.passes.VLAModules`).

The prompt the shared passes build is ``[BOS] + [pad id] * 256 + prompt[1:] + [29871]``: OpenVLA
puts the 256 projected patches right after BOS, and the pad id (``<PAD>``, 32000 in openvla-7b)
holds their places, since no prompt contains it. Positions run 0..L-1 over the whole sequence.

The image: PIL's bicubic resize of the uint8 image to the processor's square side (PIL returns an
image of that side unchanged), ``/ 255``, then each tower's mean/std (DINOv2's bfloat16-rounded as
stored), the towers' inputs stacked along the channels ``[DINOv2 (3), SigLIP (3)]``. The Llama runs
through :class:`~vla_accel_ros.models.hf.direct.DirectLlamaText`, the op-by-op forward the Llava
family's direct path runs too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from vla_accel_ros.models.hf.direct import DirectLlamaText
from vla_accel_ros.models.openvla.config import ImageProcessing
from vla_accel_ros.models.openvla.vision import FusedVisionBackbone
from vla_accel_ros.models.token_vla.passes import embeddings_with_image, to_device


class OpenVLAModel(nn.Module):
    """The whole network: ``vision`` (towers + projector) and ``language_model`` (LlamaForCausalLM)."""

    def __init__(self, vision: FusedVisionBackbone, language_model: nn.Module) -> None:
        super().__init__()
        self.vision = vision
        self.language_model = language_model


class OpenVLAModules:
    """The model half of OpenVLA's passes (module docstring); ``image_token_id``: the id holding the
    patches' places (the pad id)."""

    forward_name = "native towers + direct Llama"

    def __init__(self, model: OpenVLAModel, processing: ImageProcessing, image_token_id: int) -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.vision = model.vision
        self.direct = model.vision  # runs the towers over some of the patches (tower_pass)
        language_model = model.language_model
        self.text_config = language_model.config
        self.image_token_id = image_token_id
        self.processing = processing
        self.image_size = processing.size
        first = self.vision.towers[0].config
        self.patch_size = first.patch_size
        self.n_image_tokens = self.vision.n_patches
        weight = language_model.get_output_embeddings().weight
        self.device, self.dtype = weight.device, weight.dtype
        self.llama = DirectLlamaText(language_model.model, self.text_config)
        self.direct_text = self.llama  # the fast path's text model (token_vla/static.py)
        self._cache_type = DynamicCache
        self._means = [torch.tensor(m, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
                       for m in processing.means]
        self._stds = [torch.tensor(s, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
                      for s in processing.stds]

    # --- the image ------------------------------------------------------------------------------
    def resized_image(self, image: np.ndarray) -> torch.Tensor:
        """(1, 3, S, S) float32 on the 0..255 scale: PIL's resize (the processor's resampling,
        bicubic in OpenVLA) of the uint8 image to S x S, as OpenVLA's processor makes it."""
        size = self.image_size
        if image.shape[:2] != (size, size):
            resized = Image.fromarray(np.ascontiguousarray(image)).resize((size, size), self.processing.resample)
            image = np.array(resized)
        # a read-only frame (decoded from a message) is copied: torch warns on sharing its memory
        return torch.from_numpy(np.require(image, requirements=("C", "W"))).permute(2, 0, 1).unsqueeze(0).float()

    def normalised_pixels(self, resized: torch.Tensor) -> torch.Tensor:
        """(1, 3 x towers, S, S): ``(x / 255 - mean) / std`` per tower, in float32 and in that order
        (the original's ``to_tensor`` then ``normalize``), on the model's device (where it is computed)
        and in its dtype."""
        scaled = to_device(resized, self.device) / 255.0
        stacked = torch.cat([(scaled - mean) / std for mean, std in zip(self._means, self._stds)], dim=1)
        return stacked.to(self.device, self.dtype)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vision(pixels.to(self.device, self.dtype))

    # --- the text model -------------------------------------------------------------------------
    def new_cache(self) -> Any:
        return self._cache_type(config=self.text_config)

    def get_input_embeddings(self) -> Any:
        return self.model.language_model.get_input_embeddings()

    def get_output_embeddings(self) -> Any:
        return self.model.language_model.get_output_embeddings()

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.get_input_embeddings()(ids)

    def forward(self, ids: torch.Tensor, pixels: torch.Tensor | None, cache: Any) -> torch.Tensor:
        if pixels is None:
            embeddings = self.embed_ids(ids)
        else:
            embeddings = embeddings_with_image(self, ids, self.image_features(pixels))
        return self.text_after_cache(embeddings, cache)

    def text_after_cache(self, embeddings: torch.Tensor, cache: Any) -> torch.Tensor:
        past = cache.get_seq_length()
        positions = torch.arange(past, past + embeddings.shape[1], device=self.device)
        return self.llama.text_forward(embeddings, cache, positions)

    def forward_embeddings(self, embeddings: torch.Tensor, cache: Any, position_ids: torch.Tensor,
                           attention_mask: torch.Tensor) -> torch.Tensor:
        return self.llama.text_forward(embeddings, cache, position_ids[0], attention_mask)
