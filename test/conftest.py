"""Shared test set-up: headless rendering and one torch thread (the CI box has 2 cores)."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the kinematics and sim tests do not need torch
    pass
