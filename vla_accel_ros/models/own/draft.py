"""EAGLE-style draft head, its parallel (Medusa-style) variant, and the contact head.

The draft predicts the target's next *feature* (final-norm hidden state) from the current feature
and the token sampled from it: f_{j+1} ~ draft(fc([emb(x_{j+1}) ; f_j])), then reads the token
with the target's own LM head. It owns no embedding or LM head: both are the target's (frozen).
Its one light layer cross-attends to the target's last-layer KV cache of the prefix, which gives
it the scene and the action tokens already accepted, and it adds an embedding of the index of
the action dimension it is predicting (the 7 dimensions have very different statistics).

:class:`ParallelDraftHead` is the same network trained to propose all remaining positions in one
call instead of one sequential step per token (see its docstring).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vla_accel_ros.models.layers import MLP
from vla_accel_ros.models.own.config import VLAConfig


class DraftHead(nn.Module):
    def __init__(self, config: VLAConfig) -> None:
        super().__init__()
        d = config.d_model
        self.config = config  # the target's: the head is built for it and stored with it
        self.n_heads = config.n_heads
        self.fc = nn.Linear(2 * d, d)
        self.index_emb = nn.Embedding(config.n_action_tokens, d)
        self.ln_q = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        self.ln_mlp = nn.LayerNorm(d)
        self.mlp = MLP(d, config.draft_mlp_ratio)
        self.ln_out = nn.LayerNorm(d)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def forward(
        self,
        token_emb: torch.Tensor,
        feature: torch.Tensor,
        index: torch.Tensor,
        memory: tuple[torch.Tensor, torch.Tensor],
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One draft step for S independent queries.

        token_emb, feature: (B, S, d); index: (S,) action dimension each query predicts (0..6);
        memory: the target's last-layer (k, v), each (B, H, L, hd); memory_mask: optional (S, L) bool,
        True where a query may look. Returns predicted features (B, S, d) in the target's
        final-norm space.
        """
        b, s, d = feature.shape
        x = self.fc(torch.cat([token_emb, feature], dim=-1)) + self.index_emb(index)
        q = self.q_proj(self.ln_q(x)).view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)
        k, v = memory
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=memory_mask)
        x = x + self.out_proj(a.transpose(1, 2).reshape(b, s, d))
        x = x + self.mlp(self.ln_mlp(x))
        return self.ln_out(x)


class ParallelDraftHead(DraftHead):
    """A :class:`DraftHead` trained to propose every remaining action token in ONE call.

    The sequential head runs one step per token, each reading the feature it predicted last, so
    n tokens cost n - 1 dependent light forwards (about 0.2 ms each). This head reads the same
    inputs for every position: after j consumed tokens, the query for position i (j < i <= 6) is
    (emb(x_j), f_j, index i), where f_j is the target's final-norm feature at the prefix end and
    x_j its greedy token (the LM head of f_j, free), over the target's last-layer KV of the prefix.
    All queries are independent, so one forward with S = n - 1 queries proposes them all (about
    the cost of a single sequential step). The index embedding is what tells the queries apart.

    The architecture, and so the weights' layout, is exactly :class:`DraftHead`'s; only the
    training differs (``vla-accel train-parallel-draft``), which is why it can start from the
    sequential head's weights (:meth:`from_sequential`).
    """

    @classmethod
    def from_sequential(cls, config: VLAConfig, draft: DraftHead) -> ParallelDraftHead:
        """A parallel head starting from a trained sequential head's weights: its layer already
        maps (token, feature, index) to the next feature, the parallel task's first position."""
        head = cls(config)
        head.load_state_dict(draft.state_dict())
        return head


class ContactHead(nn.Module):
    """P(near contact) from pooled prefix features: a two-layer MLP returning a logit."""

    def __init__(self, config: VLAConfig) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(config.d_model, config.contact_hidden), nn.GELU(), nn.Linear(config.contact_hidden, 1)
        )

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.net(pooled).squeeze(-1)
