"""The KV cache behind a Hugging Face VLA's prefixes.

transformers' caches grow in place, so every prefix made from one prefill shares one cache
(:class:`CacheSlot`), and each use of a prefix first crops it back to its own length (re-feeding, in
the same pass, any of its tokens that a use of another prefix overwrote): decoders may extend,
truncate and extend again in any order while the prefixes themselves stay immutable.
"""

from __future__ import annotations

from typing import Any


class CacheSlot:
    """The one KV cache that a prefill and every prefix made from it share, and the action tokens
    it holds after the observation prefix (those of its latest use). As a prefix's cache
    (:class:`~vla_accel_ros.models.api.PrefixCache`) it crops lazily, on the next use."""

    __slots__ = ("cache", "tokens")

    def __init__(self, cache: Any, tokens: list[int]) -> None:
        self.cache = cache
        self.tokens = tokens

    def cropped(self, length: int) -> CacheSlot:
        return self

    def rows(self, rows: list[int]) -> CacheSlot:
        if rows != [0]:
            raise ValueError(f"a Hugging Face VLA's prefix holds one batch row, not rows {rows}")
        return self


def crop_cache(cache: Any, length: int) -> None:
    """Drop the cache's positions from ``length`` on (``crop`` takes how many to remove, negated)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
