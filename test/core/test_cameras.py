"""The cameras of one observation, without ROS: matched by stamp within the tolerance, each camera
watched, the late or silent one named."""

from __future__ import annotations

import numpy as np

from vla_accel_ros.core.cameras import CameraSet

SCENE, WRIST = np.zeros((4, 4, 3), np.uint8), np.ones((4, 4, 3), np.uint8)


def test_images_within_the_tolerance_make_one_observation_once():
    cameras = CameraSet(("scene", "wrist"), tolerance_s=0.02)
    assert not cameras.add(0, SCENE, stamp=1.00, received=1.001)  # the wrist image is missing
    assert cameras.add(1, WRIST, stamp=1.01, received=1.002)
    assert cameras.matched is not None and cameras.matched[1] is WRIST and cameras.matched_received == 1.001
    assert cameras.add(1, WRIST, stamp=1.01, received=1.003)  # a new frame, within the tolerance: a new observation
    assert not cameras.add(0, SCENE, stamp=1.05, received=1.051)  # 40 ms from the wrist's: out of tolerance
    assert cameras.add(1, WRIST, stamp=1.05, received=1.052)


def test_each_camera_is_watched_and_the_culprit_named():
    cameras = CameraSet(("scene", "wrist"), tolerance_s=0.02)
    assert cameras.hold_reason(0.0, 0.3, 0.05) == "no camera 'scene' image received"
    for k in range(10):  # both at 20 Hz, then the wrist stops at t = 0.2
        cameras.add(0, SCENE, stamp=k * 0.05, received=k * 0.05)
        if k <= 4:
            cameras.add(1, WRIST, stamp=k * 0.05, received=k * 0.05)
    reason = cameras.hold_reason(0.55, 0.3, 0.05)
    assert "'wrist'" in reason and "stale" in reason
    for k in range(10, 20):  # back, but 0.2 s behind the scene camera
        cameras.add(0, SCENE, stamp=k * 0.05, received=k * 0.05)
        cameras.add(1, WRIST, stamp=k * 0.05 - 0.2, received=k * 0.05)
    reason = cameras.hold_reason(0.95, 0.3, 0.05)
    assert "'wrist' out of step" in reason and "200.0 ms" in reason
    cameras.add(1, WRIST, stamp=0.95, received=0.951)  # in step again
    assert cameras.hold_reason(0.96, 0.3, 0.05) == ""


def test_one_camera_reads_as_before():
    cameras = CameraSet(("camera/image_raw",), tolerance_s=0.0)
    assert cameras.add(0, SCENE, stamp=5.0, received=1.0)
    assert cameras.add(0, SCENE, stamp=5.0, received=1.05)  # unstamped publishers: every frame is one
    assert cameras.hold_reason(2.0, 0.5, 0.05).startswith("camera stale")
