"""Checks of a URDF's text before Pinocchio reads it, with messages that name the joint or link.

Pinocchio's URDF reader answers most faults with "does not contain a valid URDF model", and takes
some faults silently (a lower limit above the upper, a mimic joint as an independent joint, a loop
of links left out of the model). :func:`check_urdf` reads the XML with the standard library and
raises :class:`ValueError` for each of these, naming the joint and the problem:

- the document: malformed XML, a root other than ``<robot>``, unnamed or twice-defined joints and
  links, an unknown joint type, a joint whose parent or child link is missing;
- the tree: one root link, each link the child of at most one joint, every link reachable;
- the arm (the movable joints on the way from the root link to the TCP frame): a TCP frame that
  exists, at least one movable joint, revolute/continuous/prismatic joints only, no mimic joints,
  a ``<limit>`` with a velocity above zero, and lower and upper limits unless continuous;
- every joint: numbers where the URDF has numbers, lower <= upper, a non-zero axis for movable
  joints, no floating or planar joints (the gripper joints off the arm are 1-DoF as well), and a
  mimic joint that follows a joint of the URDF.

Gripper joints may mimic another joint: they are held at their lower limit for kinematics, so
their coupling to a leader never moves the TCP.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass

MOVABLE_JOINT_TYPES = ("revolute", "continuous", "prismatic")
MULTI_DOF_JOINT_TYPES = ("floating", "planar")
URDF_JOINT_TYPES = (*MOVABLE_JOINT_TYPES, "fixed", *MULTI_DOF_JOINT_TYPES)
FRAMES_LISTED = 10  # how many link names a "TCP frame not found" message lists


@dataclass(frozen=True)
class CheckedUrdf:
    """What the checks found: the movable joints by name and the arm's joints, root first."""

    movable_joints: dict[str, ET.Element]
    arm_joints: tuple[str, ...]


def check_urdf(xml: str, label: str, tcp_frame: str) -> CheckedUrdf:
    """Check the URDF text ``xml`` (``label`` names its source in messages) for an arm ending at
    ``tcp_frame``; raise ValueError naming the joint or link at fault."""
    root = _parse(xml, label)
    links = _links(root, label)
    joints = _joints(root, label)
    for name, joint in joints.items():
        _check_joint_elements(name, joint, links, label)
    parent_joint = _check_tree(joints, links, label)
    movable = {name: j for name, j in joints.items() if j.get("type") in MOVABLE_JOINT_TYPES}
    if not movable:
        raise ValueError(f"URDF in {label} has no movable joints (revolute, continuous or prismatic)")

    chain = _chain_to(tcp_frame, joints, links, parent_joint, label)
    for name in chain:  # root first, so the joint nearest the root is the one named
        kind = joints[name].get("type")
        if kind in MULTI_DOF_JOINT_TYPES:
            raise ValueError(f"{label}: joint '{name}' on the arm chain to TCP frame '{tcp_frame}' is {kind}; "
                             "the arm supports revolute, continuous, prismatic and fixed joints")
    arm = tuple(name for name in chain if name in movable)
    if not arm:
        raise ValueError(f"no movable joint between the root of {label} and TCP frame '{tcp_frame}'")
    for name, joint in joints.items():
        kind = joint.get("type")
        if kind in MULTI_DOF_JOINT_TYPES:  # off the arm: gripper joints are held as 1-DoF joints
            raise ValueError(f"{label}: joint '{name}' is {kind}; joints off the arm chain (gripper and "
                             "others) must be revolute, continuous, prismatic or fixed")
        if name in movable:
            _check_mimic(name, joint, joints, label, on_arm=name in arm, tcp_frame=tcp_frame)
            _check_limits(name, joint, label, on_arm=name in arm)
    return CheckedUrdf(movable, arm)


def _parse(xml: str, label: str) -> ET.Element:
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as err:
        raise ValueError(f"malformed URDF XML in {label}: {err}") from err
    if root.tag != "robot":
        raise ValueError(f"URDF in {label} has root element <{root.tag}>, expected <robot>")
    return root


def _links(root: ET.Element, label: str) -> list[str]:
    names: list[str] = []
    for link in root.findall("link"):  # direct children only, as in URDF readers
        name = link.get("name", "").strip()
        if not name:
            raise ValueError(f"{label}: a <link> has no name")
        if name in names:
            raise ValueError(f"{label}: link '{name}' is defined twice")
        names.append(name)
    if not names:
        raise ValueError(f"URDF in {label} has no <link>")
    return names


def _joints(root: ET.Element, label: str) -> dict[str, ET.Element]:
    # Direct children only: <transmission> and <ros2_control> hold <joint name=...> elements too.
    joints: dict[str, ET.Element] = {}
    for joint in root.findall("joint"):
        name = joint.get("name", "").strip()
        if not name:
            raise ValueError(f"{label}: a <joint> has no name")
        if name in joints:
            raise ValueError(f"{label}: joint '{name}' is defined twice")
        joints[name] = joint
    return joints


def _check_joint_elements(name: str, joint: ET.Element, links: list[str], label: str) -> None:
    kind = joint.get("type")
    if kind not in URDF_JOINT_TYPES:
        found = f"type '{kind}'" if kind else "no type"
        raise ValueError(f"{label}: joint '{name}' has {found}; URDF joint types are {', '.join(URDF_JOINT_TYPES)}")
    for end in ("parent", "child"):
        element = joint.find(end)
        link = element.get("link", "").strip() if element is not None else ""
        if not link:
            raise ValueError(f"{label}: joint '{name}' has no <{end} link=...>")
        if link not in links:
            raise ValueError(f"{label}: joint '{name}' names {end} link '{link}', which is not a <link> of the URDF")
    origin = joint.find("origin")
    if origin is not None:
        for key in ("xyz", "rpy"):
            _vector(name, "origin", key, origin.get(key), label)
    if kind in MOVABLE_JOINT_TYPES:
        axis = joint.find("axis")
        if axis is not None:  # absent: URDF's default axis, x
            values = _vector(name, "axis", "xyz", axis.get("xyz"), label)
            if values is not None and not any(values):
                raise ValueError(f"{label}: joint '{name}' ({kind}) has axis '{axis.get('xyz')}'; "
                                 "a movable joint needs a non-zero axis")


def _vector(joint: str, element: str, key: str, text: str | None, label: str) -> list[float] | None:
    """The three numbers of an ``xyz``/``rpy`` attribute, None if absent."""
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split()]
    except ValueError:
        values = []
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{label}: joint '{joint}' <{element} {key}='{text}'> is not three finite numbers")
    return values


def _check_tree(joints: dict[str, ET.Element], links: list[str], label: str) -> dict[str, str]:
    """Check the links form one tree; return each non-root link's parent joint."""
    parent_joint: dict[str, str] = {}
    children: dict[str, list[str]] = {}
    for name, joint in joints.items():
        child = _link_of(joint, "child")
        if child in parent_joint:
            raise ValueError(f"{label}: link '{child}' is the child of two joints, '{parent_joint[child]}' and "
                             f"'{name}'; a URDF is a tree")
        parent_joint[child] = name
        children.setdefault(_link_of(joint, "parent"), []).append(child)
    roots = [link for link in links if link not in parent_joint]
    if len(roots) != 1:
        found = f"several root links (links without a parent joint): {', '.join(roots)}" if roots else \
            "no root link (every link has a parent joint)"
        raise ValueError(f"{label}: {found}; a URDF is a tree with one root link")
    reached, todo = {roots[0]}, [roots[0]]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in reached:
                reached.add(child)
                todo.append(child)
    unreached = [link for link in links if link not in reached]
    if unreached:
        raise ValueError(f"{label}: links {', '.join(unreached)} are not connected to the root link "
                         f"'{roots[0]}' (their joints form a loop)")
    return parent_joint


def _link_of(joint: ET.Element, end: str) -> str:
    element = joint.find(end)
    assert element is not None  # _check_joint_elements ran first
    return element.get("link", "").strip()


def _chain_to(tcp_frame: str, joints: dict[str, ET.Element], links: list[str], parent_joint: dict[str, str],
              label: str) -> list[str]:
    """All joints (fixed ones too) from the root link to ``tcp_frame``, a link or a joint, root first."""
    if tcp_frame in links:
        joint = parent_joint.get(tcp_frame)
    elif tcp_frame in joints:  # Pinocchio has a frame for every joint as well
        joint = tcp_frame
    else:
        shown = ", ".join(links[:FRAMES_LISTED])
        more = f", ... ({len(links) - FRAMES_LISTED} more)" if len(links) > FRAMES_LISTED else ""
        raise ValueError(f"TCP frame '{tcp_frame}' not found in {label}; its links are: {shown}{more}")
    chain: list[str] = []
    while joint is not None:  # ends at the root link: _check_tree ruled out loops
        chain.append(joint)
        joint = parent_joint.get(_link_of(joints[joint], "parent"))
    chain.reverse()
    return chain


def _check_mimic(name: str, joint: ET.Element, joints: dict[str, ET.Element], label: str, *, on_arm: bool,
                 tcp_frame: str) -> None:
    mimic = joint.find("mimic")
    if mimic is None:
        return
    leader = mimic.get("joint", "").strip()
    if not leader:
        raise ValueError(f"{label}: joint '{name}' has a <mimic> without a joint to follow")
    if leader not in joints:
        raise ValueError(f"{label}: joint '{name}' mimics '{leader}', which is not a joint of the URDF")
    factors = {key: _number(name, "mimic", key, mimic.get(key), label) for key in ("multiplier", "offset")}
    if on_arm:
        # Pinocchio would read it as an independent joint, and IK would move it on its own.
        multiplier = 1.0 if factors["multiplier"] is None else factors["multiplier"]
        offset = 0.0 if factors["offset"] is None else factors["offset"]
        raise ValueError(f"{label}: arm joint '{name}' mimics '{leader}' (multiplier {multiplier:g}, offset "
                         f"{offset:g}); mimic joints on the arm chain to TCP frame '{tcp_frame}' are not "
                         "supported (only gripper joints may mimic)")


def _check_limits(name: str, joint: ET.Element, label: str, *, on_arm: bool) -> None:
    kind = joint.get("type")
    limit = joint.find("limit")
    if limit is None:
        if kind != "continuous":
            raise ValueError(f"{label}: joint '{name}' ({kind}) has no <limit>; revolute and prismatic joints need "
                             "one with lower, upper, velocity and effort")
        if on_arm:  # the velocity limit is the only bound on how far a continuous joint moves per step
            raise ValueError(f"{label}: arm joint '{name}' (continuous) has no <limit velocity=...>; the arm's "
                             "joints need a velocity limit above 0")
        return
    values = {key: _number(name, "limit", key, limit.get(key), label) for key in ("lower", "upper", "velocity",
                                                                                 "effort")}
    for key in ("velocity", "effort"):  # URDF readers refuse a <limit> without either
        if values[key] is None:
            raise ValueError(f"{label}: joint '{name}' <limit> has no {key} attribute")
    velocity = values["velocity"]
    assert velocity is not None
    if on_arm and velocity <= 0.0:
        # The controller clamps each step to velocity * dt: 0 would freeze the joint, < 0 is no limit.
        raise ValueError(f"{label}: arm joint '{name}' has velocity limit {velocity:g}; it must be above 0")
    if kind == "continuous":
        return  # URDF ignores lower/upper on continuous joints
    lower, upper = values["lower"], values["upper"]
    if on_arm:  # a silent default of 0 would pin the joint, or clamp it to one side of zero
        for key in ("lower", "upper"):
            if values[key] is None:
                raise ValueError(f"{label}: arm joint '{name}' ({kind}) <limit> has no {key} attribute")
    lower = 0.0 if lower is None else lower  # URDF's default, kept for gripper joints
    upper = 0.0 if upper is None else upper
    if lower > upper:
        raise ValueError(f"{label}: joint '{name}' has lower limit {lower:g} above its upper limit {upper:g}")


def _number(joint: str, element: str, key: str, text: str | None, label: str) -> float | None:
    """A finite number attribute, None if absent."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{label}: joint '{joint}' <{element} {key}='{text}'> is not a finite number")
    return value
