"""Transformer layers the model families share: self-attention that extends a KV cache or recomputes
selected tokens of a sequence, the MLP, and the pre-LN block, written for CPU inference (the
kernels of :mod:`vla_accel_ros.models.kernels`, no nn.Module call dispatch on the hot path)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.models.kernels import dense, layer_norm

KVCache = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer (k, v), each (B, H, L, hd)
KeysValues = torch.Tensor  # one layer's keys and values stacked: (2, B, H, L, hd)


@functools.lru_cache(maxsize=64)
def extension_mask(new: int, past: int, device: torch.device) -> torch.Tensor:
    """(new, past + new) bool: new token i sees the cache and new tokens 0..i (a bottom-right
    aligned causal mask). Cached, as every layer of every verify pass asks for the same few shapes;
    callers only read it. Made outside inference mode, so that autograd may use it too."""
    with torch.inference_mode(False):
        return torch.ones(new, past + new, dtype=torch.bool, device=device).tril(diagonal=past)


class Attention(nn.Module):
    """Multi-head self-attention that extends a KV cache or recomputes selected tokens of a sequence."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | KeysValues | None = None,
        causal: bool = True,
        key_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        n_outputs: int | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | KeysValues]:
        """Self-attention over x (B, t, d) -> (outputs, keys and values), in one of two modes.

        Extending (``positions`` None): x are t tokens after ``past``, the cached (k, v), each
        (B, H, L, hd) (None: L = 0). Causal unless ``causal`` is False; ``key_mask`` (B, L + t) bool,
        True where a key may be attended to (non-causal use only). Returns the outputs (B, t, d)
        and the extended (k, v).

        Recomputing selected tokens (``positions`` (s,) long): ``past`` holds the keys and values
        (2, B, H, L, hd) of a whole sequence as last computed, and x's first s rows are its tokens
        at ``positions``, whose new keys and values replace theirs; x's other rows are new tokens
        after the sequence, whose keys and values are appended. Every row attends to every key, or
        where ``attn_mask`` (t, keys) bool allows. With ``n_outputs`` only the last ``n_outputs``
        rows get outputs (the others contribute their keys and values alone). Returns the outputs
        (B, n_outputs or t, d) and the keys and values, stacked like ``past`` (a new tensor).
        """
        b, t, d = x.shape
        layers = self._modules  # see Block.forward
        qkv = dense(x, layers["qkv"]).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if positions is not None:
            assert isinstance(past, torch.Tensor), "recomputing selected tokens needs the stacked keys and values"
            selected = len(positions)
            keys_values = past.index_copy(3, positions, qkv[1:, :, :, :selected])  # keys and values in one copy
            if selected < t:  # new tokens after the sequence
                keys_values = torch.cat([keys_values, qkv[1:, :, :, selected:]], dim=3)
            q = qkv[0]
            if n_outputs is not None:
                q = q[:, :, t - n_outputs :]
                attn_mask = None if attn_mask is None else attn_mask[t - n_outputs :]
            y = F.scaled_dot_product_attention(q, keys_values[0], keys_values[1], attn_mask=attn_mask)
            return dense(y.transpose(1, 2).reshape(b, q.shape[2], d), layers["proj"]), keys_values
        q, k, v = qkv
        past_len = 0
        if past is not None:
            past_len = past[0].shape[2]
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        if key_mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        elif not causal or t == 1:
            y = F.scaled_dot_product_attention(q, k, v)  # one new token sees the whole cache
        elif past_len == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=extension_mask(t, past_len, x.device))
        return dense(y.transpose(1, 2).reshape(b, t, d), layers["proj"]), (k, v)


class MLP(nn.Module):
    def __init__(self, d_model: int, ratio: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, ratio * d_model)
        self.proj = nn.Linear(ratio * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = self._modules  # see Block.forward
        return dense(dense(x, layers["fc"], gelu=True), layers["proj"])


class Block(nn.Module):
    """Pre-LN transformer block."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio)

    def forward(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | KeysValues | None = None,
        causal: bool = True,
        key_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        n_outputs: int | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | KeysValues]:
        """The block over x (B, t, d) -> (outputs, keys and values): tokens after a KV cache, or
        (``positions`` given) selected tokens of a sequence recomputed against its keys and values;
        the arguments and results are those of :meth:`Attention.forward`."""
        # Submodules from the module's own dict, their forward called directly and the layer norms
        # through the kernel: on the dozen tokens of an incremental prefill, nn.Module's attribute
        # lookups and call dispatch cost a measurable share of a block's time (so the submodules'
        # hooks are not run).
        layers = self._modules
        a, kv = layers["attn"].forward(layer_norm(layers["ln1"], x), past, causal, key_mask, positions, attn_mask,
                                       n_outputs)
        if n_outputs is not None:
            x = x[:, x.shape[1] - n_outputs :]
        x = x + a
        return x + layers["mlp"].forward(layer_norm(layers["ln2"], x)), kv
