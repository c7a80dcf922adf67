"""Comparing a replay's commands with the ones the bag recorded: the bag's messages in a fixed order
within one log time, recorded commands read in any of the node's output formats, produced and
recorded commands matched by stamp (nearest within half a control period) with their differences,
the unsafe commands counted, and the one-line verdict (or, when nothing was produced, its likely
cause).

The tolerance a replay is judged by depends on the recording (:func:`default_tolerance`). A
deterministic recording (``vla-accel record --mode deterministic``) replays bit-identically, so its
default is :data:`DEFAULT_TOLERANCE`. A live recording's commands came from a threaded node whose
inference finished when it did, so the replay's commands differ by the motion of a tick or two: its
default is :data:`LIVE_TOLERANCE_PERIODS` control periods of motion at the slowest arm joint's
velocity limit, and the verdict says so; its replay matches when every matched command is within
that tolerance and at least :data:`LIVE_MIN_MATCHED` of the recorded commands were matched. Times
are seconds since the bag's first message.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from vla_accel_ros.rosbag.io import TOPICS, BagMessage, float_seconds
from vla_accel_ros.rosbag.lockstep import Command

DEFAULT_TOLERANCE = 1e-6  # rad: a deterministic recording's replay is bit-identical
# A live recording's default tolerance: this many control periods of motion at the slowest arm
# joint's velocity limit (the commands of a replay and of the live node may be a tick or two apart).
LIVE_TOLERANCE_PERIODS = 2
# A live recording's replay matches when this share of the recorded commands found a replayed one
# within half a period (the live node's ticks and the replay's frames do not line up one to one).
LIVE_MIN_MATCHED = 0.9
DETERMINISTIC = "deterministic"
LIVE = "live"
# Within one log time: the URDF first, then time, the task, the arm, and last the frame that
# triggers inference (so the frame sees the joint state stamped with it).
# the wrist camera before the scene camera: the scene camera's frame completes an observation and ticks
PRIORITY = {"robot_description": 0, "clock": 1, "instruction": 2, "joint_states": 3, "wrist_camera": 4, "camera": 5}


def grouped(messages: Iterable[BagMessage], roles: dict[str, str]) -> Iterator[tuple[str, BagMessage]]:
    """(role, message) in log-time order; messages sharing a log time in ``PRIORITY`` order."""
    batch: list[tuple[int, int, str, BagMessage]] = []
    for i, m in enumerate(messages):
        if batch and m.log_ns != batch[0][3].log_ns:
            yield from ((role, msg) for _, _, role, msg in sorted(batch, key=lambda x: (x[0], x[1])))
            batch = []
        role = roles.get(m.topic, "other")
        batch.append((PRIORITY.get(role, 9), i, role, m))
    yield from ((role, msg) for _, _, role, msg in sorted(batch, key=lambda x: (x[0], x[1])))


def parse_command(kin: Any, controller_joints: tuple[str, ...], msgtype: str, msg: Any) -> np.ndarray | None:
    """Arm positions (URDF order) of a recorded command message in any of the node's formats."""
    try:
        if msgtype.endswith("Float64MultiArray"):
            data = np.asarray(msg.data, dtype=float)
            return kin.from_named(controller_joints, data) if data.size == len(controller_joints) else None
        if msgtype.endswith("JointTrajectory"):
            return kin.from_named(msg.joint_names, np.asarray(msg.points[-1].positions, float)) if msg.points else None
        if msgtype.endswith("JointState"):
            names = list(msg.name)
            arm = [(n, p) for n, p in zip(names, msg.position) if n in kin.joint_names]
            return kin.from_named([n for n, _ in arm], [p for _, p in arm])
    except ValueError:
        return None
    return None


def recording_kind(custom: dict[str, Any]) -> str:
    """:data:`DETERMINISTIC` for a bag ``vla-accel record --mode deterministic`` wrote (its
    metadata's ``custom``), else :data:`LIVE` (a live recording, ``ros2 bag record`` included)."""
    return DETERMINISTIC if custom.get("source") == "record" and custom.get("mode") == DETERMINISTIC else LIVE


def default_tolerance(kind: str, kin: Any, period_s: float) -> float:
    """The tolerance (rad) a replay of a recording of ``kind`` is judged by when none is given (see
    the module docstring)."""
    if kind == DETERMINISTIC:
        return DEFAULT_TOLERANCE
    velocity = np.asarray(kin.limits.velocity, dtype=float)[: len(kin.joint_names)]
    finite = velocity[np.isfinite(velocity) & (velocity > 0)]
    return float(LIVE_TOLERANCE_PERIODS * period_s * (finite.min() if finite.size else 1.0))


def match_commands(produced: list[Command], recorded: list[Command], period_s: float) -> list[tuple[int, int]]:
    """(produced index, recorded index) of each produced command and the recorded one nearest in
    time, when that is within half a control period."""
    if not produced or not recorded:
        return []
    rec_t = np.array([c.t_ns for c in recorded], dtype=np.int64)
    half = int(period_s * 0.5e9)
    pairs = []
    for step, cmd in enumerate(produced):
        i = int(np.searchsorted(rec_t, cmd.t_ns))
        near = [j for j in (i - 1, i) if 0 <= j < len(rec_t)]
        j = min(near, key=lambda k: abs(int(rec_t[k]) - cmd.t_ns))
        if abs(int(rec_t[j]) - cmd.t_ns) <= half:
            pairs.append((step, j))
    return pairs


def compare(produced: list[Command], recorded: list[Command], joint_names: tuple[str, ...], period_s: float,
            tolerance: float, start_ns: int = 0, recording: str = DETERMINISTIC) -> dict[str, Any]:
    """Match each produced command with the recorded one nearest in time (within half a period);
    ``start_ns``: the bag's start, which ``first_divergent_t_s`` counts from; ``recording``: its
    kind, which says how many commands must match (all of them, or most of the recorded ones)."""
    out: dict[str, Any] = {"recorded_commands": len(recorded), "matched": 0, "recorded_matched": 0,
                           "max_abs_diff": None, "mean_abs_diff": None, "first_divergent_step": None,
                           "first_divergent_stamp_s": None, "first_divergent_t_s": None, "per_joint": {},
                           "gripper_max_abs_diff": None, "identical": False, "within_tolerance": False,
                           "tolerance": tolerance}
    diffs, finger_diffs, found = [], [], set()
    for step, j in match_commands(produced, recorded, period_s):
        found.add(j)
        cmd = produced[step]
        d = np.abs(cmd.q - recorded[j].q)
        diffs.append(d)
        if cmd.fingers.size and recorded[j].fingers.size == cmd.fingers.size:
            finger_diffs.append(float(np.abs(cmd.fingers - recorded[j].fingers).max()))
        if out["first_divergent_step"] is None and float(d.max()) > tolerance:
            out["first_divergent_step"], out["first_divergent_stamp_s"] = step, float_seconds(cmd.t_ns)
            out["first_divergent_t_s"] = float_seconds(cmd.t_ns - start_ns)
    if not diffs:
        return out
    d = np.array(diffs)
    out.update({
        "matched": len(diffs),
        "recorded_matched": len(found),
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.mean()),
        "per_joint": {name: {"max_abs_diff": float(d[:, k].max()), "mean_abs_diff": float(d[:, k].mean())}
                      for k, name in enumerate(joint_names)},
        "gripper_max_abs_diff": max(finger_diffs) if finger_diffs else None,
    })
    complete = len(diffs) == len(produced) == len(recorded)
    out["identical"] = bool(complete and float(d.max()) == 0.0 and not any(finger_diffs))
    enough = complete if recording == DETERMINISTIC else len(found) >= LIVE_MIN_MATCHED * len(recorded)
    out["within_tolerance"] = bool(enough and float(d.max()) <= tolerance)
    return out


def count_unsafe(kin: Any, commands: list[Command]) -> int:
    """Commands with NaN/inf or outside the URDF position limits (must be 0)."""
    return sum(1 for c in commands if not (np.all(np.isfinite(c.q)) and kin.within_limits(c.q)
                                           and np.all(np.isfinite(c.fingers))))


def no_command_cause(s: dict[str, Any]) -> str:
    """The likely reason a replay produced no command, from what its summary saw."""
    topics = {role: topic for role, (topic, _) in TOPICS.items()} | s.get("input_topics", {})
    if not s["frames"]:
        return f"no camera frames reached the node (topic {topics['camera']})"
    if not s.get("joint_states"):
        return f"no joint states reached the node (topic {topics['joint_states']})"
    names, arm = s.get("joint_state_names"), s["arm_joints"]
    missing = [j for j in arm if names is not None and j not in names]
    if missing:
        which = "none of them there" if len(missing) == len(arm) else f"missing {', '.join(missing)}"
        source = f" (from {s['urdf']})" if s.get("urdf") else ""
        return (f"the joint states name {names} but the URDF's arm joints are {arm}{source} ({which}): "
                f"a bag of another arm? The URDF comes from --urdf, else the params file's robot_description "
                f"or urdf_file, else the bag's {TOPICS['robot_description'][0]}, else the package's: give the "
                f"arm's with --urdf and --tcp-frame")
    if s["errors"]:
        return f"the node rejected its input: {s['errors'][0]}"
    if s.get("inferences") == 0:
        return "no inference ran (no joint state or instruction before the frames?)"
    log = f"; see {s['node_log']}" if s.get("node_log") else ""
    return f"the node published no command for {s['frames']} frames{log}"


def verdict(s: dict[str, Any]) -> str:
    """The replay's result in one line: what ran, what it produced, how it compares with the
    recording under which tolerance (and, for a live recording, why that one), times in seconds
    since the bag's start."""
    live = s.get("recording") == LIVE
    head = f"replay ({s['mode']}{', of a live recording' if live else ''}): {s['frames']} frames -> " \
           f"{s['commands']} commands"
    if not s["recorded_commands"]:
        tail = "the bag holds no recorded commands to compare with"
    elif not s["matched"]:
        tail = f"none of them matches one of the {s['recorded_commands']} recorded commands in time"
    else:
        word = "IDENTICAL" if s["identical"] else ("MATCH" if s["within_tolerance"] else "DIVERGED")
        tail = (f"{word} vs {s['recorded_commands']} recorded ({s['matched']} matched) at tolerance "
                f"{s['tolerance']:.3g} rad: max |diff| {s['max_abs_diff']:.3g} rad, mean {s['mean_abs_diff']:.3g} rad")
        if s["first_divergent_step"] is not None:
            at = s.get("first_divergent_t_s")
            at = s["first_divergent_stamp_s"] if at is None else at
            tail += f", first beyond it at step {s['first_divergent_step']} (t={at:.3f} s)"
        elif not s["within_tolerance"]:  # every difference within it: too few commands were matched
            needed = f"{LIVE_MIN_MATCHED:.0%} of them" if live else "every one, one to one"
            tail += (f", but only {s.get('recorded_matched', s['matched'])} of the {s['recorded_commands']} recorded "
                     f"commands have a replayed one within half a control period ({needed} needed)")
        if live and s.get("tolerance_source") == "recording":
            tail += (f"; a live recording's commands depend on thread timing and cannot reproduce bit-identically, "
                     f"so its tolerance is {LIVE_TOLERANCE_PERIODS} control periods of motion at the slowest joint's "
                     f"velocity limit (--tolerance to set one); record with --mode deterministic for exact "
                     f"regression tests")
    errors = f"; {len(s['errors'])} kinds of input rejected" if s["errors"] else ""
    unsafe = f"; {s['unsafe_commands']} UNSAFE commands" if s["unsafe_commands"] else ""
    return f"{head}; {tail}{errors}{unsafe}"
