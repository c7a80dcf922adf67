"""Camera images bounded before they are decoded (core/images.py): the size a PNG or JPEG declares in
its header, a decompression bomb refused undecoded, a raw image above the bound refused before its
data is read."""

from __future__ import annotations

import struct
import zlib
from types import SimpleNamespace

import cv2
import numpy as np
import pytest

from vla_accel_ros.core.images import (
    DEFAULT_MAX_IMAGE_PIXELS,
    compressed_to_rgb,
    declared_size,
    image_to_rgb,
)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encoded(ext: str, h: int, w: int, **params: int) -> bytes:
    flags = [k for kv in params.items() for k in kv]
    ok, data = cv2.imencode(ext, np.full((h, w, 3), 90, np.uint8), [int(f) for f in flags])
    assert ok
    return data.tobytes()


def test_png_and_jpeg_declare_their_size_in_the_header():
    assert declared_size(encoded(".png", 33, 17)) == ("png", 17, 33)
    assert declared_size(encoded(".jpg", 48, 640)) == ("jpeg", 640, 48)
    progressive = encoded(".jpg", 20, 30, **{str(cv2.IMWRITE_JPEG_PROGRESSIVE): 1})
    assert declared_size(progressive) == ("jpeg", 30, 20)  # SOF2


def test_a_jpeg_segment_before_the_frame_header_is_skipped_by_its_length():
    jpeg = encoded(".jpg", 8, 12)
    thumbnail = b"Exif\x00\x00" + b"\xff\xd8\xff\xc0\x00\x11\x08\x7f\xff\x7f\xff" + bytes(20)  # an SOF inside APP1
    app1 = b"\xff\xe1" + struct.pack(">H", len(thumbnail) + 2) + thumbnail
    assert declared_size(jpeg[:2] + app1 + jpeg[2:]) == ("jpeg", 12, 8)


@pytest.mark.parametrize("data, words", [
    (b"", r"neither PNG nor JPEG \(starts with nothing\)"),
    (b"GIF89a\x01\x00\x01\x00", "neither PNG nor JPEG"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "too short for its IHDR"),
    (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IDAT", bytes(13)), "does not begin with an IHDR"),
    (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 0, 5, 8, 2, 0, 0, 0)), "size of 0x5"),
    (b"\xff\xd8\xff\xda\x00\x02", "no frame header"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "ends before its frame header"),
    (b"\xff\xd8\x12\x34", "marker expected at byte 2"),
])
def test_a_malformed_header_is_named(data, words):
    with pytest.raises(ValueError, match=words):
        declared_size(data)


def test_a_corrupt_png_header_fails_its_crc():
    png = bytearray(encoded(".png", 4, 4))
    png[17] ^= 0x40  # the width
    with pytest.raises(ValueError, match="CRC"):
        declared_size(bytes(png))


def test_the_png_bomb_is_refused_from_its_header_without_decoding(png_bomb, monkeypatch):
    assert 120_000 < len(png_bomb) < 140_000
    assert declared_size(png_bomb) == ("png", 32768, 32768)

    def never(*args, **kwargs):  # decoding it took 17.7 s and 6.3 GB
        raise AssertionError("the bomb reached the decoder")

    monkeypatch.setattr(cv2, "imdecode", never)
    with pytest.raises(ValueError, match=r"PNG of 32768x32768 \(1073741824 pixels\) exceeds max_image_pixels"):
        compressed_to_rgb(SimpleNamespace(format="png", data=png_bomb), 64)


def test_a_compressed_image_within_the_bound_is_decoded_and_one_pixel_more_is_refused():
    msg = SimpleNamespace(format="jpeg", data=encoded(".jpg", 30, 40))
    assert compressed_to_rgb(msg, 16, max_pixels=1200).shape == (16, 16, 3)
    with pytest.raises(ValueError, match="JPEG of 40x30 .* exceeds max_image_pixels = 1199"):
        compressed_to_rgb(msg, 16, max_pixels=1199)


class Untouchable:
    """Image data that fails the test when anything reads it."""

    def __len__(self) -> int:
        raise AssertionError("the data of an image above the bound was read")


def test_a_raw_image_above_the_bound_is_refused_before_its_data_is_read():
    huge = SimpleNamespace(encoding="rgb8", height=10000, width=10000, step=30000, data=Untouchable())
    with pytest.raises(ValueError, match=r"rgb8 image of 10000x10000 \(100000000 pixels\) exceeds max_image_pixels"):
        image_to_rgb(huge, 64)
    assert DEFAULT_MAX_IMAGE_PIXELS == 3840 * 2160  # a 4K frame passes
    frame = SimpleNamespace(encoding="mono8", height=2160, width=3840, step=3840, data=bytes(3840 * 2160))
    assert image_to_rgb(frame, 64).shape == (64, 64, 3)


def test_a_long_encoding_string_is_quoted_cut():
    msg = SimpleNamespace(encoding="x" * 100_000, height=1, width=1, step=3, data=bytes(3))
    with pytest.raises(ValueError) as err:
        image_to_rgb(msg, 8)
    assert len(str(err.value)) < 200
