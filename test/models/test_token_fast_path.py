"""The token VLAs' fast path (models/token_vla/static.py: a preallocated KV cache rolled back by
length, fixed-shape prefill, step and k-token verify passes) against transformers' DynamicCache
path it replaces, on checkpoints/hf_small and a tiny OpenVLA-layout model: the same logits
(float32, bit for bit) for every pass, and the same tokens and logits for every token decoder over
a sim episode. The OpenVLA agreement fixture through
the fast path is test_openvla_reference.py's (it runs on it). On a GPU: CUDA graphs against eager
passes, and each decoder's tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.resources import share_dir
from vla_accel_ros.models.load import load_policy
from vla_accel_ros.models.token_vla.policy import HFTokenVLA
from vla_accel_ros.models.token_vla.static import StaticKVCache

FIXTURES = Path(__file__).parents[1] / "fixtures" / "openvla"
_spec = importlib.util.spec_from_file_location("openvla_layout", FIXTURES / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)

HF_SMALL = share_dir() / "checkpoints" / "hf_small"
DECODERS = ["ar", "sd", "kerv", "kerv_released", "world_aware", "deadline", "heisd"]
STEPS = 5
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def openvla_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return layout.write_openvla_dir(tmp_path_factory.mktemp("openvla_fast") / "tiny")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    torch.set_num_threads(1)
    return {"hf_small": f"hf:{HF_SMALL}", "openvla": str(openvla_dir(tmp_path_factory))}


def load_pair(checkpoint: str, device: str = "cpu") -> tuple[HFTokenVLA, HFTokenVLA]:
    """The model twice in float32: on the fast path, and on transformers' DynamicCache path."""
    fast = load_policy(checkpoint, dtype="float32", device=device)
    slow = load_policy(checkpoint, dtype="float32", device=device)
    assert fast.static is not None, fast.info
    slow.static = None  # what a model whose text runs as transformers' modules takes
    return fast, slow


def observation(seed: int, image_size: int) -> Observation:
    image = np.random.default_rng(seed).integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)
    return Observation(image=image, instruction="pick up the red cube", joint_pos=np.linspace(-0.3, 0.3, 7),
                       gripper=0.03)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal bit for bit: on the CPU the fast path's eager passes are the DynamicCache path's
    arithmetic over the same rows (the issue asks for 1e-5 in float32)."""
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["hf_small", "openvla"])
def test_every_pass_and_rollback_match_the_dynamic_cache(models: dict[str, str], name: str) -> None:
    fast, slow = load_pair(models[name])
    assert fast.info["fast_path"] == "static KV cache, eager passes (CPU)"
    obs = observation(3, fast.config.image_size)
    bins = torch.tensor([[17, 200, 3, 255, 128, 64, 9]])
    a, b = fast.prefill_batch([obs]), slow.prefill_batch([obs])
    close(a.logits, b.logits)
    close(a.prefix.pooled, b.prefix.pooled)
    cache = a.prefix.cache.cache
    assert isinstance(cache, StaticKVCache) and cache.length == a.prefix.prefix_len
    buffers = [t.data_ptr() for t in cache.keys]
    for k in range(1, 8):  # the k-token verify passes, each after the prefill
        close(fast.score(a.prefix, bins[:, :k]).logits, slow.score(b.prefix, bins[:, :k]).logits)
    # one token at a time, then a rollback to 2 tokens and another continuation
    pa, pb = a.prefix, b.prefix
    for i in range(7):
        sa, sb = fast.score(pa, bins[:, i:i + 1]), slow.score(pb, bins[:, i:i + 1])
        close(sa.logits, sb.logits)
        pa, pb = sa.prefix, sb.prefix
    two_a, two_b = fast.score(a.prefix, bins[:, :2]).prefix, slow.score(b.prefix, bins[:, :2]).prefix
    close(fast.score(pa, bins[:, :0]).logits, slow.score(pb, bins[:, :0]).logits)  # the longer prefix, re-fed
    other = torch.tensor([[5, 6, 7, 8, 9]])
    close(fast.score(two_a, other).logits, slow.score(two_b, other).logits)
    assert [t.data_ptr() for t in cache.keys] == buffers  # rolled back by length: nothing reallocated
    # verification inside the prefill
    close(fast.prefill_batch([obs], bins).logits, slow.prefill_batch([obs], bins).logits)


def test_more_tokens_than_the_cache_was_made_for_grow_it(models: dict[str, str]) -> None:
    fast, slow = load_pair(models["hf_small"])
    obs = observation(5, fast.config.image_size)
    a, b = fast.prefill(obs), slow.prefill(obs)
    capacity = a.cache.cache.capacity
    many = torch.arange(capacity - a.prefix_len + 3)[None] % 256  # past the preallocated rows
    close(fast.score(a, many).logits, slow.score(b, many).logits)
    assert a.cache.cache.capacity > capacity
    close(fast.score(a, many[:, :2]).logits, slow.score(b, many[:, :2]).logits)  # and rolled back again


def test_a_prefix_whose_cache_a_later_prefill_took_is_refused(models: dict[str, str]) -> None:
    fast, _ = load_pair(models["hf_small"])
    obs = observation(4, fast.config.image_size)
    first = fast.prefill(obs)
    second = fast.prefill(obs)  # the pool's other cache: the first prefix stays usable
    tokens = torch.tensor([[1, 2]])
    torch.testing.assert_close(fast.score(first, tokens).logits, fast.score(second, tokens).logits, rtol=0, atol=0)
    fast.prefill(obs)  # claims the first prefix's cache again
    with pytest.raises(ValueError, match="taken by a later prefill"):
        fast.score(first, tokens)


def test_a_transformers_text_model_keeps_the_dynamic_cache_and_says_why(tmp_path: Path) -> None:
    import json
    import shutil

    copy = tmp_path / "hf_small"
    shutil.copytree(HF_SMALL, copy)
    spec_file = copy / "vla_spec.json"
    spec = json.loads(spec_file.read_text())
    spec_file.write_text(json.dumps({**spec, "direct_forward": False}))
    policy = load_policy(f"hf:{copy}", dtype="float32")
    assert policy.static is None
    assert policy.info["fast_path"].startswith("none: transformers' DynamicCache")


def test_bfloat16_is_the_default_on_a_gpu_and_a_declared_dtype_wins(tmp_path: Path) -> None:
    import json

    from vla_accel_ros.models.token_vla.spec import default_dtype

    assert default_dtype(tmp_path, "cuda", "float32") == "bfloat16"
    assert default_dtype(tmp_path, "cuda:1", "float32") == "bfloat16"
    assert default_dtype(tmp_path, None, "float32") == default_dtype(tmp_path, "cpu", "float32") == "float32"
    assert default_dtype(tmp_path, "cpu", "bfloat16") == "bfloat16"  # OpenVLA's stored dtype on the CPU
    (tmp_path / "vla_spec.json").write_text(json.dumps({"device": "cuda"}))
    assert default_dtype(tmp_path, None, "float32") == "bfloat16"
    (tmp_path / "vla_spec.json").write_text(json.dumps({"device": "cuda", "dtype": "float16"}))
    assert default_dtype(tmp_path, "cuda", "float32") == "float16"


def recording(policy: HFTokenVLA) -> list[torch.Tensor]:
    """Every action-logits tensor the policy computes from now on, in order."""
    seen: list[torch.Tensor] = []
    head = policy.action_logits

    def action_logits(hidden: torch.Tensor) -> torch.Tensor:
        logits = head(hidden)
        seen.append(logits.detach().cpu().clone())
        return logits

    policy.action_logits = action_logits  # type: ignore[method-assign]
    return seen


def episode(policy: HFTokenVLA, decoder: str, steps: int = STEPS) -> list[list[int]]:
    """The tokens of the first ``steps`` sim steps of one seeded episode under ``decoder`` (greedy)."""
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.decoding.boundary import PUBLISHED_BOUNDARY
    from vla_accel_ros.decoding.retrieval import RetrievalStore
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig

    runner = build_runner(RunnerConfig(decoder=decoder, max_steps=60, temperature=0.0),
                          ArmKinematics(default_urdf()), policy=policy, clock=lambda: 0.0)
    if runner.decoder.capabilities().retrieval_store:  # heisd: a store over the model's width
        rng = np.random.default_rng(0)
        keys = rng.standard_normal((32, policy.config.d_model)).astype(np.float32)
        store = RetrievalStore(keys, rng.integers(0, 255, (32, 4, 7)),
                               meta={"calibration": PUBLISHED_BOUNDARY.to_dict()})
        runner.decoder.attach_store(store, policy)
    tokens = []
    with PickCubeEnv(SimConfig(image_size=runner.image_size, max_steps=60)) as env:
        obs = env.reset(100000)
        runner.start_episode(100000)
        while not env.done and len(tokens) < steps:
            result = runner(obs, target_clearance=env.target_clearance())
            tokens.append([int(t) for t in np.asarray(result.tokens).reshape(-1)])
            obs, _ = env.step(result.action)
    return tokens


def same_episode(fast: HFTokenVLA, slow: HFTokenVLA, decoder: str) -> None:
    fast_logits, slow_logits = recording(fast), recording(slow)
    assert episode(fast, decoder) == episode(slow, decoder)
    assert len(fast_logits) == len(slow_logits) > STEPS
    for a, b in zip(fast_logits, slow_logits, strict=True):
        close(a, b)


@pytest.fixture(scope="module")
def hf_pair(models: dict[str, str]) -> tuple[HFTokenVLA, HFTokenVLA]:
    return load_pair(models["hf_small"])


@pytest.fixture(scope="module")
def openvla_pair(models: dict[str, str]) -> tuple[HFTokenVLA, HFTokenVLA]:
    return load_pair(models["openvla"])


@pytest.mark.parametrize("decoder", DECODERS)
def test_each_decoder_gives_the_same_tokens_and_logits_on_hf_small(hf_pair: Any, decoder: str) -> None:
    same_episode(*hf_pair, decoder)


@pytest.mark.parametrize("decoder", ["ar", "kerv", "world_aware"])
def test_each_decoder_gives_the_same_tokens_and_logits_on_openvla(openvla_pair: Any, decoder: str) -> None:
    same_episode(*openvla_pair, decoder)


# --- on a GPU -------------------------------------------------------------------------------------
def eager_twin(checkpoint: str) -> tuple[HFTokenVLA, HFTokenVLA]:
    """The model on CUDA twice in float32: with CUDA graphs, and with the same passes eager."""
    graphs = load_policy(checkpoint, dtype="float32", device="cuda")
    eager = load_policy(checkpoint, dtype="float32", device="cuda")
    assert graphs.static is not None and graphs.static.graphs
    eager.static.graphs = False
    eager._image_graphs = None
    return graphs, eager


@CUDA
def test_cuda_graphs_replay_the_agreement_fixture_as_eager_passes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 convolutions, as the fixture's
    directory = layout.write_reference_dir(tmp_path / "model")
    graphs, eager = eager_twin(str(directory))
    recorded = dict(np.load(FIXTURES / "reference" / "recorded.npz"))
    combo = 0
    for image in layout.reference_images():
        for instruction in layout.REFERENCE_INSTRUCTIONS:
            obs = Observation(image=image, instruction=instruction, joint_pos=np.zeros(7), gripper=0.04)
            tokens = recorded["tokens"][combo]
            ours = torch.from_numpy(31999 - tokens[:6])[None]
            a, b = graphs.prefill_batch([obs], ours), eager.prefill_batch([obs], ours)
            torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=5e-4)
            assert (31999 - a.logits[0].argmax(-1).cpu().numpy()).tolist() == tokens.tolist()
            step_a, step_b = graphs.prefill(obs), eager.prefill(obs)
            seven = torch.cat([ours, ours[:, :1]], dim=1)
            for k in range(1, 8):  # the 1-token step and the k-token verify passes
                torch.testing.assert_close(graphs.score(step_a, seven[:, :k]).logits,
                                           eager.score(step_b, seven[:, :k]).logits, rtol=0, atol=5e-4)
            combo += 1
    assert not graphs.static.errors and not graphs._image_graphs.error


@CUDA
@pytest.mark.parametrize("decoder", ["ar", "sd", "kerv", "world_aware", "deadline"])
def test_cuda_graphs_give_each_decoder_the_same_tokens_on_a_tiny_model(models: dict[str, str],
                                                                        decoder: str) -> None:
    graphs, eager = eager_twin(models["hf_small"])
    assert episode(graphs, decoder) == episode(eager, decoder)
    assert not graphs.static.errors



@CUDA
def test_cuda_ofts_parallel_pass_replays_as_one_graph(tmp_path: Path) -> None:
    from vla_accel_ros.models.oft.weights import convert_directory

    oft_spec = importlib.util.spec_from_file_location("oft_layout", FIXTURES.parent / "oft" / "layout.py")
    oft_layout = importlib.util.module_from_spec(oft_spec)
    oft_spec.loader.exec_module(oft_layout)
    directory = oft_layout.write_oft_dir(tmp_path / "model")
    convert_directory(directory, report=lambda line: None)
    graphs = load_policy(directory, dtype="float32", device="cuda")
    eager = load_policy(directory, dtype="float32", device="cuda")
    eager._graphs = None
    rng = np.random.default_rng(0)
    for seed in range(3):  # the first call records, the others replay
        images = [rng.integers(0, 256, (112, 112, 3), dtype=np.uint8) for _ in range(2)]
        obs = Observation(image=images[0], extra_images=(images[1],), instruction="pick up the red cube",
                          joint_pos=np.zeros(7), gripper=0.02,
                          state=np.array([0.05, -0.1, 0.6, 2.7, 0.0, -0.05, 0.02, -0.02]) * (seed + 1))
        np.testing.assert_allclose(graphs.predict_chunk(obs).normalized, eager.predict_chunk(obs).normalized,
                                   rtol=0, atol=1e-4)
    assert len(graphs._graphs) == 1 and not graphs._graphs.error
