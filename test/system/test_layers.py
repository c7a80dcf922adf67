"""The package's layers: imports point downward only and never in a circle, no module reaches another's
private names or a command module, everything below ``ros/`` imports with rclpy made unimportable,
``core/`` with every ROS package made unimportable, and the settings without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vla_accel_ros"

# Which layers each layer may import (itself included). ``sim`` is the scene and its expert; the
# ROS adapters, bag tools, trainers and evaluation sit above the runtime; commands above them all.
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "models": {"core", "models"},
    "decoding": {"core", "models", "decoding"},
    "runtime": {"core", "models", "decoding", "runtime"},
    "sim": {"core", "models", "sim"},
    "ros": {"core", "models", "decoding", "runtime", "sim", "ros"},
    "training": {"core", "models", "decoding", "sim", "training"},
    # evaluation may build what it measures with the trainers' builders (cost: a random VLA's tokenizer)
    "evaluation": {"core", "models", "decoding", "runtime", "sim", "training", "evaluation"},
    "rosbag": {"core", "models", "decoding", "runtime", "sim", "ros", "rosbag"},
    "commands": {"core", "models", "decoding", "runtime", "sim", "ros", "training", "evaluation", "rosbag",
                 "commands"},
}
# What the commands share: the flags several of them take. No other command module is imported by another.
SHARED_COMMAND_MODULES = {"vla_accel_ros.commands.closed_loop_options", "vla_accel_ros.commands.vision_options",
                          "vla_accel_ros.commands.training_options"}
# The rclpy adapters: the only modules that import rclpy when imported. Everything else, the
# commands that start ROS processes included (sim, record, replay), imports rclpy only when it runs.
RCLPY_ADAPTERS = {"vla_accel_ros.ros.node", "vla_accel_ros.ros.rclpy_util", "vla_accel_ros.ros.sim_node",
                  "vla_accel_ros.ros.inference_node", "vla_accel_ros.ros.robot_description",
                  "vla_accel_ros.ros.remote_link", "vla_accel_ros.ros.node_inputs"}
# The launch files' actions: the only module that imports launch and launch_ros (a ROS 2
# distribution's, imported by ``ros2 launch`` alone); its argument handling lives in launch_args.
LAUNCH_ADAPTERS = {"vla_accel_ros.ros.launch_actions"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imported(path: Path) -> list[tuple[str, list[str]]]:
    """Every ``vla_accel_ros`` import of a module, at any depth, relative ones resolved: (module,
    names imported from it)."""
    found = []
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            found.append((".".join([*base, *([node.module] if node.module else [])]), [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vla_accel_ros"):
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("vla_accel_ros")]
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_imports_point_downward() -> None:
    wrong = []
    for path in package_modules():
        layer = layer_of(module_name(path))
        if layer not in ALLOWED:
            continue
        for target, _ in imported(path):
            if layer_of(target) and layer_of(target) not in ALLOWED[layer]:
                wrong.append(f"{module_name(path)} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_relative_imports() -> None:
    """Every import names its module in full: the layer checks above read what a module imports."""
    relative = [module_name(p) for p in package_modules()
                if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(p.read_text())))]
    assert not relative, relative


def test_no_private_names_and_no_command_modules_are_imported() -> None:
    wrong = []
    for path in package_modules():
        for target, names in imported(path):
            wrong += [f"{module_name(path)} imports {target}.{n}" for n in names if n.startswith("_")]
            if (layer_of(target) == "commands" and module_name(path) != "vla_accel_ros.commands"
                    and not (target in SHARED_COMMAND_MODULES and layer_of(module_name(path)) == "commands")):
                wrong.append(f"{module_name(path)} imports the command module {target}")
    for path in sorted((PACKAGE.parent / "test").rglob("*.py")):  # the tests use the public names too
        for target, names in imported(path):
            wrong += [f"{path.name} imports {target}.{n}" for n in names if n.startswith("_")]
    assert not wrong, "\n".join(wrong)


def test_every_module_but_the_rclpy_adapters_imports_without_rclpy() -> None:
    modules = [module_name(p) for p in package_modules()
               if module_name(p) not in RCLPY_ADAPTERS | LAUNCH_ADAPTERS]
    assert len(modules) > 60
    done = _import_blocked(modules, "top in ('rclpy', 'rosidl_runtime_py', 'launch', 'launch_ros')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def _import_blocked(modules: list[str], blocked: str) -> subprocess.CompletedProcess:
    """Import ``modules`` in a fresh interpreter whose finder refuses every top-level package
    ``top`` for which the expression ``blocked`` is true."""
    script = (
        "import importlib, importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        top = name.split('.')[0]\n"
        f"        if {blocked}:\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_core_imports_no_ros_package() -> None:
    modules = [module_name(p) for p in package_modules() if layer_of(module_name(p)) == "core"]
    assert len(modules) > 10
    ros = ("top in ('rclpy', 'launch', 'launch_ros') or top.startswith('rosidl') "
           "or top.endswith(('_msgs', '_srvs', '_interfaces'))")
    done = _import_blocked(modules, ros)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_settings_and_the_decoder_registry_import_without_torch() -> None:
    script = ("import sys\nsys.modules['torch'] = None\n"
              "import vla_accel_ros.ros.parameters, vla_accel_ros.decoding.specs\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at any depth (inside functions and under
    ``TYPE_CHECKING`` too); ``from package import module`` points at the module."""
    modules = {module_name(p): p for p in package_modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for target, names in imported(path):
            submodules = {f"{target}.{n}" for n in names} & modules.keys()
            targets |= submodules or ({target} & modules.keys())
        graph[name] = targets - {name}
    return graph


def test_no_import_circle() -> None:
    graph, circles = import_graph(), []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(" <-> ".join(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, "\n".join(circles)
