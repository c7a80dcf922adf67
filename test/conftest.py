"""Shared test set-up: headless rendering and one torch thread (faster on small CI hosts), plus the
helpers several test modules use, as fixtures (pytest runs with --import-mode=importlib, so test
modules cannot import this file):

- ``tiny_checkpoint(path, **config)``: a randomly initialised small policy saved as a real checkpoint;
- ``save_episode(path, images, actions, rng)``: a demo episode file with those frames and actions;
- ``demo_set(name, episodes, **config)``: a folder of demo episodes (``episodes(rng)`` yields their
  (images, actions)) and a tiny checkpoint beside it: (demo folder, checkpoint);
- ``foreign_arm(joint_names, tcp_frame)``: the URDF text of a serial arm the package was not made
  for (revolute joints with limits and velocities, a fixed TCP frame, two prismatic fingers);
- ``openpi_serving(server, port=0)``: an :class:`~vla_accel_ros.runtime.openpi_server.OpenPIServer`
  listening on loopback in a thread of its own (``.port``; ``.close()`` ends it and its connections);
- ``wait_until(predicate, timeout=10.0, every=None)``: poll until true or the timeout;
- ``fixture_layout(family)``: the module ``test/fixtures/<family>/layout.py``, which writes that
  family's random-weight directories in the published layout;
- ``ros_context(domain_id)``: a private rclpy context on its own ROS_DOMAIN_ID (a context manager);
- ``dds_rig(domain_id, peer_name)``: a :class:`DdsRig`, a node under test and a peer node spun in
  background threads. Each test module keeps its own domain ids so that modules never share DDS
  traffic.
- ``policy_node_fed(rig, params, frame=(48, 64), still=False, fingers=None)``: a control node with a
  policy spun by the rig, its peer feeding joint states and a camera: (node, arm commands, /diagnostics
  statuses); ``policy_node_over_dds(...)`` the same, after checking its first policy ticks: (node,
  stats, statuses);
- ``tiny_hf_vla(path, **overrides)``: a randomly initialised Hugging Face VLA in OpenVLA's layout
  (Llava: a tiny CLIP tower, a 2-layer Llama, a Llama tokenizer whose text vocabulary's top 256
  ids are unused: the action ids), written to ``path`` as ``save_pretrained`` writes it plus a
  ``dataset_statistics.json`` (no ``vla_spec.json``); returns ``path``. Overrides: text_vocab
  (384), image_size (32), patch_size (8), vision ("clip", "siglip" or None: a plain Llama, not a
  VLA), hidden_size (32), layers (2), max_position_embeddings (128), statistics (the statistics
  file's content; None: one dataset, ``TINY_HF_DATASET``, gripper masked), pickle (False; True:
  the weights as ``pytorch_model.bin`` only) and seed (0).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the kinematics and sim tests do not need torch
    pass


def _tiny_checkpoint(path: Path, **config: Any) -> Path:
    """A randomly initialised policy saved as a real checkpoint (safetensors + JSON); ``config``
    overrides the small default VLAConfig (64 px images, one layer)."""
    from vla_accel_ros.models import Policy, VLAConfig, save_checkpoint
    from vla_accel_ros.models.tokenizer import ActionTokenizer

    tokenizer = ActionTokenizer(np.array([-0.01] * 3 + [-0.02] * 3 + [0.0]), np.array([0.01] * 3 + [0.02] * 3 + [1.0]))
    settings = dict(image_size=64, patch_size=16, d_model=32, n_heads=2, n_layers=1, local_channels=8,
                    contact_hidden=8) | config
    save_checkpoint(Policy.create(VLAConfig(**settings), tokenizer, seed=0), path, recipe={"test": "random"})
    return path


FIXTURES = Path(__file__).parent / "fixtures"
TINY_HF_DATASET = "tiny_dataset"  # the one dataset in a tiny_hf_vla's dataset_statistics.json
# The tiny Llama vocabulary: every character a test prompt uses ("▁" is the space), a few merges.
_TINY_HF_CHARS = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789?:.,'-!\n"
_TINY_HF_MERGES = [("▁", "t"), ("▁t", "o"), ("▁t", "h"), ("▁th", "e"), ("▁", "a"), ("I", "n"), ("O", "u"),
                   ("Ou", "t"), ("▁", "r"), ("▁r", "o")]


def _tiny_hf_vla(path: Path, *, text_vocab: int = 384, image_size: int = 32, patch_size: int = 8,
                 vision: str | None = "clip", hidden_size: int = 32, layers: int = 2,
                 max_position_embeddings: int = 128, statistics: dict[str, Any] | None = None,
                 pickle: bool = False, seed: int = 0) -> Path:
    """A random OpenVLA-layout Hugging Face VLA in ``path`` (see the module docstring)."""
    import json

    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlamaForCausalLM,
        LlamaTokenizer,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for token in [*_TINY_HF_CHARS, *(a + b for a, b in _TINY_HF_MERGES)]:
        vocab.setdefault(token, len(vocab))
    while len(vocab) < text_vocab:  # unused tokens up to the top of the vocabulary: the action ids
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    tokenizer = LlamaTokenizer(vocab=vocab, merges=_TINY_HF_MERGES)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"], "pad_token": "<pad>"})
    torch.manual_seed(seed)
    # initializer_range 0.2: logits spread enough that argmax ties do not occur by chance
    text = LlamaConfig(vocab_size=-(-len(tokenizer) // 8) * 8, hidden_size=hidden_size,
                       intermediate_size=2 * hidden_size, num_hidden_layers=layers, num_attention_heads=4,
                       num_key_value_heads=2,
                       max_position_embeddings=max_position_embeddings, bos_token_id=1, eos_token_id=2,
                       pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)
    path.mkdir(parents=True, exist_ok=True)
    if vision is None:
        LlamaForCausalLM(text).save_pretrained(path)
        tokenizer.save_pretrained(path)
    else:
        tower = {"image_size": image_size, "patch_size": patch_size, "hidden_size": 32, "intermediate_size": 64,
                 "num_hidden_layers": 2, "num_attention_heads": 2}
        if vision == "clip":
            vision_config, strategy = CLIPVisionConfig(**tower), "default"
            image_processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                                 crop_size={"height": image_size, "width": image_size})
        else:
            vision_config, strategy = SiglipVisionConfig(**tower), "full"
            image_processor = SiglipImageProcessor(size={"height": image_size, "width": image_size})
        config = LlavaConfig(vision_config=vision_config, text_config=text,
                             image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                             image_seq_length=(image_size // patch_size) ** 2, vision_feature_select_strategy=strategy,
                             vision_feature_layer=-1 if vision == "siglip" else -2)
        LlavaForConditionalGeneration(config).save_pretrained(path)
        LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
                       vision_feature_select_strategy=strategy).save_pretrained(path)
    if pickle:  # the same weights as a pickle only (written here; the package never reads one)
        from safetensors.torch import load_file

        torch.save(load_file(path / "model.safetensors"), path / "pytorch_model.bin")
        (path / "model.safetensors").unlink()
    if statistics is None:
        q01 = [-0.02] * 3 + [-0.05] * 3 + [0.0]
        q99 = [0.02] * 3 + [0.05] * 3 + [1.0]
        statistics = {TINY_HF_DATASET: {
            "action": {"mean": [0.0] * 6 + [0.5], "std": [0.01] * 6 + [0.5], "max": q99, "min": q01,
                       "q01": q01, "q99": q99, "mask": [True] * 6 + [False]},
            "proprio": {"mean": [0.0] * 7, "std": [1.0] * 7, "q01": [-1.0] * 7, "q99": [1.0] * 7},
            "num_transitions": 100, "num_trajectories": 10}}
    (path / "dataset_statistics.json").write_text(json.dumps(statistics))
    return path


def _save_episode(path: Path, images: np.ndarray, actions: np.ndarray, rng: np.random.Generator) -> None:
    """A successful demo episode (``episode_*.npz``, the fields ``load_demos`` reads): the given
    uint8 frames (T, H, W, 3) and actions (T, 7), random joints, an open gripper, no contact."""
    steps = len(images)
    np.savez_compressed(
        path, images=images, joint_pos=rng.normal(0, 0.5, (steps, 7)).astype(np.float32),
        gripper=np.full(steps, 0.04, np.float32), actions=actions, near_contact=np.zeros(steps, bool),
        instruction=np.array("pick up the red cube"), success=np.array(True),
    )


def _foreign_arm(joint_names: tuple[str, ...] | list[str], tcp_frame: str = "hand_tcp") -> str:
    """A serial arm whose joints alternate between z and y axes, 0.15 m apart, with a two-finger
    gripper on its last link; limits and velocities on every joint."""
    inertial = ('<inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" '
                'iyz="0"/></inertial>')
    links = ["base_link"] + [f"link{i + 1}" for i in range(len(joint_names))]
    parts = [f'<link name="{n}">{inertial}</link>' for n in [*links, tcp_frame, "finger_l", "finger_r"]]
    for i, name in enumerate(joint_names):
        axis = "0 0 1" if i % 2 == 0 else "0 1 0"
        parts.append(f'<joint name="{name}" type="revolute"><parent link="{links[i]}"/><child link="{links[i + 1]}"/>'
                     f'<origin xyz="0 0 0.15"/><axis xyz="{axis}"/>'
                     f'<limit lower="-2.5" upper="2.5" velocity="2.0" effort="50"/></joint>')
    parts.append(f'<joint name="{tcp_frame}_joint" type="fixed"><parent link="{links[-1]}"/><child link="{tcp_frame}"/>'
                 '<origin xyz="0 0 0.1"/></joint>')
    for side, sign in (("l", 1), ("r", -1)):
        parts.append(f'<joint name="finger_{side}_joint" type="prismatic"><parent link="{links[-1]}"/>'
                     f'<child link="finger_{side}"/><origin xyz="0 0 0.05"/><axis xyz="0 {sign} 0"/>'
                     '<limit lower="0" upper="0.04" velocity="0.2" effort="20"/></joint>')
    return f'<robot name="foreign_arm">{"".join(parts)}</robot>'


def _png_bomb(side: int = 32768) -> bytes:
    """A 1-bit black ``side`` x ``side`` PNG: 130 kB that decode to a gigapixel."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(side // 8)
    deflate = zlib.compressobj(9)
    idat = b"".join(deflate.compress(row) for _ in range(side)) + deflate.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _wait_until(predicate: Callable[[], Any], timeout: float = 10.0, every: Callable[[], None] | None = None) -> bool:
    """True as soon as ``predicate()`` is, polled every 20 ms (after ``every()`` when given);
    False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if every is not None:
            every()
        if predicate():
            return True
        time.sleep(0.02)
    return False


@contextlib.contextmanager
def _ros_context(domain_id: int) -> Iterator[Any]:
    import rclpy
    from rclpy.context import Context

    context = Context()
    rclpy.init(context=context, domain_id=domain_id)
    try:
        yield context
    finally:
        rclpy.try_shutdown(context=context)


class DdsRig:
    """A private rclpy context on ``domain_id`` with a peer node (``peer``, the robot or test
    driver); ``spin(node)`` spins the node under test and the peer in daemon threads, ``close()``
    stops them (``stop`` is set first: feeder loops wait on it) and tears everything down."""

    wait = staticmethod(_wait_until)

    def __init__(self, domain_id: int, peer_name: str) -> None:
        import rclpy
        from rclpy.context import Context

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.peer = rclpy.create_node(peer_name, context=self.context)
        self.node: Any = None
        self.others: tuple[Any, ...] = ()
        self.executors: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()

    def spin(self, node: Any, *, executor: str = "multi", feed: Callable[[], None] | None = None,
             others: tuple[Any, ...] = (), realtime: bool = False) -> None:
        """``executor``: "multi" (node and peer on one 3-thread executor), "single" (one
        single-threaded executor) or "split" (a single-threaded executor each). ``feed`` runs in
        its own daemon thread. ``others``: more nodes under test, spun with ``node``. ``realtime``:
        the thread spinning ``node`` first takes its ``realtime_priority``, as ``ros2 run`` does."""
        from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

        self.node = node
        self.others = others
        if executor == "multi":
            self.executors = [MultiThreadedExecutor(num_threads=3, context=self.context)]
        else:
            self.executors = [SingleThreadedExecutor(context=self.context)
                              for _ in range(2 if executor == "split" else 1)]
        for under_test in (node, *others):
            self.executors[0].add_node(under_test)
        self.executors[-1].add_node(self.peer)
        self.threads = [threading.Thread(target=self._spin_until_stopped, args=(e, realtime and i == 0), daemon=True)
                        for i, e in enumerate(self.executors)]
        if feed is not None:
            self.threads.append(threading.Thread(target=feed, daemon=True))
        for t in self.threads:
            t.start()

    def _spin_until_stopped(self, executor: Any, realtime: bool = False) -> None:
        if realtime:
            self.node.apply_realtime_priority()
        # Not executor.spin(): shutting an executor down while a thread spins it races inside rclpy
        # (a finishing callback can trigger a guard condition the shutdown has just destroyed).
        while not self.stop.is_set():
            executor.spin_once(timeout_sec=0.02)

    def close(self) -> None:
        import rclpy

        self.stop.set()
        for t in self.threads:  # no thread spins any more when the executors shut down
            t.join(timeout=2.0)
        under_test = [n for n in (self.node, *self.others) if n is not None]
        for node in under_test:
            node.shutdown()
        for e in self.executors:
            e.shutdown(timeout_sec=2.0)
        for node in under_test:
            node.destroy_node()
        self.peer.destroy_node()
        rclpy.try_shutdown(context=self.context)


def spin_policy_node(rig: DdsRig, params: dict[str, Any], *, frame: tuple[int, int] = (48, 64), still: bool = False,
                     fingers: float | None = None) -> tuple[Any, list[np.ndarray], list[Any]]:
    """A VlaAccelNode with a policy (``params``) spun by the rig and fed over DDS by its peer: the
    package arm's joint states every 10 ms (the fingers at ``fingers`` where given), a camera image
    (``frame`` H x W) every fifth, random, or one frame again and again with ``still``. The node,
    the arm commands it publishes (arrays, as they arrive) and the /diagnostics statuses."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64MultiArray

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.ros.node import VlaAccelNode

    kin = ArmKinematics(default_urdf())
    q = [0.1, -0.7, 0.2, -2.3, 0.05, 1.6, 0.7]
    names, positions = list(kin.joint_names), q
    if fingers is not None:
        names, positions = [*names, "finger_joint1", "finger_joint2"], [*q, fingers, fingers]
    node = VlaAccelNode(context=rig.context, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    commands: list[np.ndarray] = []
    statuses: list[Any] = []
    rig.peer.create_subscription(Float64MultiArray, "/arm_controller/commands",
                                 lambda m: commands.append(np.asarray(m.data, dtype=float)), 100)
    rig.peer.create_subscription(DiagnosticArray, "/diagnostics", lambda m: statuses.extend(m.status), 50)
    joints = rig.peer.create_publisher(JointState, "/joint_states", 10)
    camera = rig.peer.create_publisher(Image, "/camera/image_raw", 10)
    rng = np.random.default_rng(0)
    height, width = frame

    def feed() -> None:
        k = 0
        pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
        while not rig.stop.is_set():
            joints.publish(JointState(name=names, position=positions))
            if k % 5 == 0:
                if not still:
                    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
                camera.publish(Image(height=height, width=width, encoding="rgb8", step=width * 3,
                                     data=pixels.tobytes()))
            k += 1
            rig.stop.wait(0.01)

    rig.spin(node, feed=feed)
    return node, commands, statuses


def drive_policy_node(rig: DdsRig, params: dict[str, Any], *, frame: tuple[int, int] = (48, 64), still: bool = False,
                      timeout: float = 90.0) -> tuple[Any, dict[str, Any], list[Any]]:
    """:func:`spin_policy_node`, then: waits for 5 policy ticks, checks the next ticks: each one
    published, no inference error, the last commands finite and within the limits. The node, its
    stats after them, and the /diagnostics statuses received."""
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf

    kin = ArmKinematics(default_urdf())
    node, commands, statuses = spin_policy_node(rig, params, frame=frame, still=still)
    assert rig.wait(lambda: node.stats().get("policy_ticks", 0) >= 5, timeout=timeout), node.stats()
    before = node.stats()
    assert rig.wait(lambda: node.stats()["ticks"] >= before["ticks"] + 5)
    after = node.stats()
    assert after["ticks_published"] - before["ticks_published"] == after["ticks"] - before["ticks"]
    assert after["inference_errors"] == 0 and after["inference_actions"] > 0
    commands_now = np.array(commands[-10:])
    assert np.all(np.isfinite(commands_now)) and all(kin.within_limits(c) for c in commands_now)
    return node, after, statuses


@pytest.fixture(scope="session")
def policy_node_over_dds() -> Callable[..., tuple[Any, dict[str, Any], list[Any]]]:
    return drive_policy_node


@pytest.fixture(scope="session")
def policy_node_fed() -> Callable[..., tuple[Any, list[np.ndarray], list[Any]]]:
    return spin_policy_node


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Callable[..., Path]:
    return _tiny_checkpoint


@pytest.fixture(scope="session")
def save_episode() -> Callable[..., None]:
    return _save_episode


def _random_demos(root: Path, episodes: int, steps: int, seed: int) -> Path:
    """``episodes`` episodes of ``steps`` random 32-px frames and actions within a small token VLA's
    statistics (end-effector deltas of a few cm and rad, the gripper open or closed), in ``root``."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(episodes):
        images = rng.integers(0, 256, (steps, 32, 32, 3), dtype=np.uint8)
        actions = np.concatenate([rng.uniform(-0.02, 0.02, (steps, 3)), rng.uniform(-0.05, 0.05, (steps, 3)),
                                  rng.integers(0, 2, (steps, 1))], axis=1).astype(np.float32)
        _save_episode(root / f"episode_{i:05d}.npz", images, actions, rng)
    return root


@pytest.fixture(scope="session")
def random_demos() -> Callable[..., Path]:
    return _random_demos


@pytest.fixture(scope="session")
def demo_set(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    def make(name: str, episodes: Callable[[np.random.Generator], Iterator[tuple[np.ndarray, np.ndarray]]],
             **config: Any) -> tuple[Path, Path]:
        root = tmp_path_factory.mktemp(name)
        rng = np.random.default_rng(0)
        (root / "demos").mkdir()
        for i, (images, actions) in enumerate(episodes(rng)):
            _save_episode(root / "demos" / f"episode_{i:05d}.npz", images, actions, rng)
        return root / "demos", _tiny_checkpoint(root / "base", **config)

    return make


@pytest.fixture(scope="session")
def foreign_arm() -> Callable[..., str]:
    return _foreign_arm


class OpenPIServing:
    """An OpenPIServer listening on 127.0.0.1:``port`` (0: a free one) in a thread of its own."""

    def __init__(self, server: Any, port: int = 0) -> None:
        import asyncio

        self.server = server
        self.loop = asyncio.new_event_loop()
        self.ready: Any = None
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.ready = self.loop.create_future()
            self.loop.call_soon(started.set)
            self.task = self.loop.create_task(server.serve("127.0.0.1", port, self.ready))
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


@pytest.fixture(scope="session")
def openpi_serving() -> type[OpenPIServing]:
    return OpenPIServing


@pytest.fixture(scope="session")
def png_bomb() -> bytes:
    return _png_bomb()


@pytest.fixture(scope="session")
def wait_until() -> Callable[..., bool]:
    return _wait_until


def _fixture_layout(family: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{family}_layout", FIXTURES / family / "layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fixture_layout() -> Callable[[str], ModuleType]:
    return _fixture_layout


@pytest.fixture(autouse=True)
def _collect_ros_garbage(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test with ROS nodes, collect its garbage at once. A node kept alive by a reference
    cycle (a refusal's traceback) is otherwise finalised at a random later time, and rcl then drops
    the /rosout publisher registered under its name, which by then is a later node's of that name."""
    yield
    if {"ros_context", "dds_rig"} & set(request.fixturenames):
        gc.collect()


@pytest.fixture(scope="session")
def ros_context() -> Callable[[int], contextlib.AbstractContextManager[Any]]:
    return _ros_context


@pytest.fixture(scope="session")
def dds_rig() -> type[DdsRig]:
    return DdsRig


@pytest.fixture(scope="session")
def tiny_hf_vla() -> Callable[..., Path]:
    return _tiny_hf_vla
