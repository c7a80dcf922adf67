"""ament_python build of vla_accel_ros (also installable with plain pip)."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "vla_accel_ros"


def share(subdir: str, pattern: str = "*") -> tuple[str, list[str]]:
    return (f"share/{PACKAGE}/{subdir}", sorted(p for p in glob(f"{subdir}/{pattern}") if "." in p.rsplit("/", 1)[-1]))


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        share("launch", "*.launch.py"),
        share("config", "*.yaml"),
        share("config/examples", "*.yaml"),
        share("config/openpi", "*.json"),
        share("urdf", "*.urdf"),
        share("urdf", "*.xacro"),
        share("checkpoints/default"),
        share("checkpoints/default/retrieval_store"),
        share("checkpoints/hf_small"),
    ],
    # ROS 2 itself (rclpy, messages) comes from the distribution or requirements-ros.txt, never
    # from here, so that a colcon build on Jazzy/Kilted is not disturbed.
    install_requires=[
        "numpy",
        "pyyaml",
        "tqdm",
        "matplotlib",
        "safetensors",
        "pillow",
        "opencv-python-headless",
        "pin",
        "mujoco",
        "rosbags",
        "torch",
        "websockets",
        "msgpack",
    ],
    # Ray Serve: `vla-accel serve-openpi --engine ray` and `fleet-bench --server ray`
    extras_require={"fleet": ["ray[serve]==2.60.0"]},
    zip_safe=False,
    maintainer="vla_accel_ros maintainers",
    maintainer_email="maintainers@vla-accel-ros.dev",
    description="VLA policy node for ROS 2 arms with kinematics-aware speculative decoding.",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "vla-accel = vla_accel_ros.cli:main",
            "vla_accel_node = vla_accel_ros.ros.node:main",
            "sim_node = vla_accel_ros.ros.sim_node:main",
            "vla_inference_node = vla_accel_ros.ros.inference_node:main",
        ],
    },
)
