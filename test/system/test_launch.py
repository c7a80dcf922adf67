"""Launch files: real launch_ros files whose arguments are documented and whose files and
executables exist. The static checks always run; loading them needs launch_ros (skipped without)."""

from __future__ import annotations

import ast
import configparser
import importlib.util
import re
from glob import glob
from pathlib import Path

import pytest

from vla_accel_ros.core.settings import load_yaml_params, parameter_specs
from vla_accel_ros.ros.parameters import NodeConfig, SimBridgeConfig

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "vla_accel_ros"
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))
REQUIRED_ARGS = {
    "vla_accel.launch.py": {"params_file", "robot_description", "urdf_file", "image_topic", "joint_states_topic",
                            "output", "controller", "use_sim_time", "decoder", "temperature"},
    "sim.launch.py": {"params_file", "use_sim_time", "decoder", "temperature", "control_rate_hz"},
}
NODE_CONFIG = {"vla_accel_node": NodeConfig, "sim_node": SimBridgeConfig}


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


def _kw(call: ast.Call, key: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == key), None)


def _console_scripts() -> dict[str, str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    scripts: dict[str, str] = {}
    for const in ast.walk(tree):
        if isinstance(const, ast.Constant) and isinstance(const.value, str) and " = " in const.value and ":" in const.value:
            name, target = (s.strip() for s in const.value.split("=", 1))
            scripts[name] = target
    return scripts


def test_launch_files_exist():
    assert {p.name for p in LAUNCH_FILES} >= set(REQUIRED_ARGS)


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_arguments_are_declared_documented_and_used(path):
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    declared = {}
    for call in _calls(tree, "DeclareLaunchArgument"):
        name = call.args[0].value
        description = _kw(call, "description")
        assert isinstance(description, ast.Constant) and len(description.value) > 10, f"{name} undocumented"
        declared[name] = call
    used = {c.args[0].value for c in _calls(tree, "LaunchConfiguration")}
    assert used <= set(declared), f"undeclared: {used - set(declared)}"
    assert set(declared) <= used, f"declared but unused: {set(declared) - used}"
    assert REQUIRED_ARGS[path.name] <= set(declared)


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_nodes_reference_installed_executables_and_share_files(path):
    tree = ast.parse(path.read_text())
    scripts = _console_scripts()
    nodes = _calls(tree, "Node")
    assert nodes
    for call in nodes:
        package, executable = _kw(call, "package"), _kw(call, "executable")
        assert (getattr(package, "id", None) == "PACKAGE") or getattr(package, "value", None) == PACKAGE
        assert executable.value in scripts, f"{executable.value} is not a console script in setup.py"
        module, func = scripts[executable.value].split(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin and f"def {func}(" in Path(spec.origin).read_text()
        name = _kw(call, "name").value
        assert name in NODE_CONFIG
        # Every parameter given by name in the launch file is one the node declares.
        declared = {s.name for s in parameter_specs(NODE_CONFIG[name])} | {"use_sim_time"}
        for params in _kw(call, "parameters").elts:
            if isinstance(params, ast.Dict):
                keys = {k.value for k in params.keys if isinstance(k, ast.Constant)}
                assert keys <= declared, keys - declared
    # setup.cfg installs the console scripts where `ros2 run/launch` look: lib/<package>.
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["install"]["install_scripts"] == f"$base/lib/{PACKAGE}"
    # Share files named through FindPackageShare exist and are installed by setup.py's data_files.
    installed = {"launch": "*.launch.py", "config": "*.yaml", "urdf": "*.urdf"}
    for join in _calls(tree, "PathJoinSubstitution"):
        parts = join.args[0].elts
        if _calls(parts[0], "FindPackageShare"):
            rel = Path(*[p.value for p in parts[1:]])
            assert (ROOT / rel).is_file(), rel
            assert str(ROOT / rel) in {str(ROOT / p) for p in glob(str(ROOT / rel.parts[0] / installed[rel.parts[0]]))}


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_default_parameter_files_hold_the_launched_nodes(path):
    text = path.read_text()
    launched = {_kw(call, "name").value for call in _calls(ast.parse(text), "Node")}
    for yaml_name in re.findall(r'"config", "([^"]+\.yaml)"', text):
        for node in launched:
            params = load_yaml_params(ROOT / "config" / yaml_name, node)
            assert params, f"{yaml_name} has no section for {node}"
            from vla_accel_ros.core.settings import from_params

            from_params(NODE_CONFIG[node], params)


def test_xacro_output_is_passed_as_a_string_parameter():
    tree = ast.parse((ROOT / "launch" / "vla_accel.launch.py").read_text())
    values = _calls(tree, "ParameterValue")
    assert any(_calls(v, "Command") and getattr(_kw(v, "value_type"), "id", None) == "str" for v in values)


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_description_loads_with_launch_ros(path):
    pytest.importorskip("launch_ros", reason="launch_ros is not installed (no PyPI wheel); static checks ran")
    from launch import LaunchDescription

    spec = importlib.util.spec_from_file_location(path.stem.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.generate_launch_description(), LaunchDescription)
