"""Our policy behind openpi's protocol, answered to openpi-client's own ``WebsocketClientPolicy`` over
loopback (run inside /work/tools/isolated or any private network namespace)."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.models.openpi.spec import LIBERO, PolicySpec
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.runtime.openpi_server import OpenPIServer, observation_from_request

SMALL_LIMIT = 64 * 1024


class Served:
    """An :class:`OpenPIServer` listening on a free loopback port in a thread of its own."""

    def __init__(self, server: OpenPIServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.ready: Any = None
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.ready = self.loop.create_future()
            self.loop.call_soon(started.set)
            self.task = self.loop.create_task(server.serve("127.0.0.1", 0, self.ready))
            try:
                self.loop.run_until_complete(self.task)
            except asyncio.CancelledError:
                pass

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        started.wait(10)
        self.port = asyncio.run_coroutine_threadsafe(self._port(), self.loop).result(timeout=30)

    async def _port(self) -> int:
        server = await self.ready
        return int(server.sockets[0].getsockname()[1])

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    kin = ArmKinematics(default_urdf())
    checkpoint = tiny_checkpoint(tmp_path_factory.mktemp("openpi") / "ckpt")
    runner = build_runner(RunnerConfig(checkpoint=str(checkpoint), decoder="ar"), kin)
    spec = PolicySpec(max_message_bytes=SMALL_LIMIT)
    server = OpenPIServer(runner, spec, n_joints=kin.n, max_opening=0.04, metadata={"server": "test"})
    running = Served(server)
    yield running
    running.close()


def libero_request(size: int = 48) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {"observation/image": rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8),
            "observation/wrist_image": np.zeros((size, size, 3), np.uint8),
            "observation/state": np.r_[np.zeros(7), 1.0], "prompt": "pick up the red cube"}


def test_openpi_clients_own_policy_gets_actions(served: Served) -> None:
    client = WebsocketClientPolicy("127.0.0.1", served.port)
    metadata = client.get_server_metadata()
    assert metadata["server"] == "test" and metadata["action_dim"] == 7
    for _ in range(2):
        reply = client.infer(libero_request())
        actions = reply["actions"]
        assert actions.shape == (1, 7) and actions.dtype == np.float32 and np.all(np.isfinite(actions))
        assert 0.0 <= actions[0, 6] <= 1.0
        assert reply["server_timing"]["infer_ms"] > 0
    assert "prev_total_ms" in reply["server_timing"]  # the second request reports the first one's cycle


def test_health_check_answers_200(served: Served) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/healthz", timeout=10) as response:
        assert response.status == 200


def test_a_bad_request_is_a_text_frame_then_a_close(served: Served) -> None:
    client = WebsocketClientPolicy("127.0.0.1", served.port)
    request = libero_request()
    del request["observation/image"]
    with pytest.raises(RuntimeError, match="missing observation key 'observation/image'"):
        client.infer(request)
    with pytest.raises(ConnectionClosed) as closed:
        client._ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011


def test_an_oversized_message_is_refused_unread(served: Served) -> None:
    before = served.server.served
    with connect(f"ws://127.0.0.1:{served.port}", max_size=None, compression=None) as ws:
        ws.recv(timeout=10)  # the metadata
        big = libero_request(size=256)  # ~200 kB > the 64 kB limit
        ws.send(msgpack_numpy.packb(big))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert served.server.served == before


def test_requests_map_to_observations_under_the_spec() -> None:
    obs = observation_from_request(libero_request(), LIBERO, 7, 0.04, 32)
    assert obs.image.shape == (32, 32, 3) and obs.gripper == pytest.approx(0.04)
    assert obs.instruction == "pick up the red cube"
    droid = PolicySpec(images={"observation/exterior_image_1_left": "main"},
                       state={"observation/joint_position": ("joints",), "observation/gripper_position": ("gripper",)},
                       gripper_state=(0.0, 1.0))
    request = {"observation/exterior_image_1_left": np.zeros((20, 30, 3), np.uint8),
               "observation/joint_position": np.arange(7.0) / 10, "observation/gripper_position": np.array([0.75]),
               "prompt": "x"}
    obs = observation_from_request(request, droid, 7, 0.04, None)
    assert obs.image.shape == (20, 30, 3) and obs.gripper == pytest.approx(0.01)
    np.testing.assert_allclose(obs.joint_pos, np.arange(7.0) / 10)
    for broken, match in ((dict(request, **{"observation/joint_position": np.zeros(6)}), "must be 7 finite"),
                          (dict(request, **{"observation/exterior_image_1_left": np.zeros((4, 4, 3))}), "uint8"),
                          (dict(request, prompt=3), "must be a string")):
        with pytest.raises(ValueError, match=match):
            observation_from_request(broken, droid, 7, 0.04, None)
