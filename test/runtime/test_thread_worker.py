"""The thread worker: a policy that fails on every observation is counted each time and logged rarely."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from vla_accel_ros.core.controller import Controller, ControllerConfig
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.runtime.thread_worker import InferenceWorker

Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
IMAGE = np.zeros((32, 32, 3), np.uint8)


def test_a_policy_failing_every_call_is_counted_each_time_and_logged_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    ctrl = Controller(ArmKinematics(default_urdf()), ControllerConfig(period_s=0.05))
    ctrl.set_instruction("pick up the red cube")
    ctrl.set_enabled(True)

    def failing(obs):  # noqa: ANN001, ANN202
        raise RuntimeError("proprio must be 8 finite numbers")

    worker = InferenceWorker(ctrl, failing, clock=time.monotonic)
    caplog.set_level(logging.ERROR, logger="vla_accel_ros.runtime.thread_worker")
    worker.start()
    try:
        deadline = time.monotonic() + 10.0
        while worker.stats()["errors"] < 4 and time.monotonic() < deadline:
            now = time.monotonic()
            ctrl.on_joint_state(Q_HOME, 0.04, now)
            ctrl.on_image(IMAGE, now)
            time.sleep(0.02)
    finally:
        worker.stop()
    stats = worker.stats()
    assert stats["errors"] >= 4 and "proprio must be 8 finite numbers" in stats["last_error"]
    lines = [r for r in caplog.records if "proprio" in r.getMessage()]
    assert len(lines) == 1  # every failure within ERROR_LOG_INTERVAL_S of the first is counted, not logged
