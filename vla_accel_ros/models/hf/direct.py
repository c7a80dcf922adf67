"""The direct forward of a Llava VLA with a SigLIP tower and a Llama text model: the arithmetic of
transformers' modules, called op by op on their own weights.

On a CPU, at the few-million-parameter shapes the package trains, the model-level wrappers, mask
building and attention interface of transformers are a sizeable share of each pass beside the
small matrix products they wrap (docs/your_own_vla.md gives the measured difference). The results
are the modules' own to float rounding (the tests hold them equal in float32): the same
projections, RMS and layer norms, rotary tables, scaled dot-product attention (grouped keys/values
included) and activations, in the same order.

:func:`unsupported_reason` says why a model cannot take this path (an empty string when it can);
:class:`HFTokenVLA <vla_accel_ros.models.token_vla.policy.HFTokenVLA>` then keeps to transformers' modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from vla_accel_ros.models.token_vla.cache import TowerCache

# SigLIP's and Llama's activations, by config name, as the functions their modules apply.
TOWER_ACTIVATIONS = {"gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}
TEXT_ACTIVATIONS = {"silu": F.silu}


def unsupported_reason(model: Any) -> str:
    """Why ``model`` (a loaded ``LlavaForConditionalGeneration``) cannot run the direct forward;
    '' when it can: a SigLIP tower read at its last layer in full, a Llama text model with the
    default rotary embedding, activations this module knows, and SDPA or eager attention."""
    config = model.config
    if getattr(config, "model_type", None) != "llava":
        return f"not a Llava model ({getattr(config, 'model_type', None)!r})"
    vision, text = config.vision_config, config.get_text_config()
    if vision.model_type != "siglip_vision_model":
        return f"the vision tower is {vision.model_type!r}, not SigLIP's"
    if config.vision_feature_layer != -1 or config.vision_feature_select_strategy != "full":
        return "the image features are not the tower's last layer in full"
    if getattr(vision, "hidden_act", None) not in TOWER_ACTIVATIONS:
        return f"the tower's activation {vision.hidden_act!r}"
    if vision._attn_implementation not in ("sdpa", "eager"):
        return "an attention implementation other than SDPA or eager"
    return llama_unsupported_reason(text)


def llama_unsupported_reason(text: Any) -> str:
    """Why the text model of ``text`` (its transformers config) cannot run :class:`DirectLlamaText`;
    '' when it can: a Llama with the default rotary embedding, an activation this module knows,
    and SDPA or eager attention."""
    if text.model_type != "llama":
        return f"the text model is {text.model_type!r}, not Llama"
    rope = getattr(text, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"the rotary embedding is {rope.get('rope_type')!r}, not the default"
    if getattr(text, "hidden_act", None) not in TEXT_ACTIVATIONS:
        return f"the text model's activation {text.hidden_act!r}"
    if getattr(text, "pretraining_tp", 1) not in (None, 1):
        return "tensor-parallel pretraining slices (pretraining_tp > 1)"
    if text._attn_implementation not in ("sdpa", "eager"):
        return "an attention implementation other than SDPA or eager"
    return ""


class DirectLlamaText:
    """The text model of a Llama (a transformers ``LlamaModel``: its layers, final norm and rotary
    tables), op by op, batch 1, inference only; :meth:`text_forward` runs it over input embeddings.
    Both the Llava VLAs here and OpenVLA (:mod:`vla_accel_ros.models.openvla`) run their text
    model through it."""

    def __init__(self, text: Any, config: Any) -> None:
        self.text = text
        self.text_activation = TEXT_ACTIVATIONS[config.hidden_act]
        self.heads, self.kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        weight = self.text.norm.weight
        positions = torch.arange(int(config.max_position_embeddings), device=weight.device)[None]
        with torch.inference_mode():  # the module's own tables, in the dtype it hands its layers
            cos, sin = self.text.rotary_emb(weight[None, None, :1], positions)
        self._cos, self._sin = cos[0].clone(), sin[0].clone()

    def text_forward(self, embeddings: torch.Tensor, cache: Any, positions: torch.Tensor,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states (1, q, d) of the text model over input embeddings (1, q, d) at
        ``positions`` (q,), appending to ``cache`` (a transformers ``DynamicCache``). ``mask``: a
        (1, 1, q, cached + q) additive or boolean mask; without one each token sees the cache and
        the new tokens up to itself."""
        q = embeddings.shape[1]
        past = cache.get_seq_length()
        cos, sin = self._cos[positions][None, None], self._sin[positions][None, None]
        causal = False
        if mask is None and q > 1:
            if past:
                mask = torch.ones(q, past + q, dtype=torch.bool, device=embeddings.device).tril_(past)[None, None]
            else:
                causal = True
        return self._layers(embeddings, cos, sin, mask, causal,
                            lambda index, key, value: cache.update(key, value, index))

    def static_forward(self, embeddings: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                       positions: torch.Tensor, visible: int | None) -> torch.Tensor:
        """Final hidden states (1, q, d) over input embeddings (1, q, d) at ``positions`` (q,),
        writing their keys and values into the rows of those positions of the preallocated
        ``keys`` / ``values`` (per layer (1, kv_heads, capacity, head_dim)); the rows past the last
        position written are never read, so rolling back is forgetting a length.

        ``visible`` None: every row is attended to, masked by position on the device (no value is
        read back and the shapes are fixed: a CUDA graph records it once per (q, capacity)).
        ``visible`` an int, the last position written + 1 (the new tokens' positions run up to it):
        the rows up to it, under the causal mask :meth:`text_forward` builds (its arithmetic)."""
        q = embeddings.shape[1]
        cos, sin = self._cos[positions][None, None], self._sin[positions][None, None]
        causal, mask = False, None
        if visible is None:
            rows = torch.arange(keys[0].shape[2], device=embeddings.device)
            mask = (rows[None, :] <= positions[:, None])[None, None]
        elif q > 1:
            if visible > q:
                mask = torch.ones(q, visible, dtype=torch.bool, device=embeddings.device).tril_(visible - q)[None, None]
            else:
                causal = True
        end = visible if visible is not None else keys[0].shape[2]

        def written(index: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keys[index].index_copy_(2, positions, key)
            values[index].index_copy_(2, positions, value)
            return keys[index][:, :, :end], values[index][:, :, :end]

        return self._layers(embeddings, cos, sin, mask, causal, written)

    def _layers(self, embeddings: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                causal: bool, keep: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
                ) -> torch.Tensor:
        """The decoder layers over ``embeddings`` (1, q, d): ``keep(layer, keys, values)`` stores the new
        tokens' keys and values and gives back those attended to (a growing cache's, or a static one's rows)."""
        q = embeddings.shape[1]
        x = embeddings
        for index, layer in enumerate(self.text.layers):
            attention, mlp = layer.self_attn, layer.mlp
            h = layer.input_layernorm(x)
            query = _rotated(attention.q_proj(h).view(1, q, self.heads, self.head_dim).transpose(1, 2), cos, sin)
            key = _rotated(attention.k_proj(h).view(1, q, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            value = attention.v_proj(h).view(1, q, self.kv_heads, self.head_dim).transpose(1, 2)
            key, value = keep(index, key, value)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=causal,
                                                 scale=attention.scaling, enable_gqa=self.kv_heads != self.heads)
            x = x + attention.o_proj(out.transpose(1, 2).reshape(1, q, -1))
            h = layer.post_attention_layernorm(x)
            x = x + mlp.down_proj(self.text_activation(mlp.gate_proj(h)) * mlp.up_proj(h))
        return self.text.norm(x)

    @property
    def n_layers(self) -> int:
        return len(self.text.layers)

    @property
    def cos(self) -> torch.Tensor:
        """The rotary cosine table (max_position_embeddings, head_dim): one row per position."""
        return self._cos


class DirectLlavaForward:
    """The tower-and-projector and the text model of one supported Llava (:func:`unsupported_reason`
    is ''; ValueError otherwise), batch 1, inference only."""

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"no direct forward for this model: {reason}")
        base = model.model
        self.tower, self.projector = base.vision_tower, base.multi_modal_projector
        vision = model.config.vision_config
        self.tower_heads = int(vision.num_attention_heads)
        self.tower_activation = TOWER_ACTIVATIONS[vision.hidden_act]
        self.llama = DirectLlamaText(base.language_model, model.config.get_text_config())

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(1, n_patches, d_text): the projected last-layer features of the model input (1, 3, S, S)."""
        return self.tower_pass(pixels).features

    def tower_pass(self, pixels: torch.Tensor, rows: torch.Tensor | None = None,
                   cache: TowerCache | None = None) -> TowerCache:
        """The tower and projector over the model input ``pixels`` (1, 3, S, S), with what a later
        pass may reuse. ``rows`` None: every patch. ``rows`` (m,), indices of row-major patches, with
        the ``cache`` of an earlier pass: only those patches run, attending in every layer to the
        cache's keys and values of the others, which keep their features (an approximation: the
        tower's attention is bidirectional). With every patch in ``rows`` the result is the full
        pass's to float rounding."""
        embeddings = self.tower.embeddings
        conv = embeddings.patch_embedding
        pixels = pixels.to(conv.weight.dtype)
        position = embeddings.position_embedding.weight
        if rows is not None and cache is None:
            raise ValueError("a tower pass over some of the patches needs the cache of an earlier pass")
        reused = cache if rows is not None else None  # what the patches outside ``rows`` keep
        if rows is None:
            x = conv(pixels).flatten(2).transpose(1, 2) + position[None]
        else:
            patch = conv.kernel_size[0]
            grid = pixels.shape[-1] // patch
            # the convolution with stride = kernel is one product per patch, in the kernel's (channel, y, x) order
            patches = pixels.reshape(3, grid, patch, grid, patch).permute(1, 3, 0, 2, 4).reshape(grid * grid, -1)
            x = (F.linear(patches[rows], conv.weight.reshape(conv.out_channels, -1), conv.bias) + position[rows])[None]
        n, heads = x.shape[1], self.tower_heads
        keys, values = [], []
        for index, layer in enumerate(self.tower.encoder.layers):
            attention, mlp = layer.self_attn, layer.mlp
            h = layer.layer_norm1(x)
            q, k, v = (proj(h).view(1, n, heads, -1).transpose(1, 2)
                       for proj in (attention.q_proj, attention.k_proj, attention.v_proj))
            if reused is not None:
                k, v = reused.keys[index].index_copy(2, rows, k), reused.values[index].index_copy(2, rows, v)
            keys.append(k)
            values.append(v)
            out = F.scaled_dot_product_attention(q, k, v, scale=attention.scale)
            x = x + attention.out_proj(out.transpose(1, 2).reshape(1, n, -1))
            x = x + mlp.fc2(self.tower_activation(mlp.fc1(layer.layer_norm2(x))))
        features = self.projector(x)
        if reused is not None:
            features = reused.features.index_copy(1, rows, features)
        return TowerCache(tuple(keys), tuple(values), features)

    def text_forward(self, embeddings: torch.Tensor, cache: Any, positions: torch.Tensor,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`DirectLlamaText.text_forward` of the model's text model."""
        return self.llama.text_forward(embeddings, cache, positions, mask)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of (1, heads, q, head_dim) at tables (1, 1, q, head_dim)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin
