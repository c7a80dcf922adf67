"""The cameras of one observation: each camera's newest image, and the newest set of images, one
per camera, whose stamps agree within a tolerance (one observation). ROS-free; the controller
keeps one and calls it under its lock.

Each camera has its own watchdog (the arrival of its newest image) and the set has one too: a
camera that stops, or whose images are stamped apart from the others' by more than the tolerance,
leaves no new observation, and :meth:`CameraSet.hold_reason` names it once the newest observation
is older than the camera timeout.

:func:`stand_in_slots` says how many of a policy's image slots the cameras leave to a stand-in image,
and refuses too few cameras in one line naming the setting that gives more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vla_accel_ros.core.errors import SettingError

SIM_CAMERAS = 2  # the sim renders the scene camera and the wrist camera


@dataclass
class _Frame:
    image: np.ndarray
    stamp: float  # the sender's stamp (the header's), on which the cameras are matched
    received: float  # arrival on the controller's clock, for the watchdog


class CameraSet:
    """``names`` in image-slot order (the first is the primary: an observation's ``image``)."""

    def __init__(self, names: tuple[str, ...], tolerance_s: float) -> None:
        if not names:
            raise ValueError("a camera set needs at least one camera")
        self.names = names
        self.tolerance_s = tolerance_s
        self.frames: list[_Frame | None] = [None] * len(names)
        self.refused = [""] * len(names)  # why each camera's images since its last usable one were refused
        self.matched: tuple[np.ndarray, ...] | None = None  # the newest observation's images
        self.matched_received = -math.inf  # arrival of its primary image
        self._matched_frames: tuple[_Frame, ...] = ()

    def __len__(self) -> int:
        return len(self.names)

    def index(self, camera: int) -> int:
        if not 0 <= camera < len(self.names):
            raise ValueError(f"camera {camera} is not one of the {len(self.names)} image slots")
        return camera

    def last_received(self, camera: int) -> float:
        frame = self.frames[camera]
        return -math.inf if frame is None else frame.received

    def add(self, camera: int, image: np.ndarray, stamp: float, received: float) -> bool:
        """Store a camera's image; True when it completes a new observation: a set of images, one per
        camera, stamped within the tolerance of the first camera's, this new image among them (a
        publisher that leaves its stamps at 0 still makes one observation per frame)."""
        self.frames[camera] = _Frame(image, stamp, received)
        if any(frame is None for frame in self.frames):
            return False
        frames = tuple(f for f in self.frames if f is not None)
        if max(abs(f.stamp - frames[0].stamp) for f in frames) > self.tolerance_s:
            return False
        self.matched = tuple(f.image for f in frames)
        self.matched_received = frames[0].received
        self._matched_frames = frames
        return True

    def hold_reason(self, now: float, timeout_s: float, ahead_s: float) -> str:
        """Why the cameras hold the arm at ``now`` ('' = they do not): a camera never heard, or
        stale past ``timeout_s`` (or stamped more than ``ahead_s`` ahead: the clock went back), or
        no matched observation for ``timeout_s`` (naming the camera furthest apart)."""
        for name, frame, refused in zip(self.names, self.frames, self.refused, strict=True):
            label = "camera" if len(self.names) == 1 else f"camera '{name}'"
            if frame is None:
                return f"no {label} image received" + (f" (refused: {refused})" if refused else "")
            if now - frame.received > timeout_s:
                return (f"{label} stale ({now - frame.received:.3f} s > {timeout_s} s)"
                        + (f"; the newest image was refused: {refused}" if refused else ""))
            if frame.received - now > ahead_s:
                return f"{label} stale (stamped {frame.received - now:.3f} s ahead: the clock went back)"
        if len(self.names) > 1 and now - self.matched_received > timeout_s:
            frames = [f for f in self.frames if f is not None]
            for name, frame, used in zip(self.names, frames, self._matched_frames or (None,) * len(frames),
                                         strict=True):
                if frame is used:  # nothing from it since the last observation: it is the late one
                    return (f"camera '{name}' stale (no image since the last observation, "
                            f"{now - frame.received:.3f} s ago; timeout {timeout_s} s)")
            offsets = [abs(f.stamp - frames[0].stamp) for f in frames]
            worst = int(np.argmax(offsets))
            return (f"camera '{self.names[worst]}' out of step: its newest image is stamped "
                    f"{offsets[worst] * 1e3:.1f} ms from the first camera's (tolerance "
                    f"{self.tolerance_s * 1e3:.1f} ms); no matched observation for "
                    f"{now - self.matched_received:.3f} s")
        return ""


def too_few_cameras(cameras: int, image_slots: int) -> SettingError:
    """The refusal of a run whose ``cameras`` give fewer images than the policy's ``image_slots``."""
    return SettingError(f"the checkpoint reads {image_slots} images per observation (its image slots) and "
                        f"{cameras} camera(s) give {cameras}: give {image_slots} with image_topics, "
                        "or allow a stand-in for each missing one (a copy of the first camera's image) with "
                        "allow_stand_in_images", "image_topics", "allow_stand_in_images")


def stand_in_slots(cameras: int, image_slots: int, allowed: bool) -> int:
    """The image slots of a policy with ``image_slots`` (0: any) that ``cameras`` leave to a stand-in
    image; :func:`too_few_cameras` when there are some and stand-ins are not ``allowed``."""
    missing = max(0, image_slots - cameras)
    if missing and not allowed:
        raise too_few_cameras(cameras, image_slots)
    return missing


def sim_cameras(asked: int | None, image_slots: int) -> int:
    """The sim's cameras a run renders: ``asked``, else as many as the policy's ``image_slots``
    (0: any, one) up to the sim's scene and wrist cameras."""
    return asked if asked is not None else min(max(image_slots, 1), SIM_CAMERAS)
