"""The package installs its data files where ROS 2 tools look for them."""

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# Gazebo's packages: a simulation host's, never a robot PC's (conditional on VLA_ACCEL_ROS_GAZEBO)
GAZEBO = {"robot_state_publisher", "ros_gz_sim", "ros_gz_bridge", "gz_ros2_control", "controller_manager",
          "joint_state_broadcaster", "forward_command_controller"}


def test_package_xml_is_format_3_ament_python():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3"
    assert root.findtext("name") == "vla_accel_ros"
    assert root.find("export/build_type").text == "ament_python"
    deps = {d.text for d in root.findall("exec_depend")}
    assert {"rclpy", "sensor_msgs", "std_msgs", "trajectory_msgs", "diagnostic_msgs", "rosgraph_msgs"} <= deps


def test_every_rosdep_key_exists_in_the_rosdistro_snapshot():
    """rosdep stops at the first key it cannot resolve: each one package.xml names must be in the
    committed snapshot of ros/rosdistro (test/fixtures/rosdep_keys.yaml says how it was read)."""
    known = yaml.safe_load((ROOT / "test" / "fixtures" / "rosdep_keys.yaml").read_text())
    root = ET.parse(ROOT / "package.xml").getroot()
    keys = {d.text.strip() for d in root if d.tag.endswith("depend")}
    assert sorted(keys - set(known)) == []


def test_gazebo_is_not_pulled_onto_a_robot():
    root = ET.parse(ROOT / "package.xml").getroot()
    unconditional = {d.text.strip() for d in root if d.tag.endswith("depend") and not d.get("condition")}
    assert not unconditional & GAZEBO
    conditions = {d.text.strip(): d.get("condition") for d in root if d.tag.endswith("depend") and d.get("condition")}
    assert set(conditions) == GAZEBO and set(conditions.values()) == {"$VLA_ACCEL_ROS_GAZEBO == 1"}


def test_the_readme_pip_line_installs_what_has_no_rosdep_key():
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("pip install") and "safetensors" in line)
    named = set(re.findall(r"[a-z][a-z0-9_-]*(?==|>|<|\s|\"|$)", line.split("#")[0].removeprefix("pip install")))
    assert {"safetensors", "transformers", "torch"} <= named


def test_wheel_contains_share_files(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("vla_accel_ros-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
    assert "share/ament_index/resource_index/packages/vla_accel_ros" in data
    assert "share/vla_accel_ros/package.xml" in data
    assert "share/vla_accel_ros/urdf/arm7.urdf" in data
    for sub in ("launch", "config", "checkpoints/default"):
        expected = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / sub).glob("*") if p.is_file())
        for rel in expected:
            assert f"share/vla_accel_ros/{rel}" in data, rel
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "vla-accel = vla_accel_ros.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
