"""The one comparison of the tensor shapes a checkpoint's config implies with the shapes its
safetensors headers declare, made before any module is built or any tensor is read: a directory
whose config names other sizes than its weights is refused in one line (the tensor, both shapes,
the config field) instead of after allocating a model of the config's size.

Torch-free: only the headers are read (:func:`~vla_accel_ros.models.files.safetensors_header`:
the 8-byte length and the JSON). Each family supplies its expected shapes
(:class:`ExpectedShapes`: tensor -> shape and the config field that implies it); a dimension the
config does not fix is ``None`` (any size).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vla_accel_ros.models.files import SINGLE_FILE, indexed_shards, safetensors_header

Shape = tuple[int, ...]
ExpectedShape = tuple[int | None, ...]


@dataclass(frozen=True)
class StoredShapes:
    """Every tensor's shape as the headers declare it, and the file that holds it."""

    shapes: dict[str, Shape]
    files: dict[str, Path]

    def renamed(self, rename: Mapping[str, str] | None = None, strip: str = "") -> StoredShapes:
        """The same tensors under other names (``strip``: a prefix dropped; ``rename``: then these
        names replaced), so that a family compares under the names its expectations use."""
        shapes, files = {}, {}
        for name, shape in self.shapes.items():
            ours = name.removeprefix(strip) if strip else name
            ours = (rename or {}).get(ours, ours)
            shapes.setdefault(ours, shape)
            files.setdefault(ours, self.files[name])
        return StoredShapes(shapes, files)

    def count(self, prefix: str, suffix: str = "") -> int:
        """How many numbered blocks ``prefix<i>.`` the headers hold (a stack's depth), counting
        only names that end with ``suffix``."""
        numbers = set()
        for name in self.shapes:
            if name.startswith(prefix) and name.endswith(suffix):
                head = name[len(prefix):].split(".", 1)[0]
                if head.isdigit():
                    numbers.add(int(head))
        return len(numbers)


def file_shapes(paths: Iterable[Path]) -> StoredShapes:
    """The shapes in the headers of ``paths`` (SafetensorsProblem for one that is not complete)."""
    shapes: dict[str, Shape] = {}
    files: dict[str, Path] = {}
    for path in paths:
        entries, _ = safetensors_header(path)
        for name, entry in entries.items():
            shapes[name] = tuple(int(v) for v in entry.get("shape", ()))
            files[name] = path
    return StoredShapes(shapes, files)


def directory_shapes(directory: Path) -> StoredShapes:
    """The shapes of a model's weights in ``directory``: the shards its index names, else
    ``model.safetensors``, else every ``*.safetensors`` file."""
    shards = indexed_shards(directory)
    if shards is not None:
        return file_shapes(sorted(set(shards.values())))
    single = directory / SINGLE_FILE
    return file_shapes([single] if single.is_file() else sorted(directory.glob("*.safetensors")))


@dataclass
class ExpectedShapes:
    """What a config implies: (tensor name, shape, the config field that fixes it), in the order
    they are compared (a name may appear once per field that fixes some of its dimensions).
    ``optional`` names are compared when the headers hold them and not required otherwise.
    ``depths``: (a stack's prefix, how many numbered layers it holds, the config field)."""

    config_file: Path
    entries: list[tuple[str, ExpectedShape, str]] = field(default_factory=list)
    optional: set[str] = field(default_factory=set)
    depths: list[tuple[str, int, str]] = field(default_factory=list)

    def add_depth(self, prefix: str, layers: int, config_field: str) -> None:
        self.depths.append((prefix, layers, config_field))

    def add(self, name: str, shape: ExpectedShape, config_field: str, *, required: bool = True) -> None:
        self.entries.append((name, shape, config_field))
        if not required:
            self.optional.add(name)


def _shown(shape: ExpectedShape) -> str:
    return "(" + ", ".join("*" if v is None else str(v) for v in shape) + ("," if len(shape) == 1 else "") + ")"


def shape_mismatch(stored: StoredShapes, expected: ExpectedShapes, weights: Path) -> str:
    """The first disagreement of ``stored`` with ``expected`` as one line ("" when none): a tensor
    the headers hold in another shape (the tensor, both shapes, the config field), else a stack of
    another depth, else a tensor the config implies and the headers lack. ``weights``: the file
    named for the last two."""
    config = expected.config_file
    for name, shape, config_field in expected.entries:
        found = stored.shapes.get(name)
        if found is not None and (len(found) != len(shape)
                                  or any(want is not None and want != got for want, got in zip(shape, found))):
            return (f"{stored.files[name]}: tensor {name} has shape {_shown(found)} where {config.name}'s "
                    f"{config_field} implies {_shown(shape)}; the config does not describe these weights")
    for prefix, layers, config_field in expected.depths:
        held = stored.count(prefix)
        if held != layers:
            return (f"{weights}: {held} layers under {prefix}* where {config.name}'s {config_field} implies "
                    f"{layers}; the config does not describe these weights")
    for name, shape, config_field in expected.entries:
        if name not in stored.shapes and name not in expected.optional:
            return (f"{weights}: no tensor {name}, which {config.name}'s {config_field} implies "
                    f"(shape {_shown(shape)}); the config does not describe these weights")
    return ""


def check_shapes(stored: StoredShapes, expected: ExpectedShapes, weights: Path) -> None:
    """ValueError in one line at the first tensor whose stored shape is not what the config implies
    (:func:`shape_mismatch`)."""
    problem = shape_mismatch(stored, expected, weights)
    if problem:
        raise ValueError(problem)
