"""The package's shape, read from its source without running it:

- no method under ``models/`` whose body only raises (a policy declares its capabilities and
  implements each in full; nothing exists only to say "not supported");
- no ``type: ignore`` in ``runtime/`` or ``decoding/`` (a capability is reached through its ``as_*``
  accessor, typed);
- ``models/load.py``, the registry, names no family (no string literal or identifier equal to a
  registered family's name);
- no module over 500 lines; ``ros/node.py`` and ``core/controller.py`` at most 450;
- every family folder (a package under ``models/`` with a ``family.py``) has the same files.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vla_accel_ros"
MODELS = PACKAGE / "models"
MAX_LINES = 500
THIN_MODULES = {"ros/node.py": 450, "core/controller.py": 450}  # the node is an adapter; the controller one tick
FAMILY_FILES = ("__init__.py", "family.py", "config.py", "policy.py", "README.md")
LOCAL_FAMILY_FILES = ("modules.py", "checkpoint.py")  # a family whose model runs here, not behind a server


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:]
    return body


def test_no_method_under_models_only_raises() -> None:
    stubs = []
    for path in sorted(MODELS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            for method in node.body:
                if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                body = _without_docstring(method.body)
                if body and all(isinstance(statement, ast.Raise) for statement in body):
                    stubs.append(f"{_relative(path)}:{method.lineno} {node.name}.{method.name}")
    assert not stubs, "methods that only raise (declare the capability instead):\n" + "\n".join(stubs)


@pytest.mark.parametrize("layer", ["runtime", "decoding"])
def test_no_type_ignore(layer: str) -> None:
    found = [f"{_relative(path)}:{number}: {line.strip()}"
             for path in sorted((PACKAGE / layer).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if "type: ignore" in line]
    assert not found, f"type: ignore in {layer}/:\n" + "\n".join(found)


def test_the_registry_names_no_family() -> None:
    from vla_accel_ros.models.load import families

    names = {family.name for family in families()}
    assert {"own", "hf", "oft", "openvla", "lerobot", "openpi"} <= names
    path = MODELS / "load.py"
    named = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = [node.value]
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.alias):
            words = [node.asname or node.name, *node.name.split(".")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            words = node.module.split(".")
        else:
            continue
        named += [f"line {node.lineno}: {word!r}" for word in words if word in names]
    assert not named, "models/load.py names a family:\n" + "\n".join(named)


def test_no_module_is_too_long() -> None:
    lengths = {_relative(path): len(path.read_text().splitlines()) for path in sorted(PACKAGE.rglob("*.py"))}
    too_long = [f"{name}: {lines} lines (at most {THIN_MODULES.get(name, MAX_LINES)})"
                for name, lines in lengths.items() if lines > THIN_MODULES.get(name, MAX_LINES)]
    assert set(THIN_MODULES) <= set(lengths)
    assert not too_long, "modules over their length:\n" + "\n".join(too_long)


def _family_folders() -> list[str]:
    return sorted(folder.name for folder in MODELS.iterdir() if (folder / "family.py").is_file())


def test_the_family_folders_are_found() -> None:
    assert {"own", "hf", "oft", "openvla", "lerobot", "openpi"} <= set(_family_folders())


@pytest.mark.parametrize("folder", _family_folders())
def test_every_family_folder_has_the_same_files(folder: str) -> None:
    family = importlib.import_module(f"vla_accel_ros.models.{folder}.family").FAMILY
    wanted = FAMILY_FILES if family.remote else FAMILY_FILES + LOCAL_FAMILY_FILES
    missing = [name for name in wanted if not (MODELS / folder / name).is_file()]
    assert not missing, f"models/{folder}/ (family {family.name!r}) lacks {', '.join(missing)}"
