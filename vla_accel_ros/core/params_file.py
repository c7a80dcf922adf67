"""ROS 2 parameter files (``--params-file``) read without ROS.

A file maps node names to ``{ros__parameters: {...}}``. A section applies to a node when its key is
the node's fully qualified name (``/ns/node``, ``ns/node``, or ``node`` in the root namespace),
when namespaces nest as YAML mappings (``ns: {node: {ros__parameters: ...}}``), or when it is a
wildcard (``/**`` every node; ``*`` one name part, ``**`` any number of them). Wildcard sections
apply first, then the node's own, as rclpy applies them; nested mappings flatten to dotted names
(``a: {b: 1}`` is ``a.b``), as ROS declares them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

PARAMS_KEY = "ros__parameters"
# Parameters every rclpy node has: a params file may set them, no config of ours holds them.
ROS_BUILTIN_PARAMETERS = ("use_sim_time", "start_type_description_service")


def fully_qualified_name(node_name: str, namespace: str = "") -> str:
    """``/ns/node`` (``/node`` in the root namespace)."""
    parts = [p for p in namespace.strip("/").split("/") if p] + [node_name.strip("/")]
    return "/" + "/".join(parts)


def _pattern(key: str) -> re.Pattern[str]:
    parts = []
    for part in key.strip("/").split("/"):
        if part == "**":
            parts.append("(?:/[^/]+)*")
        else:
            parts.append("/" + "[^/]*".join(re.escape(p) for p in part.split("*")))
    return re.compile("".join(parts))


def _sections(data: dict[Any, Any], prefix: str, path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(node key with its namespaces, parameters) for each section, in file order."""
    for key, value in data.items():
        name = f"{prefix}/{str(key).strip('/')}"
        if not isinstance(value, dict):
            continue
        if PARAMS_KEY in value:
            params = value[PARAMS_KEY]
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise ValueError(f"parameter file {path}: '{key}: {PARAMS_KEY}' must be a mapping, "
                                 f"got {type(params).__name__}")
            yield name, params
        else:
            yield from _sections(value, name, path)


def _flatten(params: dict[Any, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def read_node_parameters(path: str | Path, node_name: str, namespace: str = "") -> dict[str, Any]:
    """The parameters that the ROS 2 parameter file ``path`` gives the node ``namespace/node_name``.

    Raises ValueError naming the file when it is missing or unreadable, is not YAML, or holds no
    section (the node's own or a wildcard) for that node."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"parameter file {path}: cannot read it: {err}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"parameter file {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):  # a bad file, as any other: ValueError
        raise ValueError(f"parameter file {path} must map node names to {{{PARAMS_KEY}: ...}}, "  # noqa: TRY004
                         f"got {type(data).__name__}")
    fqn = fully_qualified_name(node_name, namespace)
    sections = list(_sections(data, "", path))
    wildcard = [params for key, params in sections if "*" in key and _pattern(key).fullmatch(fqn)]
    own = [params for key, params in sections if "*" not in key and key == fqn]
    if not wildcard and not own:
        keys = ", ".join(key for key, _ in sections) or "none"
        raise ValueError(f"parameter file {path} has no section for node {fqn} (sections: {keys}); expected "
                         f"'{fqn}: {{{PARAMS_KEY}: ...}}' or '/**: {{{PARAMS_KEY}: ...}}'")
    merged: dict[str, Any] = {}
    for params in wildcard + own:
        merged.update(_flatten(params))
    return merged
