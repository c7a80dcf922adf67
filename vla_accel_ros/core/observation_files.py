"""Observation parts read from files or flags, as ``vla-accel predict`` takes them: camera images
(PNG/JPEG, or a ``.npy`` holding H x W x 3 uint8 or LeRobot's 3 x H x W float in [0, 1]), a vector
(a comma list or a ``.npy``) and an array of a required shape. Each refuses bad input in one line
naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def read_image_file(path: Path) -> np.ndarray:
    """The image in ``path``: H x W x 3 uint8 (an image file, or a .npy of that), or 3 x H x W
    float32 in [0, 1] (a .npy as LeRobot holds images)."""
    if path.suffix.lower() == ".npy":
        array = read_npy(path)
        if array.ndim == 3 and array.shape[-1] == 3 and array.dtype == np.uint8:
            return array
        if array.ndim == 3 and array.shape[0] == 3 and np.issubdtype(array.dtype, np.floating):
            if not np.isfinite(array).all() or array.min() < 0.0 or array.max() > 1.0:
                raise ValueError(f"{path}: a float image must lie in [0, 1]")
            return array.astype(np.float32)
        raise ValueError(f"{path}: an image .npy must be H x W x 3 uint8 or 3 x H x W float in [0, 1], got "
                         f"{array.dtype} {tuple(array.shape)}")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return np.array(image.convert("RGB"))
    except (OSError, UnidentifiedImageError) as error:
        raise ValueError(f"{path}: cannot read it as an image ({error})") from None


def read_npy(path: Path) -> np.ndarray:
    """A .npy file's array (never a pickled object)."""
    try:
        return np.asarray(np.load(path, allow_pickle=False))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read it as .npy ({str(error).splitlines()[0]})") from None


def read_vector(text: str, what: str) -> np.ndarray:
    """A float vector from a comma list ("0.1,0.2") or a .npy file's path; ValueError naming ``what``."""
    if text.endswith(".npy"):
        array = read_npy(Path(text)).astype(np.float64).reshape(-1)
    else:
        try:
            array = np.array([float(v) for v in text.split(",") if v.strip()], dtype=np.float64)
        except ValueError:
            raise ValueError(f"{what}: not a comma list of numbers nor a .npy file: {text!r}") from None
    if array.size == 0 or not np.isfinite(array).all():
        raise ValueError(f"{what}: needs finite numbers, got {text!r}")
    return array


def read_array(path: Path, shape: tuple[int, ...], what: str) -> np.ndarray:
    """A finite float32 array of exactly ``shape`` from a .npy file."""
    array = read_npy(path)
    if tuple(array.shape) != shape:
        raise ValueError(f"{path}: {what} must be {' x '.join(map(str, shape))}, got "
                         f"{' x '.join(map(str, array.shape))}")
    if not np.issubdtype(array.dtype, np.number) or not np.isfinite(array).all():
        raise ValueError(f"{path}: {what} must hold finite numbers")
    return array.astype(np.float32)
