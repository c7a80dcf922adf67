"""Locate the files the package installs into ``share/vla_accel_ros`` (URDF, config, checkpoints).

Works in three layouts: a colcon install (ament index), a pip install (``<prefix>/share``) and a
source checkout (the repository root).
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = "vla_accel_ros"
# The example parameter files' checkpoint (config/examples/*.yaml: /path/to/your_<arm>_vla),
# which a user replaces with their own model's directory.
PLACEHOLDER_CHECKPOINT = "/path/to/"


def share_dir() -> Path:
    """Return the directory holding ``urdf/``, ``config/``, ``launch/`` and ``checkpoints/``."""
    source_root = Path(__file__).resolve().parents[2]
    if (source_root / "package.xml").is_file() and (source_root / "urdf").is_dir():
        return source_root
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory(PACKAGE))
    except Exception:  # ament index absent or package not registered: fall back to the prefix
        pass
    for prefix in (sys.prefix, sys.base_prefix, "/usr/local", "/usr"):
        candidate = Path(prefix) / "share" / PACKAGE
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the share directory of {PACKAGE}; is the package installed?")


def default_urdf() -> Path:
    return share_dir() / "urdf" / "arm7.urdf"


def default_checkpoint() -> Path:
    return share_dir() / "checkpoints" / "default"


def checkpoint_problem(directory: Path | str) -> str:
    """'' when the checkpoint directory ``directory`` (its ``hf:`` prefix removed) exists; else what
    is wrong with it, for a message that names the directory first: the example parameter files'
    placeholder left in place, or a directory that does not exist."""
    if str(directory).startswith(PLACEHOLDER_CHECKPOINT):
        return "the example parameter files' placeholder: set checkpoint to your model's directory"
    if not Path(directory).is_dir():
        return "the checkpoint directory does not exist"
    return ""
