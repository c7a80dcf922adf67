"""The OpenGL platform choice: EGL on a plain headless shell, the user's MUJOCO_GL kept, and a
one-line error (no traceback) when MuJoCo cannot render."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vla_accel_ros.sim.gl import choose_platform

GL_VARIABLES = ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")


def plain_shell(**extra: str) -> dict[str, str]:
    """os.environ as a headless login shell has it: no display, no GL platform set."""
    env = {k: v for k, v in os.environ.items() if k not in GL_VARIABLES}
    return dict(env, **extra)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vla_accel_ros.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("environ, expected", [
    ({}, "egl"),
    ({"DISPLAY": ""}, "egl"),
    ({"MUJOCO_GL": "osmesa"}, "osmesa"),  # the user's choice wins, display or not
    ({"MUJOCO_GL": "glfw", "DISPLAY": ":0"}, "glfw"),
    ({"DISPLAY": ":0"}, None),  # a display: MuJoCo's own default (GLFW)
    ({"WAYLAND_DISPLAY": "wayland-0"}, None),
    ({"PYOPENGL_PLATFORM": "osmesa"}, "osmesa"),  # MuJoCo refuses a MUJOCO_GL that disagrees
])
def test_choose_platform(environ: dict[str, str], expected: str | None) -> None:
    env = dict(environ)
    assert choose_platform(env) == expected
    assert env.get("MUJOCO_GL") == (expected if expected else environ.get("MUJOCO_GL"))


def test_sim_speed_renders_on_a_plain_headless_shell() -> None:
    proc = run_cli("sim-speed", "--runs", "1", "--steps", "3", "--image-size", "16", env=plain_shell())
    assert proc.returncode == 0, proc.stderr
    assert "steps/s with 16x16 rendering" in proc.stdout


def test_a_platform_that_fails_to_load_is_one_line_not_a_traceback() -> None:
    proc = run_cli("sim-speed", "--runs", "1", "--steps", "3", env=plain_shell(MUJOCO_GL="no-such-platform"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("sim-speed: error: ")
    assert "MUJOCO_GL=no-such-platform" in line and "MUJOCO_GL=egl" in line and "osmesa" in line


def test_a_render_that_fails_exits_2_with_what_to_set() -> None:
    # PyOpenGL pinned to another platform than MuJoCo's: mujoco imports, but no frame renders.
    proc = run_cli("sim-speed", "--runs", "1", "--steps", "3", "--image-size", "16",
                   env=plain_shell(MUJOCO_GL="egl", PYOPENGL_PLATFORM="osmesa"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sim-speed: error: MuJoCo cannot render") and "MUJOCO_GL=egl" in last
