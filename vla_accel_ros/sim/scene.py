"""The MuJoCo scene, built from the arm's URDF: a table, three cubes, actuators and cameras.

MuJoCo loads the URDF (its ``<mujoco>`` block keeps fixed links such as ``tcp`` as bodies) but
creates no actuators, so they are added here with ``MjSpec``: a position servo per arm joint and
per finger. The arm is gravity-compensated, so the servos track their targets without sag, the way a
real arm's controller does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from vla_accel_ros.core.kinematics import ArmKinematics

CUBE_COLORS: dict[str, tuple[float, float, float, float]] = {
    "red": (0.85, 0.12, 0.10, 1.0),
    "green": (0.10, 0.70, 0.15, 1.0),
    "blue": (0.10, 0.25, 0.90, 1.0),
}
CUBE_HALF_SIZE = 0.02  # 4 cm cubes
TABLE_TOP_Z = 0.0  # the robot base stands on the table top
PHYSICS_TIMESTEP = 0.002
ARM_KP, ARM_KV = 4000.0, 150.0  # stiff servos: the arm reaches its target within one 50 ms period

# Robot geoms collide with the table and cubes but not with each other (contype/conaffinity bits).
_ROBOT_BITS = (2, 1)
_WORLD_BITS = (1, 1)


@dataclass(frozen=True)
class SceneHandles:
    """Indices into the compiled model that the environment needs every step."""

    arm_qpos: np.ndarray  # qpos address per arm joint
    arm_dof: np.ndarray  # dof address per arm joint
    finger_qpos: np.ndarray  # qpos addresses of the finger joints
    arm_actuators: np.ndarray
    finger_actuators: np.ndarray
    cube_body: dict[str, int]
    cube_qpos: dict[str, int]  # freejoint qpos address (3 position + 4 quaternion)
    tcp_body: int
    finger_bodies: tuple[int, int]
    camera: str
    wrist_camera: str


FRONT_CAMERA_POS = np.array([1.0, 0.0, 0.75])
FRONT_CAMERA_TARGET = np.array([0.45, 0.0, 0.08])
FRONT_CAMERA_FOVY = 50.0  # degrees; the image is square, so the horizontal field is the same


def front_camera_coordinates(points: np.ndarray) -> np.ndarray:
    """World points (..., 3) -> where the front camera images them, (..., 2): x across the
    columns and y down the rows, both in [-1, 1] over the image (the policy's keypoint frame)."""
    right, up, forward = _look_at_axes(FRONT_CAMERA_POS, FRONT_CAMERA_TARGET)
    rel = np.asarray(points, dtype=np.float64) - FRONT_CAMERA_POS
    depth = rel @ forward
    focal = 1.0 / np.tan(np.radians(FRONT_CAMERA_FOVY) / 2.0)
    return np.stack([focal * (rel @ right) / depth, -focal * (rel @ up) / depth], axis=-1)


def _look_at_axes(position: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit (right, up, forward) axes of a camera at ``position`` looking at ``target``, z up."""
    forward = target - position
    forward = forward / np.linalg.norm(forward)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    return right, np.cross(right, forward), forward


def _look_at_quat(position: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Quaternion (w, x, y, z) of a MuJoCo camera at ``position`` looking at ``target``, z up."""
    right, up, forward = _look_at_axes(position, target)
    rot = np.stack([right, up, -forward], axis=1)  # camera looks along its -z axis
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, rot.flatten())
    return quat


def build_scene(urdf_path: Path | str, kin: ArmKinematics) -> tuple[mujoco.MjModel, SceneHandles]:
    """Compile the pick-cube scene around the arm described by ``urdf_path``."""
    spec = mujoco.MjSpec.from_file(str(urdf_path))
    spec.option.timestep = PHYSICS_TIMESTEP
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    spec.option.impratio = 10.0  # stiffer friction: grasped cubes do not slip
    spec.visual.quality.offsamples = 0  # no MSAA: 128 px frames render several times faster on a CPU

    finger_names = set(kin.gripper_joint_names)
    finger_link_names: list[str] = []
    for body in spec.bodies:
        if body.name == "world":
            continue
        body.gravcomp = 1.0
        is_finger = any(j.name in finger_names for j in body.joints)
        if is_finger:
            finger_link_names.append(body.name)
        for geom in body.geoms:
            geom.contype, geom.conaffinity = _ROBOT_BITS
            geom.rgba = (0.15, 0.15, 0.15, 1.0) if is_finger else (0.9, 0.9, 0.9, 1.0)
            if is_finger:
                geom.friction = (2.0, 0.02, 0.002)
                geom.condim = 4
    for joint in spec.joints:
        joint.armature = 0.1 if joint.name not in finger_names else 0.01

    world = spec.worldbody
    world.add_light(pos=(0.4, -0.6, 1.6), dir=(0.0, 0.4, -1.0), diffuse=(0.7, 0.7, 0.7))
    world.add_light(pos=(0.8, 0.6, 1.4), dir=(-0.3, -0.4, -1.0), diffuse=(0.4, 0.4, 0.4))
    table = world.add_geom(
        name="table", type=mujoco.mjtGeom.mjGEOM_BOX, size=(0.45, 0.6, 0.02), pos=(0.35, 0.0, TABLE_TOP_Z - 0.02)
    )
    table.rgba = (0.55, 0.42, 0.30, 1.0)
    table.contype, table.conaffinity = _WORLD_BITS
    floor = world.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=(2, 2, 0.1), pos=(0, 0, -0.75))
    floor.rgba = (0.3, 0.3, 0.32, 1.0)

    for color, rgba in CUBE_COLORS.items():
        cube = world.add_body(name=f"cube_{color}", pos=(0.5, 0.0, CUBE_HALF_SIZE))
        cube.add_freejoint(name=f"cube_{color}_joint")
        geom = cube.add_geom(
            name=f"cube_{color}_geom",
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=(CUBE_HALF_SIZE,) * 3,
            mass=0.05,
            friction=(1.5, 0.02, 0.002),
            condim=4,
        )
        geom.rgba = rgba
        geom.contype, geom.conaffinity = _WORLD_BITS

    world.add_camera(
        name="front", pos=FRONT_CAMERA_POS, quat=_look_at_quat(FRONT_CAMERA_POS, FRONT_CAMERA_TARGET),
        fovy=FRONT_CAMERA_FOVY
    )
    hand = spec.body("hand")
    hand.add_camera(name="wrist", pos=(0.06, 0.0, 0.02), quat=(0.0, 1.0, 0.0, 0.0), fovy=70.0)

    for name, lower, upper, effort in zip(kin.joint_names, kin.limits.lower, kin.limits.upper, kin.limits.effort):
        act = spec.add_actuator(name=f"{name}_servo", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_position(kp=ARM_KP, kv=ARM_KV)
        act.ctrlrange = (lower, upper)
        act.forcerange = (-effort, effort)
    for name, upper in zip(kin.gripper_joint_names, kin.gripper_limits.upper):
        act = spec.add_actuator(name=f"{name}_servo", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_position(kp=300.0, kv=20.0)
        act.ctrlrange = (0.0, upper)
        act.forcerange = (-40.0, 40.0)

    model = spec.compile()
    jid = lambda n: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n)  # noqa: E731
    bid = lambda n: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, n)  # noqa: E731
    aid = lambda n: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR, n)  # noqa: E731
    handles = SceneHandles(
        arm_qpos=np.array([model.jnt_qposadr[jid(n)] for n in kin.joint_names]),
        arm_dof=np.array([model.jnt_dofadr[jid(n)] for n in kin.joint_names]),
        finger_qpos=np.array([model.jnt_qposadr[jid(n)] for n in kin.gripper_joint_names]),
        arm_actuators=np.array([aid(f"{n}_servo") for n in kin.joint_names]),
        finger_actuators=np.array([aid(f"{n}_servo") for n in kin.gripper_joint_names]),
        cube_body={c: bid(f"cube_{c}") for c in CUBE_COLORS},
        cube_qpos={c: int(model.jnt_qposadr[jid(f"cube_{c}_joint")]) for c in CUBE_COLORS},
        tcp_body=bid(kin.tcp_frame),
        finger_bodies=tuple(bid(n) for n in finger_link_names[:2]),  # type: ignore[arg-type]
        camera="front",
        wrist_camera="wrist",
    )
    return model, handles
