import sys
import threading

import mujoco
import numpy as np
import pytest

from vla_accel_ros.core.kinematics import ArmKinematics, MissingJointsError
from vla_accel_ros.core.resources import default_urdf

URDF = default_urdf()


@pytest.fixture(scope="module")
def kin() -> ArmKinematics:
    return ArmKinematics(URDF)


def random_configs(kin: ArmKinematics, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(kin.limits.lower, kin.limits.upper, size=(n, kin.n))


def test_arm_and_gripper_joints(kin):
    assert kin.joint_names == tuple(f"joint{i}" for i in range(1, 8))
    assert kin.gripper_joint_names == ("finger_joint1", "finger_joint2")
    assert np.allclose(kin.limits.velocity, [2.175] * 4 + [2.61] * 3)
    assert np.allclose(kin.limits.effort, [87] * 4 + [12] * 3)
    assert kin.limits.lower[3] == pytest.approx(-3.0718) and kin.limits.upper[5] == pytest.approx(3.7525)


def test_fk_matches_mujoco_over_100_configurations(kin):
    model = mujoco.MjModel.from_xml_path(str(URDF))
    data = mujoco.MjData(model)
    tcp = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "tcp")
    qadr = [model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n)] for n in kin.joint_names]
    worst_pos = worst_rot = 0.0
    for q in random_configs(kin, 100):
        data.qpos[:] = 0.0
        data.qpos[qadr] = q
        mujoco.mj_kinematics(model, data)
        pose = kin.fk(q)
        worst_pos = max(worst_pos, np.abs(pose.position - data.xpos[tcp]).max())
        delta = ArmKinematics.pose_delta(pose, type(pose)(data.xpos[tcp], data.xmat[tcp].reshape(3, 3)))
        worst_rot = max(worst_rot, np.abs(delta[3:]).max())
    assert worst_pos <= 1e-6
    assert worst_rot <= 1e-6


def test_jacobian_matches_finite_differences(kin):
    q = random_configs(kin, 1, seed=3)[0]
    jac = kin.jacobian(q)
    eps = 1e-6
    for j in range(kin.n):
        dq = np.zeros(kin.n)
        dq[j] = eps
        numeric = ArmKinematics.pose_delta(kin.fk(q), kin.fk(q + dq)) / eps
        assert np.allclose(jac[:, j], numeric, atol=1e-4)


def test_ik_round_trip(kin):
    rng = np.random.default_rng(1)
    q_home = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    for _ in range(20):
        q = q_home + rng.uniform(-0.3, 0.3, kin.n)
        delta = np.concatenate([rng.uniform(-0.02, 0.02, 3), rng.uniform(-0.05, 0.05, 3)])
        q_new = kin.ik(q, delta)
        achieved = ArmKinematics.pose_delta(kin.fk(q), kin.fk(q_new))
        # The rotation part composes on the left, so compare target and reached poses directly.
        start = kin.fk(q)
        reached = kin.fk(q_new)
        assert np.allclose(reached.position, start.position + delta[:3], atol=1e-5)
        assert np.allclose(achieved[:3], delta[:3], atol=1e-5)
        import pinocchio as pin

        assert np.allclose(pin.log3(reached.rotation @ start.rotation.T), delta[3:], atol=1e-5)


def test_ik_rejects_bad_delta(kin):
    with pytest.raises(ValueError, match="6 finite"):
        kin.ik(np.zeros(7), np.array([np.nan, 0, 0, 0, 0, 0]))


def test_clamp_to_position_and_velocity_limits(kin):
    q_now = np.array([0.0, 0.0, 0.0, -1.0, 0.0, 1.0, 0.0])
    dt = 0.05
    far = q_now + 10.0
    clamped = kin.clamp(far, q_now, dt)
    assert np.all(clamped - q_now <= kin.limits.velocity * dt + 1e-12)
    assert kin.within_limits(clamped)
    # Position limit binds even when the velocity budget is large.
    clamped = kin.clamp(np.full(7, 100.0), q_now, dt=1e6)
    assert np.allclose(clamped, kin.limits.upper)
    clamped = kin.clamp(np.full(7, -100.0), q_now, dt=1e6)
    assert np.allclose(clamped, kin.limits.lower)


def test_limit_margin(kin):
    mid = (kin.limits.lower + kin.limits.upper) / 2
    assert np.allclose(kin.limit_margin(mid), 0.5)
    assert np.allclose(kin.limit_margin(kin.limits.lower), 0.0)


def test_name_mapping_with_shuffled_and_extra_joints(kin):
    rng = np.random.default_rng(2)
    q = rng.normal(size=7)
    names = list(kin.joint_names) + ["finger_joint1", "some_other_joint"]
    values = list(q) + [0.01, 42.0]
    order = rng.permutation(len(names))
    shuffled_names = [names[i] for i in order]
    shuffled_values = [values[i] for i in order]
    assert np.allclose(kin.from_named(shuffled_names, shuffled_values), q)
    controller_order = [kin.joint_names[i] for i in rng.permutation(7)]
    out = kin.to_named(q, controller_order)
    assert np.allclose(kin.from_named(controller_order, out), q)


def test_missing_joints_named(kin):
    with pytest.raises(MissingJointsError, match="joint3"):
        kin.from_named([n for n in kin.joint_names if n != "joint3"], np.zeros(6))
    with pytest.raises(ValueError, match="not arm joints"):
        kin.to_named(np.zeros(7), ["joint1", "elbow"])


# --- bad URDF input -------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        ArmKinematics(tmp_path / "nope.urdf")


def test_malformed_xml():
    with pytest.raises(ValueError, match="malformed URDF XML"):
        ArmKinematics("<robot name='x'><link name='a'></robot>")


def test_no_movable_joints():
    xml = """<robot name="r"><link name="a"/><link name="b"/>
    <joint name="j" type="fixed"><parent link="a"/><child link="b"/></joint></robot>"""
    with pytest.raises(ValueError, match="no movable joints"):
        ArmKinematics(xml, tcp_frame="b")


def test_unknown_tcp_frame():
    with pytest.raises(ValueError, match="TCP frame 'gripper_tip' not found"):
        ArmKinematics(URDF, tcp_frame="gripper_tip")


# --- any reasonable serial arm --------------------------------------------------------------------
GENERIC_ARM = """<robot name="generic">
  <link name="base"/>
  <link name="stand"/>
  <joint name="stand_fixed" type="fixed"><parent link="base"/><child link="stand"/><origin xyz="0 0 0.1"/></joint>
  <link name="turret">
    <inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <joint name="spin" type="continuous">
    <parent link="stand"/><child link="turret"/><axis xyz="0 0 1"/><limit velocity="3" effort="10"/>
  </joint>
  <link name="slider">
    <inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <joint name="lift" type="prismatic">
    <parent link="turret"/><child link="slider"/><axis xyz="0 0 1"/>
    <limit lower="0" upper="0.5" velocity="0.5" effort="100"/>
  </joint>
  <link name="forearm">
    <inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <joint name="elbow" type="revolute">
    <parent link="slider"/><child link="forearm"/><origin xyz="0.3 0 0"/><axis xyz="0 1 0"/>
    <limit lower="-2" upper="2" velocity="2" effort="10"/>
  </joint>
  <link name="camera_mount"/>
  <joint name="camera_fixed" type="fixed">
    <parent link="turret"/><child link="camera_mount"/><origin xyz="0 0.1 0"/>
  </joint>
  <link name="tip"/>
  <joint name="tip_fixed" type="fixed"><parent link="forearm"/><child link="tip"/><origin xyz="0.2 0 0"/></joint>
</robot>"""


def test_generic_arm_with_continuous_prismatic_fixed_joints():
    kin = ArmKinematics(GENERIC_ARM, tcp_frame="tip")
    assert kin.joint_names == ("spin", "lift", "elbow")
    assert np.isinf(kin.limits.lower[0]) and np.isinf(kin.limits.upper[0])
    pose = kin.fk(np.array([np.pi / 2, 0.2, 0.0]))
    assert np.allclose(pose.position, [0.0, 0.5, 0.3], atol=1e-9)
    q = np.array([0.3, 0.1, 0.4])
    # A 3-DoF arm reaches only some 6-D deltas: ask for one that a joint motion produces.
    reachable = ArmKinematics.pose_delta(kin.fk(q), kin.fk(q + np.array([0.05, 0.03, -0.02])))
    q_new = kin.ik(q, reachable, iterations=10)
    assert np.allclose(kin.fk(q_new).position, kin.fk(q).position + reachable[:3], atol=1e-4)
    # Continuous joints have no position limits, but velocity limits still bind.
    clamped = kin.clamp(np.array([100.0, 0.1, 0.4]), q, dt=0.1)
    assert clamped[0] == pytest.approx(0.3 + 0.3)


def test_threads_sharing_one_arm_each_get_their_own_poses() -> None:
    """The node's control timer (IK) and an inference thread (the Kalman filter's FK) share one
    ArmKinematics; a shared Pinocchio workspace let one read the other's pose."""
    kin = ArmKinematics(URDF)
    rng = np.random.default_rng(0)
    configurations = [rng.uniform(np.maximum(kin.limits.lower, -3), np.minimum(kin.limits.upper, 3)) for _ in range(2)]
    expected = [kin.fk(q).position for q in configurations]
    wrong = [0, 0]

    def poses(i: int) -> None:
        for _ in range(5000):
            wrong[i] += not np.allclose(kin.fk(configurations[i]).position, expected[i])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, to make a race show
    try:
        threads = [threading.Thread(target=poses, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == [0, 0]


def test_fk_acceleration_is_the_second_derivative_of_the_tcp_position(kin):
    rng = np.random.default_rng(7)
    for _ in range(5):
        q = rng.uniform(kin.limits.lower, kin.limits.upper)
        qd, qdd = rng.normal(0, 0.5, 7), rng.normal(0, 2.0, 7)
        pose, acceleration = kin.fk_acceleration(q, qd, qdd)
        np.testing.assert_allclose(pose.position, kin.fk(q).position, atol=1e-12)
        np.testing.assert_allclose(pose.rotation, kin.fk(q).rotation, atol=1e-12)
        h = 1e-4  # central difference of the TCP along q(t) = q + qd t + qdd t^2 / 2

        def position(t, q=q, qd=qd, qdd=qdd):
            return kin.fk(q + qd * t + 0.5 * qdd * t * t).position

        second = (position(h) - 2 * position(0.0) + position(-h)) / h**2
        np.testing.assert_allclose(acceleration, second, atol=1e-5)
    with pytest.raises(ValueError, match="velocities"):
        kin.fk_acceleration(q, np.zeros(3), qdd)


def test_min_limit_margin_is_the_smallest_limit_margin(kin):
    rng = np.random.default_rng(8)
    for q in rng.uniform(kin.limits.lower - 0.2, kin.limits.upper + 0.2, (200, 7)):
        assert kin.min_limit_margin(q) == pytest.approx(float(np.min(kin.limit_margin(q))), abs=1e-12)
    assert np.isnan(kin.min_limit_margin(np.full(7, np.nan)))
