"""``fleet-bench --server dds``: N robots served by one ``vla_inference_node`` over DDS.

The inference node runs in a child process on its own ROS_DOMAIN_ID, serving robots ``robot0`` ..
``robotN-1`` (its batched rounds). The robots are lightweight clients in one rclpy node here: at
each control tick every robot publishes its next recorded observation (image and joint state,
stamped alike, as a control node in ``inference_mode: remote`` does) and takes the answers stamped
with its observations; a robot's round trip is from its observation's publication to the answer.
rclpy is imported when a run starts, so the module imports without ROS.
"""

import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.ros.processes import NodeProcess, parameter_arguments

DDS_DOMAIN_ID = 184  # fleet-bench's own domain: no other node's traffic
WARM_UP_TIMEOUT_S = 180.0


class _Trace:
    def __init__(self) -> None:
        self.sent: list[float] = []
        self.answered: list[float] = []


def dds_run(streams: Sequence[Sequence[Observation]], *, checkpoint: str, decoder: str, threads: int,
            period_s: float, ticks: int, domain_id: int = DDS_DOMAIN_ID
            ) -> tuple[list[tuple[list[float], list[float]]], float]:
    """One run: the inference node started, every robot answered once (warm-up), then ``ticks``
    control periods measured. Returns each robot's (publication times, answer times) of its
    answered observations, and the window's start, on the monotonic clock."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String
    from trajectory_msgs.msg import JointTrajectory

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.ros import remote_protocol
    from vla_accel_ros.ros.rclpy_util import LATCHED_QOS
    from vla_accel_ros.ros.remote_link import ACTION_QOS, OBSERVATION_QOS

    names = [f"robot{r}" for r in range(len(streams))]
    joint_names = ArmKinematics(default_urdf()).joint_names
    params = {"robots": names, "decoder": decoder, "torch_threads": threads, "control_period_s": period_s,
              **({"checkpoint": checkpoint} if checkpoint else {})}
    log = Path(tempfile.mkdtemp(prefix="fleet_bench_dds_")) / "vla_inference_node.log"
    server = NodeProcess.start("vla_accel_ros.ros.inference_node", ["--ros-args", *parameter_arguments(params)], log,
                               {**os.environ, "ROS_DOMAIN_ID": str(domain_id)})
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain_id)
    node = rclpy.create_node("fleet_bench_robots", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    lock = threading.Lock()
    sent: list[dict[Any, float]] = [{} for _ in names]
    traces = [_Trace() for _ in names]
    try:
        publishers = []
        for r, name in enumerate(names):
            publishers.append((node.create_publisher(Image, f"/{name}/{remote_protocol.IMAGE_TOPIC}", OBSERVATION_QOS),
                               node.create_publisher(JointState, f"/{name}/{remote_protocol.STATE_TOPIC}",
                                                     OBSERVATION_QOS)))
            task = node.create_publisher(String, f"/{name}/{remote_protocol.INSTRUCTION_TOPIC}", LATCHED_QOS)
            task.publish(String(data=streams[r][0].instruction))

            def on_action(msg: JointTrajectory, r: int = r) -> None:
                arrived = time.monotonic()
                with lock:
                    at = sent[r].pop(remote_protocol.stamp_key(msg.header.stamp), None)
                    if at is not None:
                        traces[r].sent.append(at)
                        traces[r].answered.append(arrived)

            node.create_subscription(JointTrajectory, f"/{name}/{remote_protocol.ACTION_TOPIC}", on_action, ACTION_QOS)

        def publish(tick: int) -> None:
            for r, (image_pub, state_pub) in enumerate(publishers):
                stream = streams[r]
                obs = stream[tick % len(stream)]
                stamped = Observation(obs.image, obs.instruction, obs.joint_pos, obs.gripper, time.time())
                state = remote_protocol.state_message(stamped, joint_names)
                with lock:
                    sent[r][remote_protocol.stamp_key(state.header.stamp)] = time.monotonic()
                image_pub.publish(remote_protocol.image_message(stamped))
                state_pub.publish(state)

        deadline = time.monotonic() + WARM_UP_TIMEOUT_S
        tick = 0
        while not all(t.answered for t in traces):  # the node loads, then answers every robot once
            if server.returncode is not None:
                raise server.exit_error("before answering every robot")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vla_inference_node did not answer every robot within {WARM_UP_TIMEOUT_S:g} s "
                                   f"(its log: {log})")
            publish(tick)
            tick += 1
            time.sleep(period_s)
        time.sleep(0.5)  # answers in flight land before the window
        with lock:
            for r in range(len(names)):
                traces[r], sent[r] = _Trace(), {}
        start = time.monotonic() + 0.1
        for tick in range(ticks):
            time.sleep(max(0.0, start + tick * period_s - time.monotonic()))
            publish(tick)
        time.sleep(2 * period_s)  # the last tick's answers
        with lock:
            return [(list(t.sent), list(t.answered)) for t in traces], start
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown(context=context)
        spinner.join(timeout=5)
        server.stop()
