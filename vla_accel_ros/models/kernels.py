"""The CPU kernels of the model's products: a linear layer on oneDNN's fused kernel or MKL's, chosen by
its size, and a layer norm without the module call's overhead.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

# Inference runs a linear layer on oneDNN's kernel rather than MKL's from this many rows and this
# product (rows x in x out): on the AVX-512 CPUs measured here (AMD EPYC) MKL takes its AVX2 path,
# and oneDNN ran the prefill's matrices (64 to 1024 rows) twice as fast. Below, MKL's lower call
# overhead wins: a decode step's single token took 4 against 12 microseconds, and the incremental
# prefill's dozen-row products, all on MKL, ran 6% faster in the closed loop than with oneDNN for
# the larger of them (its code then competes with MKL's for the cache).
ONEDNN_MIN_ROWS = 32
ONEDNN_MIN_MACS = 1 << 20


@functools.cache
def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's fused linear (CPU builds with mkldnn do)."""
    try:
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 3), torch.zeros(4, 3), None, "none", [], "")
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return True


def _onednn_weight(layer: nn.Linear) -> torch.Tensor:
    """The layer's weight in oneDNN's own layout (5% off every large product), kept on the layer
    and made again when the weight changes (an optimiser step or load_state_dict bumps its version)."""
    weight = layer.weight
    cached = layer.__dict__.get("_onednn_weight")
    if cached is None or cached[0] != weight._version or cached[1] != weight.data_ptr():
        with torch.inference_mode():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 64)
        cached = layer.__dict__["_onednn_weight"] = (weight._version, weight.data_ptr(), packed)
    return cached[2]


def dense(x: torch.Tensor, layer: nn.Linear, gelu: bool = False) -> torch.Tensor:
    """``layer(x)``, then GELU when ``gelu``. Without autograd, large products on the CPU go to
    oneDNN's kernel (the GELU fused into it); the result is the same up to float rounding."""
    # The parameters from the module's own dict: nn.Module's attribute lookup costs 0.5 us each,
    # a fifth of a small product's time on the incremental prefill's dozen rows.
    params = layer._parameters
    weight, bias = params["weight"], params["bias"]
    rows = x.numel() // x.shape[-1]
    if (rows >= ONEDNN_MIN_ROWS and rows * weight.shape[0] * weight.shape[1] >= ONEDNN_MIN_MACS
            and not torch.is_grad_enabled() and x.is_cpu and onednn_linear_available()):
        if gelu:
            return torch.ops.mkldnn._linear_pointwise(x, _onednn_weight(layer), bias, "gelu", [], "none")
        return torch.ops.mkldnn._linear_pointwise(x, _onednn_weight(layer), bias, "none", [], "")
    y = F.linear(x, weight, bias)
    return F.gelu(y) if gelu else y


def layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` without the module call and its attribute lookups (see :func:`dense`)."""
    params = norm._parameters
    return torch.layer_norm(x, norm.normalized_shape, params["weight"], params["bias"], norm.eps)
