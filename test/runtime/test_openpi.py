"""openpi's protocol both ways over loopback (run inside /work/tools/isolated or any private network
namespace): our policy served to openpi-client's own ``WebsocketClientPolicy``, and a server as the
runner's policy (``openpi://HOST:PORT``), with the bad replies a client must survive."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.sync.server import serve

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.models.openpi.config import LIBERO, PolicySpec
from vla_accel_ros.models.openpi.policy import (
    RECONNECT_INTERVAL_S,
    OpenPIPolicy,
    ServerAddress,
    ServerError,
    connect_policy,
)
from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
from vla_accel_ros.runtime.openpi_server import OpenPIServer, observation_from_request

SMALL_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tiny_checkpoint(tmp_path_factory.mktemp("openpi") / "ckpt"))


@pytest.fixture(scope="module")
def kin() -> ArmKinematics:
    return ArmKinematics(default_urdf())


@pytest.fixture(scope="module")
def served(checkpoint: Path, kin: ArmKinematics, openpi_serving: Any) -> Iterator[Any]:
    runner = build_runner(RunnerConfig(checkpoint=str(checkpoint), decoder="ar", temperature=0.0), kin)
    spec = PolicySpec(max_message_bytes=SMALL_LIMIT)
    server = OpenPIServer(runner, spec, n_joints=kin.n, max_opening=0.04, metadata={"server": "test"})
    running = openpi_serving(server)
    yield running
    running.close()


def libero_request(size: int = 48) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {"observation/image": rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8),
            "observation/wrist_image": np.zeros((size, size, 3), np.uint8),
            "observation/state": np.r_[np.zeros(7), 1.0], "prompt": "pick up the red cube"}


def test_openpi_clients_own_policy_gets_actions(served: Any) -> None:
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


def test_health_check_answers_200(served: Any) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/healthz", timeout=10) as response:
        assert response.status == 200


def test_a_bad_request_is_a_text_frame_then_a_close(served: Any) -> None:
    client = WebsocketClientPolicy("127.0.0.1", served.port)
    request = libero_request()
    del request["observation/image"]
    with pytest.raises(RuntimeError, match="missing observation key 'observation/image'"):
        client.infer(request)
    with pytest.raises(ConnectionClosed) as closed:
        client._ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011


def test_an_oversized_message_is_refused_unread(served: Any) -> None:
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


# --- a server as the runner's policy ----------------------------------------------------------
def observation(size: int = 64) -> Observation:
    rng = np.random.default_rng(1)
    return Observation(image=rng.integers(0, 255, (size, size, 3), dtype=np.uint8), instruction="pick up the red cube",
                       joint_pos=np.zeros(7), gripper=0.04, stamp=0.0)


def test_a_served_policy_answers_as_the_local_one(served: Any, checkpoint: Path, kin: ArmKinematics) -> None:
    spec = PolicySpec(image_size=64)
    spec_file = Path(checkpoint.parent / "spec.json")
    spec_file.write_text(json.dumps({"image_size": 64}))
    remote = build_runner(RunnerConfig(checkpoint=f"openpi://127.0.0.1:{served.port}?spec={spec_file}"), kin)
    assert remote.decoder_name == "flow10" and "answers with chunks" in remote.warnings[0]
    assert remote.image_size == spec.image_size
    local = build_runner(RunnerConfig(checkpoint=str(checkpoint), decoder="ar", temperature=0.0), kin)
    obs = observation()
    got, expected = remote(obs), local(obs)
    np.testing.assert_allclose(got.action, expected.action, atol=1e-6)
    stats = remote.policy.remote_stats()
    assert stats["server_replies"] == 1 and stats["server_connected"] and stats["server_rtt_ms_p50"] > 0


def test_the_client_reconnects_after_the_server_returns(checkpoint: Path, kin: ArmKinematics,
                                                         openpi_serving: Any) -> None:
    runner = build_runner(RunnerConfig(checkpoint=str(checkpoint), decoder="ar", temperature=0.0), kin)
    first = openpi_serving(OpenPIServer(runner, LIBERO, n_joints=7, max_opening=0.04, metadata={}))
    policy = connect_policy(f"ws://127.0.0.1:{first.port}", arm=kin)
    assert policy.request_chunk(observation()).shape == (1, 7)
    first.close()
    with pytest.raises(ServerError, match="connection lost|cannot connect"):
        policy.request_chunk(observation())
    with pytest.raises(ServerError, match="not connected|cannot connect"):  # no retry storm: one per interval
        policy.request_chunk(observation())
    second = openpi_serving(OpenPIServer(runner, LIBERO, n_joints=7, max_opening=0.04, metadata={}))
    try:
        moved = connect_policy(f"ws://127.0.0.1:{second.port}", arm=kin)
        moved.counts = policy.counts
        time.sleep(RECONNECT_INTERVAL_S)
        assert moved.request_chunk(observation()).shape == (1, 7)
        assert moved.counts["connects"] == 2 and moved.counts["lost"] + moved.counts["connect_failures"] >= 1
    finally:
        second.close()


class FakeServer:
    """A websocket server that answers every request with ``reply`` (bytes or a text frame)."""

    def __init__(self, reply: bytes | str) -> None:
        def handler(ws: Any) -> None:
            ws.send(msgpack_numpy.packb({"fake": True}))
            for _ in ws:
                ws.send(reply)

        self.server = serve(handler, "127.0.0.1", 0, max_size=None, compression=None)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.mark.parametrize("reply, match", [
    (msgpack_numpy.packb({"actions": np.zeros((4, 3))}), "must be H x 7"),
    (msgpack_numpy.packb({"actions": np.full((4, 7), np.nan)}), "not finite"),
    (msgpack_numpy.packb({"no_actions": 1}), "holds no 'actions'"),
    ("Traceback: KeyError 'observation/image'", "refused the request: Traceback"),
    (msgpack_numpy.packb({"actions": np.zeros((2000, 1000))}), "connection lost"),  # over max_message_bytes
])
def test_a_bad_reply_is_one_error_and_no_actions(kin: ArmKinematics, reply: bytes | str, match: str) -> None:
    fake = FakeServer(reply)
    try:
        policy = connect_policy(f"openpi://127.0.0.1:{fake.port}", arm=kin)
        policy.spec = PolicySpec(max_message_bytes=SMALL_LIMIT)
        with pytest.raises(ServerError, match=match):
            policy.request_chunk(observation())
        assert policy.counts["replies"] == 0 and policy.counts["bad_replies"] + policy.counts["lost"] == 1
    finally:
        fake.close()


def test_joint_replies_are_executed_as_joint_positions_within_the_limits(kin: ArmKinematics) -> None:
    from vla_accel_ros.core.actions import JOINT_POSITION, action_to_joint_targets

    q0 = np.array([0.0, 0.3, 0.0, -1.2, 0.0, 1.0, 0.0])
    for space, far in (("joint_velocity", np.full(7, 50.0)), ("joint_position", q0 + 2.0)):
        spec = PolicySpec(action_space=space, action_dt_s=0.05)
        assert spec.executed_action_space == JOINT_POSITION
        policy = OpenPIPolicy(ServerAddress("ws://x:1", spec, "", 1.0), kin)
        reply = {"actions": np.column_stack([np.tile(far, (3, 1)), np.zeros(3)])}
        ours = policy.to_our_actions(reply, q0)
        assert ours.shape == (3, 8) and np.all(ours[:, 7] == 0.0)  # the joints, then the gripper: closed
        if space == "joint_position":  # absolute targets as sent: the controller clamps them
            np.testing.assert_array_equal(ours[:, :7], np.tile(far, (3, 1)))
        q = q0
        for k in range(3):  # velocities: the positions each step reaches, clamped to v * dt
            step = kin.clamp(q + far * 0.05 if space == "joint_velocity" else far, q, 0.05)
            if space == "joint_velocity":
                np.testing.assert_allclose(ours[k, :7], step, atol=1e-12)
            executed, _ = action_to_joint_targets(kin, q, ours[k], 0.05, JOINT_POSITION)
            np.testing.assert_allclose(executed, step, atol=1e-12)
            assert np.all(np.abs(executed - q) <= kin.limits.velocity * 0.05 + 1e-12)
            q = executed


def test_addresses_and_keys(tmp_path: Path, kin: ArmKinematics, monkeypatch: pytest.MonkeyPatch) -> None:
    key = tmp_path / "key"
    key.write_text("secret\n")
    assert ServerAddress.parse(f"openpi://h:8000?api_key_file={key}").api_key == "secret"
    monkeypatch.setenv("MY_KEY", "other")
    assert ServerAddress.parse("openpi://h:8000?api_key_env=MY_KEY").api_key == "other"
    assert ServerAddress.parse("openpi://h:8000").uri == "ws://h:8000"
    for bad, match in (("openpi://h", "HOST:PORT"), ("openpi://h:1?api_key=x", "unknown settings"),
                       ("openpi://h:1?timeout_s=0", "timeout_s")):
        with pytest.raises(ValueError, match=match):
            ServerAddress.parse(bad)


def test_the_worker_reports_the_servers_counters(served: Any, kin: ArmKinematics, wait_until: Any) -> None:
    from vla_accel_ros.core.controller import Controller, ControllerConfig
    from vla_accel_ros.runtime.thread_worker import InferenceWorker

    runner = build_runner(RunnerConfig(checkpoint=f"openpi://127.0.0.1:{served.port}"), kin)
    controller = Controller(kin, ControllerConfig())
    worker = InferenceWorker(controller, runner, time.monotonic)
    stats = worker.stats()
    assert stats["server_requests"] == 0 and stats["server_connected"] is False
    runner(observation())
    stats = worker.stats()
    assert stats["server_replies"] == 1 and stats["server_rtt_ms_p50"] > 0 and stats["server_lost"] == 0


@pytest.mark.parametrize("name", ["libero", "droid"])
def test_the_shipped_example_specs_make_requests_and_read_replies(name: str, kin: ArmKinematics) -> None:
    spec = PolicySpec.read(Path(__file__).parents[2] / "config" / "openpi" / f"{name}.json")
    policy = OpenPIPolicy(ServerAddress("ws://x:1", spec, "", 1.0), kin)
    request = policy.request(observation(spec.image_size))
    assert set(request) == {*spec.images, *spec.state, spec.prompt}
    main = request[spec.main_image_key]
    assert main.shape == (spec.image_size, spec.image_size, 3) and main.dtype == np.uint8
    if name == "libero":  # TCP position, axis-angle, two finger positions: LIBERO's 8 numbers
        assert request["observation/state"].shape == (8,)
        reply = {"actions": np.tile([1.0, 0, 0, 0, 0, 0, -1.0], (10, 1))}  # +1: 0.05 m; -1: open
        ours = policy.to_our_actions(reply, np.zeros(7))
        assert ours.shape == (5, 7) and np.allclose(ours[:, 0], 0.05) and np.all(ours[:, 6] == 1.0)
    else:
        assert request["observation/joint_position"].shape == (7,)
        assert request["observation/gripper_position"].shape == (1,)
        q0 = np.array([0.0, 0.3, 0.0, -1.2, 0.0, 1.0, 0.0])  # within the limits: zero velocity stays put
        ours = policy.to_our_actions({"actions": np.zeros((10, 8))}, q0)
        assert ours.shape == (8, 8) and np.allclose(ours[:, :7], q0) and np.all(ours[:, 7] == 1.0)


def test_the_inference_child_serves_a_policy_server_and_reports_its_counters(
        served: Any, checkpoint: Path, kin: ArmKinematics, wait_until: Any) -> None:
    from vla_accel_ros.core.controller import Controller, ControllerConfig
    from vla_accel_ros.runtime.process_worker import ChildSpec, ProcessInferenceWorker

    spec_file = checkpoint.parent / "spec64.json"
    spec_file.write_text(json.dumps({"image_size": 64}))
    config = RunnerConfig(f"openpi://127.0.0.1:{served.port}?spec={spec_file}")
    controller = Controller(kin, ControllerConfig())
    controller.set_enabled(True)
    controller.set_instruction("pick up the red cube")
    worker = ProcessInferenceWorker(controller, ChildSpec(config, kin.urdf_xml, kin.tcp_frame), time.monotonic)
    worker.start()
    try:
        assert worker.image_size == 64 and any("answers with chunks" in w for w in worker.warnings)
        q = np.array([0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7])
        image = observation().image

        def fed() -> bool:
            now = time.monotonic()
            controller.on_joint_state(q, 0.04, now)
            controller.on_image(image, now)
            return worker.stats()["actions"] >= 3

        assert wait_until(fed, 60.0), worker.stats()
        stats = worker.stats()
        assert stats["errors"] == 0
        # the server's counters cross from the child with its replies, as in a thread
        assert stats["server_replies"] >= 3 and stats["server_connected"] is True and stats["server_lost"] == 0
    finally:
        worker.stop()


# --- the API key and the queue bound ---------------------------------------------------------
class GatedRunner:
    """A runner whose decodes wait while ``gate`` is shut: a request held in flight for as long as
    a test needs, whatever the machine's speed."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.policy = runner.policy
        self.gate = threading.Event()
        self.gate.set()
        self.held = threading.Event()  # a decode is waiting at the shut gate

    def start_episode(self) -> None:
        self.runner.start_episode()

    def __call__(self, obs: Observation) -> Any:
        if not self.gate.is_set():
            self.held.set()
            self.gate.wait(60)
        return self.runner(obs)


@pytest.fixture()
def keyed(checkpoint: Path, kin: ArmKinematics, openpi_serving: Any) -> Iterator[Any]:
    from vla_accel_ros.runtime.openpi_server import ApiKeyCheck

    runner = GatedRunner(build_runner(RunnerConfig(checkpoint=str(checkpoint), decoder="ar", temperature=0.0), kin))
    server = OpenPIServer(runner, LIBERO, n_joints=7, max_opening=0.04, metadata={"server": "test"},
                          api_key=ApiKeyCheck("the-key"), max_queue=1)
    running = openpi_serving(server)
    running.runner = runner
    yield running
    runner.gate.set()
    running.close()


def test_a_server_with_a_key_refuses_a_connection_without_it(keyed: Any) -> None:
    from websockets.exceptions import InvalidStatus

    reply = WebsocketClientPolicy("127.0.0.1", keyed.port, api_key="the-key").infer(libero_request())
    assert reply["actions"].shape == (1, 7)
    for key, why in ((None, "requires the header 'Authorization: Api-Key KEY'"), ("the-kez", "wrong API key")):
        with pytest.raises(InvalidStatus) as refused:
            WebsocketClientPolicy("127.0.0.1", keyed.port, api_key=key)
        assert refused.value.response.status_code == 401
        assert why in bytes(refused.value.response.body).decode()
    with pytest.raises(InvalidStatus, match="HTTP 401"):
        connect(f"ws://127.0.0.1:{keyed.port}", additional_headers={"Authorization": "Bearer the-key"})
    assert keyed.server.unauthorized == 3 and keyed.server.served == 1


def test_a_key_refused_leaves_the_health_check_open(keyed: Any) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{keyed.port}/healthz", timeout=10) as response:
        assert response.status == 200
    assert keyed.server.unauthorized == 0


def test_a_full_queue_answers_busy_at_once(keyed: Any) -> None:
    first = WebsocketClientPolicy("127.0.0.1", keyed.port, api_key="the-key")
    second = WebsocketClientPolicy("127.0.0.1", keyed.port, api_key="the-key")
    keyed.runner.gate.clear()
    answered: list[dict[str, Any]] = []
    held = threading.Thread(target=lambda: answered.append(first.infer(libero_request())))
    held.start()
    try:
        assert keyed.runner.held.wait(30)
        with pytest.raises(RuntimeError, match="busy: 1 requests waiting \\(bound 1\\)"):
            second.infer(libero_request())
        with pytest.raises(ConnectionClosed) as closed:
            second._ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        assert answered == []  # busy came while the first request was still held
    finally:
        keyed.runner.gate.set()
        held.join(60)
    assert len(answered) == 1 and answered[0]["actions"].shape == (1, 7)
    assert keyed.server.busy == 1 and keyed.server.in_flight == 0


def test_the_client_tells_a_refused_key_and_a_busy_server_apart(keyed: Any, kin: ArmKinematics,
                                                                 tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-key\n")
    refused = connect_policy(f"openpi://127.0.0.1:{keyed.port}?api_key_file={wrong}", arm=kin)
    with pytest.raises(ServerError, match=r"refused the API key \(HTTP 401: API key refused: wrong API key\)"):
        refused.request_chunk(observation())
    with pytest.raises(ServerError, match="not connected .*refused the API key"):  # the reason stays in view
        refused.request_chunk(observation())
    stats = refused.remote_stats()
    assert stats["server_api_key_refusals"] == 1 and "HTTP 401" in stats["server_api_key_refused"]
    assert "the-key" not in stats["server_api_key_refused"].replace("not-the-key", "")
    without = connect_policy(f"openpi://127.0.0.1:{keyed.port}?api_key_env=VLA_ACCEL_TEST_UNSET_KEY", arm=kin)
    with pytest.raises(ServerError, match="the address names none"):
        without.request_chunk(observation())

    key = tmp_path / "key"
    key.write_text("the-key\n")
    policy = connect_policy(f"openpi://127.0.0.1:{keyed.port}?api_key_file={key}&timeout_s=5", arm=kin)
    assert policy.request_chunk(observation()).shape == (1, 7)
    keyed.runner.gate.clear()
    holder = WebsocketClientPolicy("127.0.0.1", keyed.port, api_key="the-key")
    held = threading.Thread(target=lambda: holder.infer(libero_request()))
    held.start()
    try:
        assert keyed.runner.held.wait(30)
        with pytest.raises(ServerError, match="busy \\(overloaded\\), retrying on the next observation"):
            policy.request_chunk(observation())
        assert policy.counts["busy"] == 1 and policy.counts["bad_replies"] == 0 and policy.counts["lost"] == 0
        with pytest.raises(ServerError, match="busy"):  # tried again at once: a new connection, busy again
            policy.request_chunk(observation())
        assert policy.counts["connects"] == 2 and policy.counts["busy"] == 2
    finally:
        keyed.runner.gate.set()
        held.join(60)
    assert policy.request_chunk(observation()).shape == (1, 7)  # served again, without waiting out an interval
    assert policy.counts["connects"] == 3
    assert policy.remote_stats()["server_api_key_refused"] == ""


@pytest.mark.parametrize("flags, env, match", [
    (["--api-key-file", "KEYFILE", "--api-key-env", "VLA_ACCEL_TEST_KEY"], "k", "not both"),
    (["--api-key-file", "EMPTY"], "", "holds no key"),
    (["--api-key-file", "MISSING"], "", "cannot read the API key"),
    (["--api-key-env", "VLA_ACCEL_TEST_KEY"], "", "not set or empty"),
])
def test_a_bad_api_key_flag_is_one_error_line(flags: list[str], env: str, match: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from vla_accel_ros.cli import main

    (tmp_path / "KEYFILE").write_text("k")
    (tmp_path / "EMPTY").write_text("\n")
    monkeypatch.setenv("VLA_ACCEL_TEST_KEY", env)
    paths = [str(tmp_path / f) if f in ("KEYFILE", "EMPTY", "MISSING") else f for f in flags]
    assert main(["serve-openpi", "--port", "0", *paths]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], lines
