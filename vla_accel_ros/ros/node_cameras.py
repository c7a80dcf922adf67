"""The control node's cameras: one camera intake (``ros/camera_intake.py``, a child process) per entry
of ``image_topics`` (or ``image_topic`` alone), raw or compressed each, whose frames go to the
controller's image slot of the same index, stamped with their header stamp so that the controller
matches the images of one observation (``camera_sync_tolerance_s``) and watches each camera.
Importing it does not import rclpy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from vla_accel_ros.core.cameras import stand_in_slots
from vla_accel_ros.core.controller import Controller
from vla_accel_ros.core.errors import SettingError
from vla_accel_ros.core.settings import ConfigError
from vla_accel_ros.ros.camera_intake import CameraIntake, CameraIntakeError, IntakeSpec
from vla_accel_ros.ros.parameters import NodeConfig


class NodeCameras:
    """The node's camera intakes. The callbacks are the node's: ``controller()`` (None while
    unconfigured), ``now()`` (its clock), ``in_order(what, stamp)`` (its header-stamp check),
    ``reject(message)``, ``on_output(line)`` (a child's printed line) and ``timed(what)`` (a context
    manager that times a hand-over for the stall report)."""

    def __init__(self, cfg: NodeConfig, controller: Callable[[], Controller | None], now: Callable[[], float],
                 in_order: Callable[[str, float], bool], reject: Callable[[str], None],
                 on_output: Callable[[str], None],
                 timed: Callable[[str], contextlib.AbstractContextManager[Any]]) -> None:
        self.topics = cfg.camera_topics
        self.compressed = cfg.camera_compressed
        self._controller, self._now, self._in_order = controller, now, in_order
        self._reject, self._timed = reject, timed
        self.intakes = [CameraIntake(self._frame_callback(k), self._refusal_callback(k), reject, on_output)
                        for k in range(len(self.topics))]

    def __len__(self) -> int:
        return len(self.topics)

    def spawn(self) -> None:
        """Start the children (their imports run while the node loads the rest)."""
        for intake in self.intakes:
            intake.spawn()

    def start(self, resolve: Callable[[str], str], image_size: int, max_pixels: int, reliable: bool,
              domain_id: int, node_name: str, namespace: str) -> None:
        """Subscribe every camera; ConfigError naming the topic when one cannot."""
        for k, (topic, intake) in enumerate(zip(self.topics, self.intakes, strict=True)):
            suffix = "" if len(self.topics) == 1 else f"_{k}"
            try:
                intake.start(IntakeSpec(topic=resolve(topic), compressed=self.compressed[k], image_size=image_size,
                                        max_pixels=max_pixels, reliable=reliable, domain_id=domain_id,
                                        node_name=f"_{node_name}_camera{suffix}", namespace=namespace))
            except CameraIntakeError as err:
                raise ConfigError(f"camera on {topic}: {err}") from err

    def stop(self) -> None:
        for intake in self.intakes:
            intake.stop()

    def stats(self) -> dict[str, Any]:
        """The first camera's counters as ``camera_*`` (one camera), each one's as ``camera<k>_*``."""
        if len(self.intakes) == 1:
            return {f"camera_{k}": v for k, v in self.intakes[0].stats().items()}
        return {f"camera{i}_{k}": v for i, intake in enumerate(self.intakes) for k, v in intake.stats().items()}

    def _what(self, camera: int) -> str:
        return "image" if len(self.topics) == 1 else f"image on {self.topics[camera]}"

    def _frame_callback(self, camera: int) -> Callable[[float, np.ndarray], None]:
        def on_frame(stamp: float, rgb: np.ndarray) -> None:
            """A frame from the camera's intake (its thread), converted to the model's size."""
            with self._timed("camera frame hand-over"):
                controller = self._controller()
                if controller is None or not self._in_order(self._what(camera), stamp):
                    return
                if (error := controller.on_image(rgb, self._now(), camera=camera, stamp=stamp)) is not None:
                    self._reject(error)
        return on_frame

    def _refusal_callback(self, camera: int) -> Callable[[float, str], None]:
        def on_refused(stamp: float, why: str) -> None:
            """The intake refused an image: nothing of it is used (the camera stays as fresh as its
            last usable frame)."""
            message = f"image on {self.topics[camera]} rejected: {why}"
            self._reject(message)
            if (controller := self._controller()) is not None:
                controller.on_image_refused(message, camera=camera)
        return on_refused


def check_image_slots(cameras: int, slots: int, allow_stand_in: bool) -> str:
    """The node's camera count against the model's image slots (0 = unknown): '' when they match,
    the standing warning of the slots left to a stand-in image (``allow_stand_in_images``), else
    ConfigError naming ``image_topics``."""
    if slots and cameras > slots:
        raise ConfigError(f"the node has {cameras} camera topic(s) but the checkpoint reads {slots} image(s) per "
                          f"observation (its image slots): set image_topics to {slots} topic(s), in slot order")
    try:
        missing = stand_in_slots(cameras, slots, allow_stand_in)
    except SettingError as err:
        raise ConfigError(str(err)) from err
    if not missing:
        return ""
    return (f"image_topics gives {cameras} of the checkpoint's {slots} image slots: the other {missing} get a copy "
            "of the first camera's image (allow_stand_in_images)")
