"""Shared set-up of the decoder tests (test_decoders.py, test_heisd.py), as fixtures (pytest runs
with --import-mode=importlib, so test modules cannot import this file):

- ``policy``: a tiny randomly initialised policy on 32 px images, a new one per test module (a
  module may attach heads to it, or override the fixture to do so);
- ``kin``: the arm's kinematics from the packaged URDF;
- ``observations(n, seed=0, colours=("red", "green", "blue"))``: ``n`` random observations near the
  home pose, one per 0.05 s, whose instructions cycle through ``colours``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.models import Policy, VLAConfig
from vla_accel_ros.models.tokenizer import ActionTokenizer

Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
IMAGE = 32


def _observations(n: int, seed: int = 0, colours: Sequence[str] = ("red", "green", "blue")) -> list[Observation]:
    """Random images and joints (seeded: reproducible) around the home pose."""
    rng = np.random.default_rng(seed)
    return [
        Observation(
            image=rng.integers(0, 256, (IMAGE, IMAGE, 3), dtype=np.uint8),
            instruction=f"pick up the {colours[i % len(colours)]} cube",
            joint_pos=Q_HOME + rng.normal(0, 0.1, 7),
            gripper=0.04,
            stamp=0.05 * i,
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def policy() -> Policy:
    config = VLAConfig(
        image_size=IMAGE, patch_size=16, d_model=32, n_heads=2, n_layers=2, vision_layers=1,
        max_text_len=16, local_channels=8, contact_hidden=8,
    )
    return Policy.create(config, ActionTokenizer(-np.full(7, 0.02), np.full(7, 0.02)), seed=3)


@pytest.fixture(scope="module")
def kin() -> ArmKinematics:
    return ArmKinematics(default_urdf())


@pytest.fixture(scope="session")
def observations() -> Callable[..., list[Observation]]:
    return _observations
