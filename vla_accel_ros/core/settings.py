"""Typed settings: frozen dataclasses whose fields carry their ROS documentation (a description and a
numeric range or a set of choices), validated on construction with messages that name the
parameter, and mapped to and from ROS parameters and YAML parameter files. A field may hold another
settings dataclass (:func:`nested`) whose fields are flat parameters of the enclosing one, so a
config can group related settings while the ROS interface stays a flat list. Importable without
rclpy or torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

import yaml


class ConfigError(ValueError):
    """A setting is missing, of the wrong type or out of range; the message names it."""


Choices = tuple[str, ...] | Callable[[], tuple[str, ...]]


def setting(default: Any, description: str, *, range: tuple[float, float] | None = None,
            choices: Choices | None = None, dynamic: bool = False, kw_only: bool = False) -> Any:
    """A dataclass field documented for ROS: description, numeric range or choices (a tuple, or a
    function returning one where a registry decides them when the parameter is checked)."""
    meta = {"description": description, "range": range, "choices": choices, "dynamic": dynamic}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta, kw_only=kw_only)
    return field(default=default, metadata=meta, kw_only=kw_only)


@dataclass(frozen=True)
class _Group:
    """How a nested settings field names its sub-fields as flat parameters."""

    prefix: str
    names: Mapping[str, str]

    def name(self, field_name: str) -> str:
        return self.names.get(field_name, self.prefix + field_name)


def nested(default: Any, *, prefix: str = "", names: Mapping[str, str] | None = None) -> Any:
    """A dataclass field holding another settings dataclass whose fields are flat parameters of the
    enclosing one: each is named ``prefix`` + its field name, or what ``names`` maps its field name to.
    ``default`` (an instance of a frozen settings dataclass) gives the parameters' defaults; the
    descriptions, ranges and choices come from the nested class's own fields."""
    names = dict(names or {})
    unknown = sorted(set(names) - {f.name for f in dataclasses.fields(default)})
    if unknown:
        raise TypeError(f"nested(): {type(default).__name__} has no field(s) {', '.join(unknown)}")
    return field(default_factory=lambda: default, metadata={"group": _Group(prefix, names)})


@dataclass(frozen=True)
class ParamSpec:
    """What a node needs to declare one parameter."""

    name: str
    kind: type  # bool, int, float, str or tuple (string array)
    default: Any
    description: str
    range: tuple[float, float] | None
    choices: tuple[str, ...] | None
    dynamic: bool


@dataclass(frozen=True)
class _Leaf:
    """One flat parameter: where its value lives in a (possibly nested) config and how it is checked."""

    name: str
    path: tuple[str, ...]  # attribute names from the outer config down to the value
    kind: type
    default: Any
    metadata: Mapping[str, Any]


def _kind(hint: Any) -> type:
    return tuple if getattr(hint, "__origin__", None) is tuple else hint


_HINTS: dict[type, dict[str, Any]] = {}  # config class -> its resolved field types, read once
_LEAVES: dict[type, tuple[_Leaf, ...]] = {}  # config class -> its flat parameters, walked once


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    factory: Callable[[], Any] = f.default_factory  # type: ignore[assignment]  # MISSING only with a default
    return factory()


def _renamed(rename: Callable[[str], str], group: _Group) -> Callable[[str], str]:
    """The flat parameter names of a nested group's fields, under the enclosing config's renaming."""
    return lambda name: rename(group.name(name))


def _walk(cls: type, defaults: Any, rename: Callable[[str], str], path: tuple[str, ...]) -> list[_Leaf]:
    leaves = []
    for f in dataclasses.fields(cls):
        value = getattr(defaults, f.name) if defaults is not None else _default(f)
        group = f.metadata.get("group")
        if group is None:
            leaves.append(_Leaf(rename(f.name), (*path, f.name), _kind(_hints(cls)[f.name]), value, f.metadata))
        else:
            leaves += _walk(_hints(cls)[f.name], value, _renamed(rename, group), (*path, f.name))
    return leaves


def _leaves(cls: type) -> tuple[_Leaf, ...]:
    """Every flat parameter of config class ``cls``, nested ones in place, in declaration order."""
    if cls not in _LEAVES:
        _LEAVES[cls] = _walk_leaves(cls)
    return _LEAVES[cls]


def _walk_leaves(cls: type) -> tuple[_Leaf, ...]:
    leaves = _walk(cls, None, lambda name: name, ())
    names = [leaf.name for leaf in leaves]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TypeError(f"{cls.__name__} maps several fields to parameter(s) {', '.join(duplicates)}")
    return tuple(leaves)


def _checked(name: str, value: Any, kind: type, metadata: Mapping[str, Any]) -> Any:
    """``value`` of parameter ``name`` normalised (int -> float, list -> tuple), or ConfigError."""
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"parameter '{name}' must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"parameter '{name}' must be finite, got {value!r}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"parameter '{name}' must be an integer, got {value!r}")
    elif kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"parameter '{name}' must be true or false, got {value!r}")
    elif kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"parameter '{name}' must be a string, got {value!r}")
    else:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"parameter '{name}' must be a list of strings, got {value!r}")
        value = tuple(value)
    lo_hi = metadata.get("range")
    if lo_hi is not None and not (lo_hi[0] <= value <= lo_hi[1]):
        raise ConfigError(f"parameter '{name}' = {value!r} is out of range [{lo_hi[0]}, {lo_hi[1]}]: "
                          f"{metadata['description']}")
    choices = _choices(metadata)
    if choices is not None and value not in choices:
        raise ConfigError(f"parameter '{name}' = {value!r} is not one of {', '.join(choices)}")
    return value


def _choices(metadata: Mapping[str, Any]) -> tuple[str, ...] | None:
    choices = metadata.get("choices")
    return choices() if callable(choices) else choices


def check_fields(cfg: Any) -> None:
    """Type and range checks shared by every config class (called from ``__post_init__``); the
    fields of a :func:`nested` config are checked too, each under its flat parameter name."""
    _check(cfg, lambda name: name)


def _check(cfg: Any, rename: Callable[[str], str]) -> None:
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        hint = _hints(type(cfg))[f.name]
        group = f.metadata.get("group")
        if group is None:
            object.__setattr__(cfg, f.name, _checked(rename(f.name), value, _kind(hint), f.metadata))
            continue
        if not isinstance(value, hint):
            raise ConfigError(f"setting '{f.name}' must be a {hint.__name__}, got {value!r}")
        _check(value, _renamed(rename, group))


C = TypeVar("C")


def parameter_specs(cls: type) -> list[ParamSpec]:
    """One :class:`ParamSpec` per parameter of a config dataclass, in declaration order (a nested
    config's parameters where it is declared)."""
    return [ParamSpec(leaf.name, leaf.kind, leaf.default, leaf.metadata["description"], leaf.metadata.get("range"),
                      _choices(leaf.metadata), leaf.metadata.get("dynamic", False)) for leaf in _leaves(cls)]


def from_params(cls: type[C], params: Mapping[str, Any]) -> C:
    """Build a config from a ``{name: value}`` mapping (ROS parameters or YAML); unknown names are errors.
    Each value is checked under its parameter name before any config is built from it."""
    leaves = {leaf.name: leaf for leaf in _leaves(cls)}
    unknown = sorted(set(params) - set(leaves))
    if unknown:
        raise ConfigError(f"unknown parameter(s) for {cls.__name__}: {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(leaves))}")
    values = {leaves[name].path: _checked(name, value, leaves[name].kind, leaves[name].metadata)
              for name, value in params.items()}
    return _build(cls, values, None)


def _build(cls: type[C], values: Mapping[tuple[str, ...], Any], defaults: Any) -> C:
    """``cls`` from the values by attribute path; fields without one keep ``defaults``' values (or the
    field defaults)."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.metadata.get("group") is None:
            if (f.name,) in values:
                kwargs[f.name] = values[(f.name,)]
            continue
        inner = {path[1:]: v for path, v in values.items() if path[0] == f.name}
        if inner:
            base = getattr(defaults, f.name) if defaults is not None else _default(f)
            kwargs[f.name] = _build(_hints(cls)[f.name], inner, base)
    return dataclasses.replace(defaults, **kwargs) if defaults is not None else cls(**kwargs)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def to_params(cfg: Any) -> dict[str, Any]:
    """The config as flat plain ROS/YAML values (string arrays as lists)."""
    params = {}
    for leaf in _leaves(type(cfg)):
        value = cfg
        for attr in leaf.path:
            value = getattr(value, attr)
        params[leaf.name] = _plain(value)
    return params


def changed_params(cfg: Any) -> dict[str, Any]:
    """The parameters of ``cfg`` that differ from their declared defaults (as :func:`to_params`):
    what a node's command line sets for the node to hold ``cfg``."""
    defaults = {leaf.name: _plain(leaf.default) for leaf in _leaves(type(cfg))}
    return {name: value for name, value in to_params(cfg).items() if value != defaults[name]}


def dump_yaml_params(cfg: Any, node_name: str) -> str:
    """A ros2 parameter file for one node holding every setting of ``cfg``."""
    return yaml.safe_dump({node_name: {"ros__parameters": to_params(cfg)}}, sort_keys=False)


def parse_r_bounds(text: str) -> tuple[int, int]:
    """"2:6" -> (2, 6): the command-line form of a threshold's bounds 0 <= R_MIN <= R_MAX in token bins
    (an argparse ``type``; argparse.ArgumentTypeError, with the reason, otherwise)."""
    try:
        low, high = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"R_MIN:R_MAX with two integers, got {text!r}") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"R_MIN:R_MAX with 0 <= R_MIN <= R_MAX, got {text!r}")
    return low, high
