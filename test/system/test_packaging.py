"""The package installs its data files where ROS 2 tools look for them."""

import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_package_xml_is_format_3_ament_python():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3"
    assert root.findtext("name") == "vla_accel_ros"
    assert root.find("export/build_type").text == "ament_python"
    deps = {d.text for d in root.findall("exec_depend")}
    assert {"rclpy", "sensor_msgs", "std_msgs", "trajectory_msgs", "diagnostic_msgs", "rosgraph_msgs"} <= deps


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
