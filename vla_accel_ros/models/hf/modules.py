"""A Llava-style Hugging Face model (``AutoModelForImageTextToText``) as the model half of a token
VLA's passes (:class:`~vla_accel_ros.models.token_vla.passes.VLAModules`): the image resized and
normalised as the spec says, the vision tower, feature selection and projector, the text model
over embeddings after a KV cache. It runs transformers' modules, or the direct forward
(:mod:`.direct`) where the spec asks for it and the model allows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vla_accel_ros.models.files import CONFIG_FILE
from vla_accel_ros.models.hf.direct import DirectLlavaForward, unsupported_reason
from vla_accel_ros.models.token_vla.passes import embeddings_with_image, to_device
from vla_accel_ros.models.token_vla.spec import VLASpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class LlavaModules:
    """A loaded image-text-to-text model and its spec: what :class:`HFPasses` runs of it. ValueError
    (``source`` names the model) when it has no image token or LM head, or its tower's image size
    is not the spec's."""

    def __init__(self, model: PreTrainedModel, spec: VLASpec, source: str) -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.spec = spec
        config = model.config
        self.text_config = config.get_text_config()
        if model.get_output_embeddings() is None or not hasattr(model, "model"):
            raise ValueError(f"{source}: {type(model).__name__} has no language-model head to read action logits from")
        image_token = getattr(config, "image_token_id", None)
        if image_token is None:
            image_token = getattr(config, "image_token_index", None)
        if image_token is None:
            raise ValueError(f"{source}/{CONFIG_FILE}: not a VLA: the model has no image token (image_token_id)")
        self.image_token_id = int(image_token)
        vision_size = getattr(getattr(config, "vision_config", None), "image_size", None)
        if vision_size is not None and int(vision_size) != spec.image_size:
            raise ValueError(f"{source}: image_size {spec.image_size} (processor config or vla_spec.json) differs "
                             f"from the vision tower's {vision_size} ({CONFIG_FILE})")
        self.image_size = spec.image_size
        self.patch_size = int(getattr(getattr(config, "vision_config", None), "patch_size", 0) or 0)
        self._cache_type = DynamicCache
        weight = model.get_output_embeddings().weight
        self.device, self.dtype = weight.device, weight.dtype
        mean = torch.tensor(spec.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(spec.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        # (x / 255 - mean) / std as one multiply-add on 0..255 values
        self._pixel_scale, self._pixel_shift = (1.0 / (255.0 * std)).to(self.device), (-mean / std).to(self.device)
        # The direct forward where the spec asks for it and the model allows it (direct.py).
        self.direct: DirectLlavaForward | None = None
        if not spec.direct_forward:
            self.forward_name = "transformers (direct_forward off)"
        elif unsupported := unsupported_reason(model):
            self.forward_name = f"transformers (no direct forward: {unsupported})"
        else:
            self.direct, self.forward_name = DirectLlavaForward(model), "direct"
        # the fast path (token_vla/static.py) runs the direct forward's text model
        self.direct_text = None if self.direct is None else self.direct.llama
        self.n_image_tokens = self._count_image_tokens()

    # --- the image ------------------------------------------------------------------------------
    def resized_image(self, image: np.ndarray) -> torch.Tensor:
        """(1, 3, S, S) float32 on the 0..255 scale, on the CPU: one RGB uint8 image (H, W, 3)
        resized to the spec's size (its resampling, antialiased), before normalisation."""
        # a read-only frame (decoded from a message) is copied: torch warns on sharing its memory
        x = torch.from_numpy(np.require(image, requirements=("C", "W"))).permute(2, 0, 1).unsqueeze(0).float()
        size = self.image_size
        if x.shape[-2:] != (size, size):
            mode = self.spec.resample
            x = torch.nn.functional.interpolate(x, size=(size, size), mode=mode, antialias=mode != "nearest",
                                                **({} if mode == "nearest" else {"align_corners": False}))
            x = x.clamp_(0.0, 255.0)  # bicubic overshoots; a uint8 resize would saturate
        return x

    def normalised_pixels(self, resized: torch.Tensor) -> torch.Tensor:
        """The model input (1, 3, S, S) of a :meth:`resized_image`, computed on the model's device."""
        return (to_device(resized, self.device) * self._pixel_scale + self._pixel_shift).to(self.dtype)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(1, n_image_tokens, d): the vision tower, feature selection and projector."""
        if self.direct is not None:
            return self.direct.image_features(pixels)
        out = self.model.get_image_features(pixel_values=pixels)
        features = getattr(out, "pooler_output", out)
        if isinstance(features, (list, tuple)):  # one (n, d) per image
            features = torch.stack(list(features))
        return features

    # --- the text model -------------------------------------------------------------------------
    def new_cache(self) -> Any:
        """An empty KV cache for the text model."""
        return self._cache_type(config=self.text_config)

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def get_input_embeddings(self) -> Any:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> Any:
        return self.model.get_output_embeddings()

    def forward(self, ids: torch.Tensor, pixels: torch.Tensor | None, cache: Any) -> torch.Tensor:
        """The model's base (everything but the LM head) over ``ids`` after the cache's positions,
        the image of ``pixels`` in its tokens' places."""
        if self.direct is not None:
            embeddings = self.embed_ids(ids) if pixels is None else embeddings_with_image(
                self, ids, self.image_features(pixels))
            return self.text_after_cache(embeddings, cache)
        inputs: dict[str, Any] = {"input_ids": ids, "cache": cache, "use_cache": True}
        if pixels is not None:
            inputs["pixel_values"] = pixels
        return self.model.model(**inputs).last_hidden_state

    def text_after_cache(self, embeddings: torch.Tensor, cache: Any) -> torch.Tensor:
        """Final hidden states (1, q, d) of the text model over embeddings (1, q, d), causal, after
        the cache's rows."""
        if self.direct is None:
            return self.model.model(inputs_embeds=embeddings, cache=cache, use_cache=True).last_hidden_state
        past = cache.get_seq_length()
        return self.direct.text_forward(embeddings, cache,
                                        torch.arange(past, past + embeddings.shape[1], device=self.device))

    def forward_embeddings(self, embeddings: torch.Tensor, cache: Any, position_ids: torch.Tensor,
                           attention_mask: torch.Tensor) -> torch.Tensor:
        """The text model over input embeddings (1, q, d) at ``position_ids`` (1, q), after the
        cache's rows, under a 4D additive ``attention_mask`` (1, 1, q, cached + q)."""
        if self.direct is not None:
            return self.direct.text_forward(embeddings, cache, position_ids[0], attention_mask)
        return self.model.model(inputs_embeds=embeddings, position_ids=position_ids, attention_mask=attention_mask,
                                cache=cache, use_cache=True).last_hidden_state

    def _count_image_tokens(self) -> int:
        """Image positions per prompt: the vision features one image makes (one pass on a blank
        image; their number depends on the tower, the feature layer and the selection strategy)."""
        blank = torch.zeros(1, 3, self.image_size, self.image_size, device=self.device, dtype=self.dtype)
        with torch.inference_mode():
            return int(self.image_features(blank).shape[-2])
