"""The caches behind a token VLA's passes: the KV cache behind its prefixes, and what a vision
tower pass leaves for a later one (:class:`TowerCache`).

transformers' caches grow in place, so every prefix made from one prefill shares one cache
(:class:`CacheSlot`), and each use of a prefix first crops it back to its own length (re-feeding, in
the same pass, any of its tokens that a use of another prefix overwrote): decoders may extend,
truncate and extend again in any order while the prefixes themselves stay immutable. The fast
path's cache (:class:`~.static.StaticKVCache`) is shared the same way and rolls back by length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vla_accel_ros.models.token_vla.static import StaticKVCache

if TYPE_CHECKING:
    import torch


class CacheSlot:
    """The one KV cache that a prefill and every prefix made from it share, and the action tokens
    it holds after the observation prefix (those of its latest use). As a prefix's cache
    (:class:`~vla_accel_ros.models.api.PrefixCache`) it crops lazily, on the next use."""

    __slots__ = ("cache", "generation", "tokens")

    def __init__(self, cache: Any, tokens: list[int]) -> None:
        self.cache = cache
        self.tokens = tokens
        # which claim of a pooled StaticKVCache made this slot (a later prefill may claim it again)
        self.generation = cache.generation if isinstance(cache, StaticKVCache) else 0

    def check_current(self) -> None:
        """ValueError when a later prefill claimed this slot's pooled cache again."""
        if isinstance(self.cache, StaticKVCache) and self.generation != self.cache.generation:
            raise ValueError("this prefix's KV cache was taken by a later prefill (the fast path keeps the "
                             "caches of the last two prefills): prefill again")

    def cropped(self, length: int) -> CacheSlot:
        return self

    def rows(self, rows: list[int]) -> CacheSlot:
        if rows != [0]:
            raise ValueError(f"a Hugging Face VLA's prefix holds one batch row, not rows {rows}")
        return self


@dataclass(frozen=True, eq=False)
class TowerCache:
    """What one tower pass leaves for a later one over some of the patches: every layer's keys and
    values (1, heads, n_patches, head_dim), and the projected features (1, n_patches, d_text) that
    take the image tokens' places."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    features: torch.Tensor


def crop_cache(cache: Any, length: int) -> None:
    """Drop the cache's positions from ``length`` on (a transformers cache's ``crop`` takes how many
    to remove, negated; a :class:`~.static.StaticKVCache` forgets a length)."""
    if isinstance(cache, StaticKVCache):
        cache.roll_back(length)
        return
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
