"""Which OpenGL platform MuJoCo renders with, settled before mujoco is first imported.

MuJoCo reads ``MUJOCO_GL`` once, when it is imported, and with it unset loads GLFW, which needs a
display. This module runs first in :mod:`vla_accel_ros.sim` (its ``__init__`` imports it, and every
sim module imports mujoco after that), so:

- a ``MUJOCO_GL`` the user set is kept as it is;
- else, with a display (``DISPLAY`` or ``WAYLAND_DISPLAY``), MuJoCo's own default stays;
- else ``MUJOCO_GL=egl`` (headless, GPU or Mesa), or the platform ``PYOPENGL_PLATFORM`` names when
  that is ``egl`` or ``osmesa`` (MuJoCo refuses a ``MUJOCO_GL`` that disagrees with it).

The choice goes into ``os.environ``, so child processes (the sim node, workers) inherit it.

A platform that fails to load when mujoco is imported raises :class:`RenderingUnavailable`, whose
one-line message says what to set; an uncaught one is printed as that line alone, without a
traceback. :func:`rendering_problem` tries one tiny offscreen render, and
:func:`check_rendering` reports its failure as a command's one-line error, for commands to check
before they start work that renders.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from types import TracebackType

from vla_accel_ros.core.errors import RunFailed

HEADLESS_DEFAULT = "egl"
HINT = ("set MUJOCO_GL=egl (EGL: a GPU driver or Mesa's libEGL) or MUJOCO_GL=osmesa (software: libOSMesa), "
        "or run with a working display")


class RenderingUnavailable(RunFailed):
    """MuJoCo cannot render on this machine with the chosen ``MUJOCO_GL``; the message says what to set
    (a RunFailed: a command reports it in one line)."""


def choose_platform(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``MUJOCO_GL`` in ``environ`` (default ``os.environ``) when it is unset and there is no
    display; returns the value MuJoCo will use, or None for its own default (GLFW on a display)."""
    env = os.environ if environ is None else environ
    if env.get("MUJOCO_GL", "").strip():
        return env["MUJOCO_GL"]
    if env.get("DISPLAY", "").strip() or env.get("WAYLAND_DISPLAY", "").strip():
        return None
    pyopengl = env.get("PYOPENGL_PLATFORM", "").strip().lower()
    env["MUJOCO_GL"] = pyopengl if pyopengl in ("egl", "osmesa") else HEADLESS_DEFAULT
    return env["MUJOCO_GL"]


def describe(err: BaseException) -> str:
    """The platform in use and the first line of ``err``, then what to set: one line."""
    platform = os.environ.get("MUJOCO_GL", "")
    using = f"MUJOCO_GL={platform}" if platform else "MUJOCO_GL unset (GLFW)"
    first = (str(err).strip().splitlines() or [""])[0][:200]
    return f"MuJoCo cannot render with {using} ({type(err).__name__}: {first}); {HINT}"


def rendering_problem() -> str | None:
    """None when a 1x1 offscreen frame renders, else the one-line reason and what to set."""
    try:
        import mujoco

        model = mujoco.MjModel.from_xml_string("<mujoco/>")
        data = mujoco.MjData(model)
        with mujoco.Renderer(model, height=1, width=1) as renderer:
            renderer.update_scene(data)
            renderer.render()
    except Exception as err:  # FatalError, GLError, ImportError, AttributeError: each platform fails its own way
        return describe(err)
    return None


def check_rendering(command: str) -> bool:
    """True when MuJoCo renders; else False, with ``<command>: error: <reason and what to set>`` on stderr."""
    problem = rendering_problem()
    if problem is not None:
        print(f"{command}: error: {problem}", file=sys.stderr, flush=True)
    return problem is None


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, RenderingUnavailable):
        print(f"error: {value}", file=sys.stderr, flush=True)  # the line says it all; no traceback
        return
    _previous_excepthook(kind, value, tb)


def _import_mujoco() -> None:
    """The first import of mujoco, which loads the platform; RenderingUnavailable when that fails."""
    try:
        import mujoco  # noqa: F401
    except ModuleNotFoundError as err:
        if err.name == "mujoco":  # not installed at all: not a platform problem
            raise
        raise RenderingUnavailable(describe(err)) from err
    except (AttributeError, ImportError, OSError, RuntimeError) as err:  # a bad or missing GL library
        raise RenderingUnavailable(describe(err)) from err


_previous_excepthook = sys.excepthook
sys.excepthook = _excepthook
choose_platform()
_import_mujoco()
