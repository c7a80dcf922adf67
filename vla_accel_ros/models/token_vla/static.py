"""The fast path of a token VLA's text passes: a KV cache preallocated per prefill
(:class:`StaticKVCache`) and fixed-shape passes over it (:class:`StaticText`).

The cache holds every layer's keys and values in rows indexed by position, for the prompt, the
action tokens and the draft tokens a verify pass carries (``SPARE_POSITIONS``). A pass over q
tokens at positions ``start .. start + q - 1`` writes their rows and attends, by position, to every
row at or before each token's own; the rows beyond are never read, so a rollback is forgetting a
length and nothing is reallocated per step. The prefill (q = the prompt's length, with the action
tokens that ride along), the 1-token step and the k-token verify pass each have a fixed shape: on
CUDA each is recorded once per shape as a CUDA graph (:class:`~vla_accel_ros.models.cuda_graph.CudaGraphs`)
and replayed, the vision towers and projector too, attending over every row of the cache (the rows
not yet written masked); on the CPU the same passes run eagerly, attending over the rows up to the
last one written under the DynamicCache path's causal mask: its arithmetic.

Each prefill claims the next cache of a small pool (``POOL_SIZE``, so a prefix of the previous
prefill stays usable while the next one runs): a prefix whose cache a later prefill claimed
again is refused with a ValueError rather than read stale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from vla_accel_ros.models.cuda_graph import CudaGraphs


class StaticTextModel(Protocol):
    """A text model that runs over a preallocated cache (a family's direct forward, e.g.
    :class:`~vla_accel_ros.models.hf.direct.DirectLlamaText`): its shape and its fixed-shape pass."""

    cos: torch.Tensor
    n_layers: int
    kv_heads: int
    head_dim: int

    def static_forward(self, embeddings: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                       positions: torch.Tensor, visible: int | None) -> torch.Tensor: ...

SPARE_POSITIONS = 8  # beyond the prompt and the action: the draft tokens a verify pass may carry
CAPACITY_STEP = 64  # capacities are rounded up to it: prompts of similar length share a cache and its graphs
POOL_SIZE = 2


class StaticKVCache:
    """Keys and values (1, kv_heads, capacity, head_dim) of every layer, row p holding position p;
    ``length`` positions are held. ``generation`` counts the prefills that claimed it."""

    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, capacity: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        shape = (1, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.length = 0
        self.generation = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def get_seq_length(self) -> int:
        return self.length

    def roll_back(self, length: int) -> None:
        """Forget the positions from ``length`` on."""
        self.length = min(self.length, length)

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` positions, the rows held kept (new tensors: graphs recorded on the
        old ones no longer apply)."""
        for rows in (self.keys, self.values):
            for index, old in enumerate(rows):
                new = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
                new[:, :, :old.shape[2]] = old
                rows[index] = new

    def held_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every layer's held keys and values (1, kv_heads, length, head_dim)."""
        n = self.length
        return [(k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in zip(self.keys, self.values, strict=True)]


def rounded_capacity(positions: int) -> int:
    return -(-positions // CAPACITY_STEP) * CAPACITY_STEP


class StaticText:
    """The text model ``text`` (:class:`~vla_accel_ros.models.hf.direct.DirectLlamaText`) over a pool
    of :class:`StaticKVCache` (module docstring); ``graphs``: record each pass as a CUDA graph.
    ``errors``: why a pass runs eagerly on CUDA (empty while every pass replays)."""

    def __init__(self, text: StaticTextModel, device: torch.device, dtype: torch.dtype, *, graphs: bool) -> None:
        self.text = text
        self.device, self.dtype = device, dtype
        self.graphs = graphs
        self._pool: list[StaticKVCache] = []
        self._recorders: list[CudaGraphs | None] = []
        self._next = 0
        self._positions = torch.arange(len(text.cos), device=device)  # sliced per pass: no tensor made per step

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self._recorders if r is not None and r.error]

    def claim(self, positions: int) -> StaticKVCache:
        """The pool's next cache, emptied, with room for ``positions`` and the spare ones."""
        needed = rounded_capacity(positions + SPARE_POSITIONS)
        index = self._next
        self._next = (index + 1) % POOL_SIZE
        if index == len(self._pool):
            text = self.text
            self._pool.append(StaticKVCache(text.n_layers, text.kv_heads, text.head_dim, needed, self.device,
                                            self.dtype))
            self._recorders.append(None)
        cache = self._pool[index]
        if cache.capacity < needed:
            cache.grow(needed)
            self._recorders[index] = None
        cache.length = 0
        cache.generation += 1
        return cache

    def run(self, cache: StaticKVCache, embeddings: torch.Tensor) -> torch.Tensor:
        """Final hidden states (1, q, d) over embeddings (1, q, d) right after the cache's ``length``
        positions, which then include them."""
        start, q = cache.length, embeddings.shape[1]
        index = self._pool.index(cache)
        if start + q > cache.capacity:  # more tokens than an action and its drafts: room made, graphs dropped
            cache.grow(rounded_capacity(start + q + SPARE_POSITIONS))
            self._recorders[index] = None
        positions = self._positions[start:start + q]
        if self.graphs:  # over every row: one shape per q
            recorder = self._recorders[index]
            if recorder is None:
                recorder = self._recorders[index] = CudaGraphs(self._pass_over(cache), torch.Tensor.clone)
            hidden = recorder(embeddings, positions)
        else:
            hidden = self.text.static_forward(embeddings, cache.keys, cache.values, positions, start + q)
        cache.length = start + q
        return hidden

    def _pass_over(self, cache: StaticKVCache) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        keys, values = cache.keys, cache.values  # the lists the recorded graph writes into
        return lambda embeddings, positions: self.text.static_forward(embeddings, keys, values, positions, None)
