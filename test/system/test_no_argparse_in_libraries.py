"""The command-line flags live in ``commands/``: no module of ``evaluation/`` or ``training/`` imports
argparse or takes a parsed ``Namespace``; their functions take typed settings."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vla_accel_ros"
LIBRARIES = ("evaluation", "training")


def argparse_uses(path: Path) -> list[str]:
    """Where a module imports argparse (at any depth) or annotates a parameter with a ``Namespace``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "argparse"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "argparse":
            found.append(f"line {node.lineno}: from argparse import ...")
        elif isinstance(node, ast.arg) and node.annotation is not None and "Namespace" in ast.unparse(node.annotation):
            found.append(f"line {node.lineno}: parameter {node.arg}: {ast.unparse(node.annotation)}")
    return found


def test_no_library_module_imports_argparse_or_takes_a_namespace() -> None:
    modules = [path for library in LIBRARIES for path in sorted((PACKAGE / library).rglob("*.py"))]
    assert len(modules) > 10
    wrong = [f"{path.relative_to(PACKAGE.parent)} {use}" for path in modules for use in argparse_uses(path)]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_argparse_import_and_a_namespace_parameter(tmp_path) -> None:
    module = tmp_path / "module.py"
    module.write_text("def f(args: 'argparse.Namespace') -> None:\n    import argparse\n")
    assert set(argparse_uses(module)) == {"line 2: import argparse", "line 1: parameter args: 'argparse.Namespace'"}
