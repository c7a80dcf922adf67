"""``JsonConfig``: the JSON round trip shared by the frozen config dataclasses stored in checkpoints."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, TypeVar

T = TypeVar("T", bound="JsonConfig")


class JsonConfig:
    """Mixin for a dataclass: ``to_dict`` for the JSON file, ``from_dict`` that refuses unknown keys
    (a typo in a hand-edited file must not silently fall back to a default)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))  # type: ignore[attr-defined]
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {unknown}")
        return cls(**data)
