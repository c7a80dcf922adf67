"""``serve-openpi --engine ray``: the Ray Serve application on loopback, driven by openpi-client.

One Ray instance for the module (two CPUs), shut down after. Each test deploys the application with
the options it needs (a redeploy replaces it behind the same proxy port).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.models.openpi.config import LIBERO
from vla_accel_ros.runtime import ray_serve
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.runtime.openpi_server import ApiKeyCheck, observation_from_request, result_reply
from vla_accel_ros.runtime.ray_options import RayServeOptions

HOST = "127.0.0.1"
# kerv_released's threshold follows the episode's step count and its fill the robot's own token
# history: a runner shared or swapped between connections gives other tokens.
DECODER = "kerv_released"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_checkpoint) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ray_serve") / "ckpt")


@pytest.fixture(scope="module")
def deploy(checkpoint):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    def deploy_with(checkpoint_source: str = str(checkpoint), api_key: str = "", **options: Any) -> int:
        config = RunnerConfig(checkpoint=checkpoint_source, decoder=DECODER, temperature=0.0)
        return ray_serve.start(config, LIBERO, {"server": "test"}, RayServeOptions(**options), host=HOST, port=0,
                               api_key=ApiKeyCheck(api_key) if api_key else None)

    try:
        yield deploy_with
    finally:
        ray_serve.stop()
        ray.shutdown()


def stream(seed: int, steps: int) -> list[dict[str, Any]]:
    """One robot's requests: its own images and a slowly moving arm."""
    rng = np.random.default_rng(seed)
    kin = ArmKinematics(default_urdf())
    q0 = (kin.limits.lower + kin.limits.upper) / 2
    return [{"observation/image": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8),
             "observation/state": np.concatenate([q0 + 0.01 * t * (seed + 1), [1.0]]).astype(np.float32),
             "prompt": "pick up the red cube"} for t in range(steps)]


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{HOST}:{port}{ray_serve.STATS_PATH}", timeout=10) as reply:
        return json.loads(reply.read())


def test_openpi_client_gets_actions(deploy):
    port = deploy(replicas=1, max_batch=4, batch_wait_ms=2)
    with urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=10) as health:
        assert health.status == 200
    client = WebsocketClientPolicy(HOST, port, api_key="any-key")  # the key is sent, as by our node
    metadata = client.get_server_metadata()
    assert metadata["server"] == "test" and metadata["action_space"] == "ee_delta"
    assert metadata["observation_keys"] == ["observation/image", "observation/state", "prompt"]
    for request in stream(0, 3):
        reply = client.infer(request)
        actions = np.asarray(reply["actions"])
        assert actions.shape == (1, 7) and np.all(np.isfinite(actions))
        assert reply["server_timing"]["infer_ms"] > 0 and reply["server_timing"]["batch_size"] == 1
    assert "prev_total_ms" in reply["server_timing"]
    with pytest.raises(RuntimeError, match="missing observation key 'observation/state'"):
        client.infer({"observation/image": np.zeros((64, 64, 3), np.uint8), "prompt": "x"})


def test_two_robots_share_one_policy_call_and_keep_their_own_state(deploy):
    steps = 5
    # the shipped policy (a random one answers alike whatever it sees); a round waits for both robots
    port = deploy("", replicas=1, max_batch=2, batch_wait_ms=1000)
    before = stats(port)
    streams = [stream(1, steps), stream(2, steps)]
    replies: list[list[dict[str, Any]]] = [[], []]
    step_together = threading.Barrier(2, timeout=60)

    def robot(index: int) -> None:
        client = WebsocketClientPolicy(HOST, port)
        for request in streams[index]:
            step_together.wait()
            replies[index].append(client.infer(request))

    threads = [threading.Thread(target=robot, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    after = stats(port)
    assert [len(r) for r in replies] == [steps, steps]
    assert all(reply["server_timing"]["batch_size"] == 2 for robot_replies in replies for reply in robot_replies)
    assert after["rounds"] - before["rounds"] == steps  # one policy call per step for both robots
    assert after["decoded"] - before["decoded"] == 2 * steps
    kin = ArmKinematics(default_urdf())
    config = RunnerConfig(checkpoint="", decoder=DECODER, temperature=0.0)
    lone = build_runner(config, kin)
    served = [np.stack([reply["actions"] for reply in robot_replies]) for robot_replies in replies]
    for index in range(2):  # each robot's actions are those its own lone runner gives
        lone.start_episode()
        np.testing.assert_allclose(served[index], decode(lone, streams[index]), atol=1e-6)
    shared = build_runner(config, kin, policy=lone.policy)  # one runner for both: what the check would catch
    shared.start_episode()
    interleaved = decode(shared, [request for pair in zip(*streams, strict=True) for request in pair])
    assert not np.allclose(interleaved[0::2], served[0])
    assert not np.allclose(served[0], served[1])


def decode(runner: Any, requests: list[dict[str, Any]]) -> np.ndarray:
    """The replies' actions a runner here gives to ``requests``, one after the other."""
    kin = ArmKinematics(default_urdf())
    size, opening = int(runner.policy.config.image_size), float(kin.gripper_limits.upper.max())
    observations = [observation_from_request(r, LIBERO, kin.n, opening, size) for r in requests]
    return np.stack([result_reply(runner(obs), LIBERO)["actions"] for obs in observations])


def test_an_overloaded_replica_answers_busy_at_once(deploy, wait_until):
    port = deploy(replicas=1, max_batch=2, batch_wait_ms=3000, max_queue=1)  # a lone request waits 3 s
    first, second = WebsocketClientPolicy(HOST, port), WebsocketClientPolicy(HOST, port)
    answered: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: answered.append(first.infer(stream(3, 1)[0])))
    worker.start()
    try:
        assert wait_until(lambda: stats(port)["waiting"] == 1, timeout=30)
        with pytest.raises(RuntimeError, match="busy: 1 requests waiting"):
            second.infer(stream(4, 1)[0])
        assert answered == []  # the busy answer came while the first request still waited
    finally:
        worker.join(timeout=60)
    assert len(answered) == 1 and np.asarray(answered[0]["actions"]).shape == (1, 7)
    assert stats(port)["busy"] == 1


def test_a_replica_with_a_key_refuses_a_connection_without_it(deploy):
    from websockets.exceptions import InvalidStatus

    port = deploy(replicas=1, max_batch=2, batch_wait_ms=2, api_key="the-key")
    before = stats(port)  # /stats and /healthz stay open
    with urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=10) as health:
        assert health.status == 200
    client = WebsocketClientPolicy(HOST, port, api_key="the-key")
    assert np.asarray(client.infer(stream(5, 1)[0])["actions"]).shape == (1, 7)
    for key, why in ((None, "requires the header 'Authorization: Api-Key KEY'"), ("the-kez", "wrong API key")):
        with pytest.raises(InvalidStatus) as refused:
            WebsocketClientPolicy(HOST, port, api_key=key)
        assert refused.value.response.status_code == 401
        assert why in bytes(refused.value.response.body).decode()
    after = stats(port)
    assert after["unauthorized"] - before["unauthorized"] == 2
    assert after["connections"] - before["connections"] == 1  # the refused ones never reached a runner


def test_engine_ray_without_ray_is_one_error_line(checkpoint):
    code = ("import sys; sys.modules['ray'] = None; from vla_accel_ros.cli import main; "
            f"sys.exit(main(['serve-openpi', '--engine', 'ray', '--port', '0', '--checkpoint', '{checkpoint}']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'vla_accel_ros[fleet]'" in lines[0], done.stderr


def test_ray_flags_need_the_ray_engine(checkpoint):
    code = ("from vla_accel_ros.cli import main; import sys; "
            f"sys.exit(main(['serve-openpi', '--replicas', '2', '--port', '0', '--checkpoint', '{checkpoint}']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--replicas only apply with --engine ray" in done.stderr, done.stderr
