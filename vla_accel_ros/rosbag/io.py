"""rosbag2 I/O for record and replay, with the ``rosbags`` library (no ROS installation needed).

- :class:`BagWriter`: a rosbag2 (format version 9, MCAP by default or SQLite3) written from
  ``rosbags`` message objects (:func:`make_image`, :func:`make_joint_state`, ...) or from CDR bytes
  as rclpy serialises them (the live recorder passes the bytes through untouched).
- :func:`open_bag` / :class:`BagReader`: checks a bag before anything runs (exists, has metadata,
  opens, holds the required topics) and iterates its messages in time order; every failure,
  including a truncated or corrupt storage file found half-way, is a :class:`BagError` naming the
  bag and the problem.

Topic names follow the node's defaults (``TOPICS``). ROS-free.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

STORAGES = ("mcap", "sqlite3")
CUSTOM_KEY = "vla_accel"  # metadata.yaml custom_data key holding the recording's settings (JSON)

# role -> (default topic, message type)
TOPICS: dict[str, tuple[str, str]] = {
    "camera": ("/camera/image_raw", "sensor_msgs/msg/Image"),
    "wrist_camera": ("/wrist_camera/image_raw", "sensor_msgs/msg/Image"),  # a second image slot, when recorded
    "joint_states": ("/joint_states", "sensor_msgs/msg/JointState"),
    "instruction": ("/vla_accel_node/instruction", "std_msgs/msg/String"),
    "commands": ("/arm_controller/commands", "std_msgs/msg/Float64MultiArray"),
    "gripper": ("/gripper_controller/commands", "std_msgs/msg/Float64MultiArray"),
    "clock": ("/clock", "rosgraph_msgs/msg/Clock"),
    "robot_description": ("/robot_description", "std_msgs/msg/String"),
    "stats": ("/vla_accel_node/stats", "std_msgs/msg/String"),
    "episode": ("/sim_node/episode", "std_msgs/msg/String"),
}


class BagError(ValueError):
    """A bag is missing, unreadable, truncated, corrupt or lacks a topic; the message says which."""


def typestore() -> Any:
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_KILTED)


_TS: Any = None


def _ts() -> Any:
    global _TS
    if _TS is None:
        _TS = typestore()
    return _TS


# --- message construction (rosbags dataclasses) --------------------------------------------------
def stamp_ns(t_s: float) -> int:
    """Seconds -> integer nanoseconds (the one rounding every writer uses)."""
    return int(round(t_s * 1e9))


def _time(t_ns: int) -> Any:
    return _ts().types["builtin_interfaces/msg/Time"](sec=int(t_ns // 1_000_000_000), nanosec=int(t_ns % 1_000_000_000))


def _header(t_ns: int, frame_id: str = "") -> Any:
    return _ts().types["std_msgs/msg/Header"](stamp=_time(t_ns), frame_id=frame_id)


def make_image(rgb: np.ndarray, t_ns: int, frame_id: str = "camera") -> Any:
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w = rgb.shape[:2]
    return _ts().types["sensor_msgs/msg/Image"](header=_header(t_ns, frame_id), height=h, width=w, encoding="rgb8",
                                                is_bigendian=0, step=w * 3, data=rgb.reshape(-1))


def make_compressed_image(rgb: np.ndarray, t_ns: int, fmt: str = "jpeg", frame_id: str = "camera") -> Any:
    """A sensor_msgs/CompressedImage of ``rgb`` encoded as ``fmt`` (jpeg or png)."""
    import cv2

    ok, data = cv2.imencode(".png" if fmt == "png" else ".jpg", cv2.cvtColor(np.ascontiguousarray(rgb, np.uint8),
                                                                            cv2.COLOR_RGB2BGR))
    if not ok:
        raise ValueError(f"cannot encode a {rgb.shape} image as {fmt}")
    return _ts().types["sensor_msgs/msg/CompressedImage"](header=_header(t_ns, frame_id), format=fmt,
                                                          data=np.asarray(data, dtype=np.uint8).reshape(-1))


def make_joint_state(names: Sequence[str], position: Sequence[float], t_ns: int,
                     velocity: Sequence[float] = ()) -> Any:
    return _ts().types["sensor_msgs/msg/JointState"](
        header=_header(t_ns), name=list(names), position=np.asarray(position, dtype=np.float64),
        velocity=np.asarray(velocity, dtype=np.float64), effort=np.zeros(0, dtype=np.float64))


def make_float_array(values: Sequence[float]) -> Any:
    types = _ts().types
    layout = types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
    return types["std_msgs/msg/Float64MultiArray"](layout=layout, data=np.asarray(values, dtype=np.float64))


def make_string(text: str) -> Any:
    return _ts().types["std_msgs/msg/String"](data=text)


def make_clock(t_ns: int) -> Any:
    return _ts().types["rosgraph_msgs/msg/Clock"](clock=_time(t_ns))


def header_ns(msg: Any) -> int | None:
    """The header stamp of a deserialised message in ns, or None (no header, or a zero stamp)."""
    header = getattr(msg, "header", None)
    if header is None:
        return None
    t = int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)
    return t if t > 0 else None


# --- writing -------------------------------------------------------------------------------------
class BagWriter:
    """A rosbag2 being written; a context manager. Not thread-safe (one writer thread)."""

    def __init__(self, path: str | Path, storage: str = "mcap", custom: dict[str, Any] | None = None) -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        if storage not in STORAGES:
            raise ValueError(f"storage must be one of {', '.join(STORAGES)}, got '{storage}'")
        self.path = Path(path)
        if self.path.exists():
            raise FileExistsError(f"bag {self.path} exists already; choose another --out or remove it")
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        self._writer = Writer(self.path, version=9, storage_plugin=plugin)
        if custom:
            self._writer.set_custom_data(CUSTOM_KEY, json.dumps(custom))
        self._writer.open()
        self._connections: dict[str, Any] = {}
        self.counts: dict[str, int] = {}
        self.closed = False

    def _connection(self, topic: str, msgtype: str) -> Any:
        conn = self._connections.get(topic)
        if conn is None:
            conn = self._writer.add_connection(topic, msgtype, typestore=_ts())
            self._connections[topic] = conn
            self.counts[topic] = 0
        elif conn.msgtype != msgtype:
            raise ValueError(f"topic {topic} is {conn.msgtype} in this bag, not {msgtype}")
        return conn

    def write(self, topic: str, t_ns: int, msg: Any) -> None:
        """Write a rosbags message object at log time ``t_ns``."""
        self.write_raw(topic, msg.__msgtype__, t_ns, _ts().serialize_cdr(msg, msg.__msgtype__))

    def write_raw(self, topic: str, msgtype: str, t_ns: int, cdr: bytes | memoryview | np.ndarray) -> None:
        """Write CDR bytes (as rclpy serialises them) of type ``msgtype`` at log time ``t_ns``."""
        conn = self._connection(topic, msgtype)
        data = cdr if isinstance(cdr, np.ndarray) else np.frombuffer(bytes(cdr), dtype=np.uint8)
        self._writer.write(conn, int(t_ns), data)
        self.counts[topic] += 1

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.close()

    def __enter__(self) -> BagWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- reading -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BagMessage:
    topic: str  # after remapping
    msgtype: str
    log_ns: int
    msg: Any  # deserialised rosbags message

    @property
    def stamp_ns(self) -> int:
        """The header stamp when the message has a non-zero one, else the log time."""
        return header_ns(self.msg) or self.log_ns


class BagReader:
    """An opened, checked bag. Use :func:`open_bag`; a context manager."""

    def __init__(self, path: Path, reader: Any, remap: dict[str, str], custom: dict[str, Any]) -> None:
        self.path = path
        self._reader = reader
        self.remap = remap
        self.custom = custom
        # topic (remapped) -> (msgtype, message count)
        self.topics: dict[str, tuple[str, int]] = {}
        for conn in reader.connections:
            name = remap.get(conn.topic, conn.topic)
            old = self.topics.get(name, (conn.msgtype, 0))
            self.topics[name] = (conn.msgtype, old[1] + int(conn.msgcount or 0))

    @property
    def message_count(self) -> int:
        return int(sum(n for _, n in self.topics.values()))

    @property
    def start_ns(self) -> int:
        """The log time of the bag's first message (0 for an empty bag): what times since the bag's
        start count from."""
        return int(getattr(self._reader, "start_time", 0) or 0) if self.message_count else 0

    def count(self, topic: str) -> int:
        return self.topics.get(topic, ("", 0))[1]

    def require(self, topics: Sequence[str]) -> None:
        """BagError naming the topics of ``topics`` that hold no message, and what the bag has."""
        missing = [t for t in topics if self.count(t) == 0]
        if missing:
            have = ", ".join(f"{t} ({n})" for t, (_, n) in sorted(self.topics.items())) or "nothing"
            raise BagError(f"bag {self.path} lacks topic(s) {', '.join(missing)}; it has: {have}"
                           + ("; use --remap FROM:=TO if the topic is named differently" if self.topics else ""))

    def messages(self, topics: Sequence[str] | None = None, raw: bool = False) -> Iterator[BagMessage]:
        """Messages in log-time order (remapped topic names); BagError if the storage breaks.
        ``topics`` (remapped names): only those topics' messages, none when no topic matches; None: all.
        ``raw``: ``msg`` is the CDR bytes (what an rclpy publisher sends as is), not decoded."""
        wanted = None if topics is None else set(topics)
        conns = [c for c in self._reader.connections
                 if wanted is None or self.remap.get(c.topic, c.topic) in wanted]
        if not conns and wanted is not None:
            return  # the storage reader takes an empty connection list for "all of them"
        seen: Counter[int] = Counter()
        try:
            for conn, t_ns, data in self._reader.messages(connections=conns):
                seen[conn.id] += 1
                if raw:
                    yield BagMessage(self.remap.get(conn.topic, conn.topic), conn.msgtype, int(t_ns), bytes(data))
                    continue
                try:
                    msg = self._reader.deserialize(data, conn.msgtype)
                except Exception as err:  # rosbags raises many kinds on malformed CDR
                    raise BagError(f"bag {self.path}: cannot decode a {conn.msgtype} message on {conn.topic} "
                                   f"at t={t_ns} ns: {type(err).__name__}: {err}") from err
                yield BagMessage(self.remap.get(conn.topic, conn.topic), conn.msgtype, int(t_ns), msg)
        except BagError:
            raise
        except Exception as err:  # truncated MCAP chunks, damaged SQLite pages, zstd errors, ...
            raise BagError(f"bag {self.path} is truncated or corrupt: {type(err).__name__}: {err}") from err
        # A damaged chunk can be skipped silently by the storage reader: count against the metadata.
        short = [f"{c.topic} ({seen[c.id]} of {c.msgcount})" for c in conns if c.msgcount and seen[c.id] < c.msgcount]
        if short:
            raise BagError(f"bag {self.path} is truncated or corrupt: fewer messages than its metadata lists "
                           f"on {', '.join(short)}")

    def close(self) -> None:
        try:
            self._reader.close()
        except Exception:  # closing a broken storage file must not hide the first error
            pass

    def __enter__(self) -> BagReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_remaps(remaps: Sequence[str]) -> dict[str, str]:
    """``["FROM:=TO", ...]`` (the ros2 bag play --remap syntax) -> {FROM: TO}."""
    out: dict[str, str] = {}
    for item in remaps:
        src, sep, dst = item.partition(":=")
        if not sep or not src.strip() or not dst.strip():
            raise ValueError(f"--remap expects FROM:=TO, got '{item}'")
        out[src.strip()] = dst.strip()
    return out


def read_custom(path: Path) -> dict[str, Any]:
    """The recording's settings stored under custom_data (empty if none)."""
    try:
        meta = yaml.safe_load((path / "metadata.yaml").read_text()) or {}
        text = (meta.get("rosbag2_bagfile_information", {}).get("custom_data") or {}).get(CUSTOM_KEY)
        return json.loads(text) if text else {}
    except (OSError, yaml.YAMLError, json.JSONDecodeError, AttributeError):
        return {}


def open_bag(path: str | Path, required: Sequence[str] = (), remap: dict[str, str] | None = None) -> BagReader:
    """Open and check a rosbag2 directory; BagError naming the problem otherwise."""
    from rosbags.highlevel import AnyReader

    path = Path(path)
    if not path.exists():
        raise BagError(f"bag {path} does not exist")
    if path.is_dir() and not (path / "metadata.yaml").is_file():
        raise BagError(f"bag {path} has no metadata.yaml: not a rosbag2 directory (or an unfinished recording)")
    reader = AnyReader([path], default_typestore=_ts())
    try:
        reader.open()
    except Exception as err:  # AnyReaderError, ReaderError, yaml and storage errors
        raise BagError(f"bag {path} cannot be opened: {type(err).__name__}: {err}") from err
    bag = BagReader(path, reader, dict(remap or {}), read_custom(path) if path.is_dir() else {})
    try:
        bag.require(required)
    except BagError:
        bag.close()
        raise
    return bag


def float_seconds(t_ns: int) -> float:
    """ns -> s, the one conversion the recorder and the replay share (bit-identical times)."""
    return t_ns * 1e-9

