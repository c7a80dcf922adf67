"""A URDF the arm cannot serve fails at construction with a ValueError naming the joint and the
fault (the node prints it and refuses to start); every other URDF builds as before."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable

import numpy as np
import pytest

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf

LIMIT = '<limit lower="-2" upper="2" velocity="1.5" effort="10"/>'
INERTIAL = ('<inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/>'
            "</inertial>")


def joint(name: str, parent: str, child: str, kind: str = "revolute", body: str | None = None,
          origin: str = "0 0 0.1") -> str:
    body = f'<axis xyz="0 0 1"/>{LIMIT}' if body is None else body
    return (f'<joint name="{name}" type="{kind}"><parent link="{parent}"/><child link="{child}"/>'
            f'<origin xyz="{origin}"/>{body}</joint>')


def robot(*joints: str, links: tuple[str, ...] = ("base", "l1", "l2", "l3", "tcp")) -> str:
    parts = "".join(f'<link name="{n}">{INERTIAL}</link>' for n in links)
    return f'<robot name="three">{parts}{"".join(joints)}</robot>'


def three_joint_arm(j1: str | None = None, j2: str | None = None, j3: str | None = None,
                    extra: str = "", links: tuple[str, ...] = ("base", "l1", "l2", "l3", "tcp")) -> str:
    """joint1 (base->l1), joint2 (l1->l2), joint3 (l2->l3), a fixed tcp_joint (l3->tcp); ``j1``..``j3``
    replace a joint's whole element."""
    return robot(j1 or joint("joint1", "base", "l1"), j2 or joint("joint2", "l1", "l2"),
                 j3 or joint("joint3", "l2", "l3"), joint("tcp_joint", "l3", "tcp", "fixed", ""), extra,
                 links=links)


def j2(body: str, kind: str = "revolute") -> str:
    return joint("joint2", "l1", "l2", kind, body)


AXIS = '<axis xyz="0 1 0"/>'
FINGER_LINKS = ("base", "l1", "l2", "l3", "tcp", "finger_a", "finger_b")

# (case, URDF, tcp_frame, words the message must contain)
BAD_URDFS: list[tuple[str, str, str, list[str]]] = [
    ("revolute joint without <limit>", three_joint_arm(j2=j2(AXIS)), "tcp", ["joint2", "<limit>"]),
    ("prismatic joint without <limit>",
     three_joint_arm(j3=joint("joint3", "l2", "l3", "prismatic", AXIS)), "tcp", ["joint3", "<limit>"]),
    ("limit without velocity", three_joint_arm(j2=j2(AXIS + '<limit lower="-1" upper="1" effort="5"/>')), "tcp",
     ["joint2", "velocity"]),
    ("velocity 0", three_joint_arm(j2=j2(AXIS + '<limit lower="-1" upper="1" velocity="0" effort="5"/>')), "tcp",
     ["joint2", "velocity", "0"]),
    ("negative velocity", three_joint_arm(j2=j2(AXIS + '<limit lower="-1" upper="1" velocity="-2" effort="5"/>')),
     "tcp", ["joint2", "velocity", "-2"]),
    ("limit without lower", three_joint_arm(j2=j2(AXIS + '<limit upper="1" velocity="1" effort="5"/>')), "tcp",
     ["joint2", "lower"]),
    ("limit without upper", three_joint_arm(j2=j2(AXIS + '<limit lower="-1" velocity="1" effort="5"/>')), "tcp",
     ["joint2", "upper"]),
    ("limit without effort", three_joint_arm(j2=j2(AXIS + '<limit lower="-1" upper="1" velocity="1"/>')), "tcp",
     ["joint2", "effort"]),
    ("limit not a number", three_joint_arm(j2=j2(AXIS + '<limit lower="-1" upper="wide" velocity="1" effort="5"/>')),
     "tcp", ["joint2", "upper", "wide", "number"]),
    ("limit NaN", three_joint_arm(j2=j2(AXIS + '<limit lower="nan" upper="1" velocity="1" effort="5"/>')), "tcp",
     ["joint2", "lower", "number"]),
    ("lower above upper", three_joint_arm(j2=j2(AXIS + '<limit lower="0.3" upper="-2.0" velocity="1" effort="5"/>')),
     "tcp", ["joint2", "lower", "0.3", "-2"]),
    ("continuous arm joint without a velocity limit", three_joint_arm(j2=j2(AXIS, "continuous")), "tcp",
     ["joint2", "continuous", "velocity"]),
    ("floating joint in the arm", three_joint_arm(j2=j2("", "floating")), "tcp", ["joint2", "floating"]),
    ("planar joint in the arm", three_joint_arm(j2=j2('<axis xyz="0 0 1"/>', "planar")), "tcp", ["joint2", "planar"]),
    ("floating joint off the arm", three_joint_arm(extra=joint("free", "base", "box", "floating", ""),
                                                   links=("base", "l1", "l2", "l3", "tcp", "box")),
     "tcp", ["free", "floating"]),
    ("mimic joint in the arm",
     three_joint_arm(j2=j2(AXIS + LIMIT + '<mimic joint="joint1" multiplier="2" offset="0.1"/>')),
     "tcp", ["joint2", "mimic", "joint1"]),
    ("mimic of an unknown joint", three_joint_arm(
        extra=joint("finger_a", "l3", "finger_a", "prismatic", AXIS + LIMIT)
        + joint("finger_b", "l3", "finger_b", "prismatic", AXIS + LIMIT + '<mimic joint="finger_c"/>'),
        links=FINGER_LINKS), "tcp", ["finger_b", "mimic", "finger_c"]),
    ("gripper joint lower above upper", three_joint_arm(
        extra=joint("finger_a", "l3", "finger_a", "prismatic",
                    AXIS + '<limit lower="0.04" upper="0" velocity="1" effort="5"/>'),
        links=("base", "l1", "l2", "l3", "tcp", "finger_a")), "tcp", ["finger_a", "lower", "0.04"]),
    ("zero axis", three_joint_arm(j2=j2('<axis xyz="0 0 0"/>' + LIMIT)), "tcp", ["joint2", "axis"]),
    ("origin not three numbers", three_joint_arm(j2=joint("joint2", "l1", "l2", origin="0 0")), "tcp",
     ["joint2", "origin"]),
    ("unknown joint type", three_joint_arm(j2=j2(AXIS + LIMIT, "hinge")), "tcp", ["joint2", "hinge"]),
    ("child link missing", three_joint_arm(j3=joint("joint3", "l2", "l9")), "tcp", ["joint3", "l9"]),
    ("joint defined twice", three_joint_arm(j3=joint("joint2", "l2", "l3")), "tcp", ["joint2", "twice"]),
    ("link with two parent joints", three_joint_arm(extra=joint("joint4", "base", "l2")), "tcp",
     ["l2", "joint2", "joint4"]),
    ("links in a loop", three_joint_arm(j2=joint("joint2", "l3", "l2")), "tcp", ["root", "loop"]),
    ("malformed XML", three_joint_arm()[:-20], "tcp", ["malformed"]),
    ("TCP frame missing", three_joint_arm(), "gripper_tip", ["gripper_tip", "not found", "base", "l1"]),
    ("no movable joint on the chain", three_joint_arm(), "base", ["no movable joint", "base"]),
]


@pytest.mark.parametrize(("urdf", "tcp_frame", "words"), [case[1:] for case in BAD_URDFS],
                         ids=[case[0] for case in BAD_URDFS])
def test_bad_urdf_is_refused_naming_the_joint_and_the_fault(urdf: str, tcp_frame: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as caught:
        ArmKinematics(urdf, tcp_frame=tcp_frame)
    message = str(caught.value)
    assert "Pinocchio could not build" not in message
    for word in words:
        assert word in message, f"'{word}' not in: {message}"


def test_the_three_joint_arm_itself_builds() -> None:
    kin = ArmKinematics(three_joint_arm())
    assert kin.joint_names == ("joint1", "joint2", "joint3")
    assert np.allclose(kin.fk(np.zeros(3)).position, [0.0, 0.0, 0.4])


def test_fixed_joint_in_the_middle_and_a_continuous_joint_build() -> None:
    urdf = robot(joint("joint1", "base", "l1"),
                 joint("mid_fixed", "l1", "l1b", "fixed", "", origin="0.2 0 0"),
                 joint("joint2", "l1b", "l2", "continuous", '<axis xyz="0 0 1"/><limit velocity="2" effort="5"/>'),
                 joint("joint3", "l2", "l3", "prismatic",
                       '<axis xyz="1 0 0"/><limit lower="0" upper="0.3" velocity="0.5" effort="50"/>'),
                 joint("tcp_joint", "l3", "tcp", "fixed", "", origin="0.1 0 0"),
                 links=("base", "l1", "l1b", "l2", "l3", "tcp"))
    kin = ArmKinematics(urdf)
    assert kin.joint_names == ("joint1", "joint2", "joint3")
    assert np.isinf(kin.limits.lower[1]) and np.isinf(kin.limits.upper[1])
    assert np.allclose(kin.limits.velocity, [1.5, 2.0, 0.5])
    # joint1 and joint2 both rotate about z; the fixed joint offsets 0.2 along l1's x, then joint3's
    # travel (0.1) and the TCP offset (0.1) lie along x rotated by both angles; each joint lifts 0.1.
    a, b = 0.5, 0.25
    expected = [0.2 * np.cos(a) + 0.2 * np.cos(a + b), 0.2 * np.sin(a) + 0.2 * np.sin(a + b), 0.3]
    assert np.allclose(kin.fk(np.array([0.5, 0.25, 0.1])).position, expected, atol=1e-9)


def test_gripper_fingers_may_mimic_and_may_rely_on_the_default_lower_limit() -> None:
    """As in the Panda and xArm descriptions: one finger follows the other, and ros2_control and
    transmission blocks hold <joint> elements of their own."""
    fingers = (joint("finger_a", "l3", "finger_a", "prismatic",
                     AXIS + '<limit upper="0.04" velocity="0.2" effort="20"/>')
               + joint("finger_b", "l3", "finger_b", "prismatic",
                       AXIS + '<limit lower="0" upper="0.04" velocity="0.2" effort="20"/><mimic joint="finger_a"/>')
               + '<transmission name="t1"><type>transmission_interface/SimpleTransmission</type>'
                 '<joint name="joint1"><hardwareInterface>PositionJointInterface</hardwareInterface></joint>'
                 '</transmission>'
               + '<ros2_control name="arm" type="system"><joint name="joint2">'
                 '<command_interface name="position"/></joint>'
                 "</ros2_control>")
    kin = ArmKinematics(three_joint_arm(extra=fingers, links=FINGER_LINKS))
    assert kin.joint_names == ("joint1", "joint2", "joint3")
    assert kin.gripper_joint_names == ("finger_a", "finger_b")
    assert np.allclose(kin.gripper_limits.lower, 0.0) and np.allclose(kin.gripper_limits.upper, 0.04)
    assert np.allclose(kin.fk(np.zeros(3)).position, ArmKinematics(three_joint_arm()).fk(np.zeros(3)).position)


def test_tcp_frame_may_be_a_joint() -> None:
    by_link = ArmKinematics(three_joint_arm(), tcp_frame="tcp")
    by_joint = ArmKinematics(three_joint_arm(), tcp_frame="tcp_joint")
    assert by_joint.joint_names == by_link.joint_names
    q = np.array([0.1, -0.2, 0.3])
    assert np.allclose(by_joint.fk(q).position, by_link.fk(q).position)


def _without(xml: str, joint_name: str, element: str, attribute: str | None) -> str:
    root = ET.fromstring(xml)
    target = next(j for j in root.findall("joint") if j.get("name") == joint_name)
    node = target if element == "joint" else target.find(element)
    assert node is not None
    if attribute is None:
        target.remove(node)
    else:
        del node.attrib[attribute]
    return ET.tostring(root, encoding="unicode")


def _arm7_removals() -> list[tuple[str, str, str | None]]:
    """Every (joint, element, attribute) of the package URDF's joints; attribute None: the element."""
    removals: list[tuple[str, str, str | None]] = []
    for j in ET.fromstring(default_urdf().read_text()).findall("joint"):
        name = j.get("name", "")
        removals += [(name, "joint", key) for key in j.attrib]
        for child in j:
            removals.append((name, child.tag, None))
            removals += [(name, child.tag, key) for key in child.attrib]
    return removals


def test_any_one_piece_missing_from_the_package_urdf_builds_or_names_the_fault() -> None:
    """Removing any one attribute or element of any joint of arm7.urdf either leaves a URDF that
    builds or raises ValueError from the checks (naming a joint or link), never Pinocchio's bare
    "not a valid URDF model" and never another exception."""
    xml = default_urdf().read_text()
    outcomes: dict[str, int] = {"built": 0, "refused": 0}
    failures: list[str] = []
    for name, element, attribute in _arm7_removals():
        variant = _without(xml, name, element, attribute)
        case = f"{name} <{element}> {attribute or '(element)'}"
        try:
            ArmKinematics(variant)
        except ValueError as err:
            outcomes["refused"] += 1
            if "Pinocchio could not build" in str(err):
                failures.append(f"{case}: {err}")
        except Exception as err:  # noqa: BLE001 - the point is that nothing else escapes
            failures.append(f"{case}: {type(err).__name__}: {err}")
        else:
            outcomes["built"] += 1
    assert not failures, "\n".join(failures)
    assert outcomes["refused"] > 0 and outcomes["built"] > 0


@pytest.mark.parametrize("make", [
    lambda: three_joint_arm(),
    lambda: default_urdf().read_text(),
], ids=["three-joint arm", "arm7"])
def test_valid_urdfs_pass_the_checks(make: Callable[[], str]) -> None:
    ArmKinematics(make())
