"""Camera images to the model's input, bounded: the size a compressed image declares in its header
(PNG IHDR, JPEG SOF) is read before anything is decoded, and no image above ``max_pixels`` is
decoded or converted. Raw images (every common encoding) and compressed ones (PNG, JPEG) become RGB
uint8 at the model's size. Reads message fields only (rclpy's messages or rosbags' with the same
fields); imports neither ROS nor the kinematics, so the node's camera intake process loads little.
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

import cv2
import numpy as np

if TYPE_CHECKING:
    from sensor_msgs.msg import CompressedImage, Image

# A 4K UHD frame. A decompression bomb declares far more: 32768 x 32768 from 130 kB of PNG.
DEFAULT_MAX_IMAGE_PIXELS = 3840 * 2160

# encoding -> (channels, OpenCV conversion to RGB or None)
ENCODINGS: dict[str, tuple[int, int | None]] = {
    "rgb8": (3, None),
    "bgr8": (3, cv2.COLOR_BGR2RGB),
    "rgba8": (4, cv2.COLOR_RGBA2RGB),
    "bgra8": (4, cv2.COLOR_BGRA2RGB),
    "mono8": (1, cv2.COLOR_GRAY2RGB),
}

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (they carry the frame's size): C0-CF but DHT (C4), JPG (C8) and DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RST0-7: no length field


def declared_size(data: bytes | memoryview) -> tuple[str, int, int]:
    """(format, width, height) that a PNG or JPEG declares in its header, read without decoding;
    ValueError naming what is wrong when ``data`` is neither or its header is malformed."""
    data = memoryview(data)
    if bytes(data[:8]) == PNG_SIGNATURE:
        return ("png", *_png_size(data))
    if bytes(data[:2]) == b"\xff\xd8":
        return ("jpeg", *_jpeg_size(data))
    head = bytes(data[:8]).hex(" ") or "nothing"
    raise ValueError(f"neither PNG nor JPEG (starts with {head}); only those are decoded")


def _png_size(data: memoryview) -> tuple[int, int]:
    if len(data) < 33:
        raise ValueError(f"PNG of {len(data)} bytes is too short for its IHDR header")
    length, kind = struct.unpack(">I4s", data[8:16])
    if kind != b"IHDR" or length != 13:
        raise ValueError(f"PNG does not begin with an IHDR header (found {kind!r} of {length} bytes)")
    (crc,) = struct.unpack(">I", data[29:33])
    if zlib.crc32(data[12:29]) != crc:
        raise ValueError("PNG IHDR header fails its CRC (corrupt data)")
    width, height = struct.unpack(">II", data[16:24])
    return _positive(width, height, "PNG")


def _jpeg_size(data: memoryview) -> tuple[int, int]:
    i, n = 2, len(data)
    while i < n:
        if data[i] != 0xFF:
            raise ValueError(f"JPEG marker expected at byte {i}, found {data[i]:#04x} (corrupt data)")
        while i < n and data[i] == 0xFF:  # a marker may be preceded by fill bytes
            i += 1
        if i >= n:
            break
        marker = data[i]
        if marker in _JPEG_STANDALONE:
            i += 1
            continue
        if marker in (0xD9, 0xDA):  # end of image, or a scan, before any frame header
            raise ValueError("JPEG has no frame header (SOF) before its image data")
        if i + 3 > n:
            break
        (length,) = struct.unpack(">H", data[i + 1:i + 3])
        if marker in _JPEG_SOF:
            if i + 8 > n or length < 8:
                break
            height, width = struct.unpack(">HH", data[i + 4:i + 8])
            return _positive(width, height, "JPEG")
        if length < 2:
            raise ValueError(f"JPEG segment {marker:#04x} at byte {i - 1} has length {length} (corrupt data)")
        i += 1 + length
    raise ValueError(f"JPEG of {len(data)} bytes ends before its frame header (SOF)")


def _positive(width: int, height: int, kind: str) -> tuple[int, int]:
    if width <= 0 or height <= 0:
        raise ValueError(f"{kind} declares a size of {width}x{height}")
    return width, height


def check_pixels(width: int, height: int, max_pixels: int, what: str = "image") -> None:
    """ValueError when a ``width`` x ``height`` image has more than ``max_pixels`` pixels."""
    if width * height > max_pixels:
        raise ValueError(f"{what} of {width}x{height} ({width * height} pixels) exceeds max_image_pixels = "
                         f"{max_pixels}: refused undecoded")


def _resize(rgb: np.ndarray, size: int) -> np.ndarray:
    if rgb.shape[:2] != (size, size):
        # INTER_AREA averages the source pixels: no aliasing when a camera image shrinks.
        rgb = cv2.resize(rgb, (size, size), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(rgb)


def image_to_rgb(msg: Image, size: int, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> np.ndarray:
    """sensor_msgs/Image -> RGB uint8 (size, size, 3); ValueError naming what is wrong (an image
    above ``max_pixels`` is refused before any of its data is read)."""
    encoding = msg.encoding.lower()
    if encoding not in ENCODINGS:
        shown = msg.encoding if len(msg.encoding) <= 40 else msg.encoding[:40] + "..."
        raise ValueError(f"unsupported image encoding '{shown}' (supported: {', '.join(ENCODINGS)})")
    channels, conversion = ENCODINGS[encoding]
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if h <= 0 or w <= 0:
        raise ValueError(f"image has size {w}x{h}")
    check_pixels(w, h, max_pixels, f"{encoding} image")
    if step < w * channels:
        raise ValueError(f"image step {step} is smaller than width {w} x {channels} channels of {encoding}")
    if len(msg.data) < h * step:
        raise ValueError(f"image data ({len(msg.data)} bytes, step {step}) too small for {w}x{h} {encoding}")
    if len(msg.data) != h * step:  # sensor_msgs/Image: data is exactly step x height bytes
        raise ValueError(f"image data length {len(msg.data)} does not match step {step} x height {h} = {h * step}")
    rows = np.frombuffer(msg.data, dtype=np.uint8, count=h * step).reshape(h, step)
    pixels = rows[:, : w * channels].reshape(h, w, channels)
    rgb = pixels if conversion is None else cv2.cvtColor(pixels, conversion)
    return _resize(rgb, size)


def compressed_to_rgb(msg: CompressedImage, size: int, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> np.ndarray:
    """sensor_msgs/CompressedImage (PNG or JPEG, whatever ``format`` says) -> RGB uint8 (size, size, 3);
    ValueError naming what is wrong. The size the header declares is checked against ``max_pixels``
    before anything is decoded."""
    data = msg.data
    if len(data) == 0:
        raise ValueError(f"compressed image (format '{msg.format[:40]}') has no data")
    kind, width, height = declared_size(data)
    check_pixels(width, height, max_pixels, f"{kind.upper()}")
    try:
        bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    except cv2.error:  # OpenCV asserts on some malformed headers instead of returning None
        bgr = None
    if bgr is None:
        raise ValueError(f"cannot decode compressed image ({kind.upper()} {width}x{height}, {len(data)} bytes)")
    return _resize(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), size)
