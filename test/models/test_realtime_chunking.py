"""Real-time chunking (models/realtime_chunking.py): the frozen prefix is exactly the previous
chunk's, the guided steps are pulled towards it, unguided sampling is untouched; the flow decoder
builds its guide from the previous chunk aligned to the new observation's time; LeRobot's flow
VLAs take the same guide."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.decoding.flow import FlowDecoder
from vla_accel_ros.decoding.protocol import DecodeContext
from vla_accel_ros.models.own.flow import FlowHeadConfig, FlowHeads
from vla_accel_ros.models.realtime_chunking import (
    ChunkGuide,
    guidance_weights,
    guide_tensors,
    guided_euler,
    guided_euler_static,
)

H = 8


def heads(horizon: int = H) -> FlowHeads:
    torch.manual_seed(0)
    return FlowHeads(FlowHeadConfig(d_model=8, hidden=32, layers=3, horizon=horizon))


def test_the_weights_are_one_on_the_frozen_steps_then_decay_to_zero() -> None:
    w = guidance_weights(8, frozen=2, guided=6)
    assert np.all(w[:2] == 1.0) and np.all(w[6:] == 0.0)
    assert np.all(np.diff(w[1:7]) < 0) and np.all((w[2:6] > 0) & (w[2:6] < 1))
    assert np.all(guidance_weights(8, 0, 0) == 0.0)
    with pytest.raises(ValueError):
        guidance_weights(8, frozen=3, guided=2)


@pytest.mark.parametrize("student", [False, True])
@pytest.mark.parametrize("frozen, guided", [(1, 4), (3, 3), (2, 8)])
def test_real_time_chunking_freezes_exactly_the_executed_steps(student: bool, frozen: int, guided: int) -> None:
    model = heads()
    condition, noise = torch.randn(1, 16), torch.randn(1, 7 * H)
    previous = torch.rand(1, H, 7) * 1.6 - 0.8  # what the previous chunk plans for these times
    weights = torch.as_tensor(guidance_weights(H, frozen, guided), dtype=torch.float32)[:, None]
    guided_sample = model.sample(condition, noise, student, ChunkGuide(previous, weights, frozen, 5.0)).reshape(1, H, 7)
    free = model.sample(condition, noise, student).reshape(1, H, 7)
    # the steps that run while the chunk is computed are the previous chunk's, exactly
    torch.testing.assert_close(guided_sample[:, :frozen], previous[:, :frozen], rtol=0, atol=0)
    # the guided steps after them lean towards the previous plan
    if guided > frozen:
        near = (guided_sample[:, frozen:guided] - previous[:, frozen:guided]).abs().mean()
        assert near < (free[:, frozen:guided] - previous[:, frozen:guided]).abs().mean()
    assert torch.all(guided_sample.abs() <= 1.0)


def test_without_weight_the_guided_sampler_is_plain_euler() -> None:
    model = heads()
    condition, noise = torch.randn(1, 16), torch.randn(1, 7 * H)
    nothing = ChunkGuide(torch.zeros(1, H, 7), torch.zeros(H, 1), 0, 5.0)
    with torch.no_grad():
        plain = model.sample(condition, noise, student=False)
    torch.testing.assert_close(model.sample(condition, noise, False, nothing), plain, atol=1e-5, rtol=0)


def test_the_guide_must_be_sane() -> None:
    with pytest.raises(ValueError, match="frozen"):
        ChunkGuide(torch.zeros(1), torch.zeros(1), -1, 5.0)
    with pytest.raises(ValueError, match="steps"):
        guided_euler(lambda x, tau: x, torch.zeros(1, 2, 1), 0, ChunkGuide(torch.zeros(1), torch.zeros(1), 0, 1.0))


def context(stamp: float, clock: float = 0.0) -> DecodeContext:
    return DecodeContext(joint_positions=np.zeros((1, 7)), joint_stamps=np.array([stamp]), control_period_s=0.05,
                         clock=lambda: clock)


def test_the_decoder_aligns_the_previous_chunk_to_the_new_observation() -> None:
    decoder = FlowDecoder(rtc_horizon=5, rtc_guidance=3.0)
    assert decoder.guide(context(0.0), H) is None  # nothing to follow yet
    previous = torch.arange(H, dtype=torch.float32)[:, None].expand(H, 7)  # step k holds k
    decoder.previous, decoder.step_s = (previous, 10.0), 0.07  # an inference takes 2 steps of 50 ms
    guide = decoder.guide(context(10.15), H)  # three steps later
    assert guide is not None and guide.frozen == 2 and guide.max_guidance == 3.0
    np.testing.assert_array_equal(guide.target[0, :, 0].numpy(), [3, 4, 5, 6, 7, 7, 7, 7])
    assert np.all(guide.weights[:2].numpy() == 1.0) and np.all(guide.weights[5:].numpy() == 0.0)
    assert decoder.guide(context(10.5), H) is None  # the previous chunk is over: nothing left to follow
    decoder.reset()
    assert decoder.previous is None and FlowDecoder().guide(context(10.15), H) is None  # off by default


def test_lerobot_flow_vlas_take_the_guide() -> None:
    pytest.importorskip("transformers")
    from vla_accel_ros.models.api import Prefix
    from vla_accel_ros.models.lerobot.checkpoint import load_lerobot
    from vla_accel_ros.models.lerobot.policy import FlowPrefix

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
    policy = load_lerobot(fixtures / "smolvla", tokenizer_dir=fixtures / "tokenizers" / "smolvlm2")
    ref = dict(np.load(fixtures / "smolvla_reference.npz"))
    inputs = policy.inputs([ref["front"][0], ref["wrist"][0]], ref["state"][0], str(ref["tasks"][0]))
    with torch.no_grad():
        prefix = Prefix(cache=FlowPrefix(policy.prefix(inputs), inputs), action_hidden=torch.zeros(1, 1, 1),
                        tokens=torch.zeros(1, 0, dtype=torch.long), pooled=torch.zeros(1, 1), prefix_len=0)
    noise = torch.as_tensor(ref["noise"][0])
    free = policy.sample_chunk(prefix, noise, 10)
    horizon = policy.noise_shape()[0]
    previous = policy.sample_space(free[::-1].copy())  # a different plan to follow
    weights = torch.as_tensor(guidance_weights(horizon, 2, horizon // 2), dtype=torch.float32)[:, None]
    guided = policy.sample_chunk(prefix, noise, 10, ChunkGuide(previous[None], weights, 2, 5.0))
    np.testing.assert_allclose(guided[:2], free[::-1][:2], rtol=0, atol=1e-5)  # frozen: the plan's own
    assert guided.shape == free.shape and np.all(np.isfinite(guided))


def test_guidance_runs_inside_the_step_drivers_inference_mode() -> None:
    model = heads()
    with torch.inference_mode():  # as runtime/steps.py runs every decoder step
        condition, noise, previous = torch.randn(1, 16), torch.randn(1, 7 * H), torch.rand(1, H, 7) - 0.5
        weights = torch.as_tensor(guidance_weights(H, 2, 5), dtype=torch.float32)[:, None]
        inside = model.sample(condition, noise, True, ChunkGuide(previous, weights, 2, 5.0))
    outside = model.sample(condition.clone(), noise.clone(), True,
                           ChunkGuide(previous.clone(), weights.clone(), 2, 5.0))
    torch.testing.assert_close(inside.clone(), outside, rtol=0, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 2, 10])
@pytest.mark.parametrize("frozen, guided, cap", [(0, 0, 5.0), (2, 6, 5.0), (3, 8, 0.5)])
def test_the_static_shape_guided_sampler_is_guided_euler_without_the_jacobian(steps: int, frozen: int, guided: int,
                                                                              cap: float) -> None:
    torch.manual_seed(1)
    mixing = torch.randn(7, 7) * 0.3

    def velocity(x: torch.Tensor, tau: float) -> torch.Tensor:  # a field that moves with x and with the time
        return torch.tanh(x @ mixing) * (1.0 + tau) - 0.2 * x

    noise, previous = torch.randn(1, H, 7), torch.rand(1, H, 7) * 1.6 - 0.8
    weights = torch.as_tensor(guidance_weights(H, frozen, guided), dtype=torch.float32)[:, None]
    guide = ChunkGuide(previous, weights, frozen, cap)
    expected = guided_euler(velocity, noise, steps, guide, differentiable=False)
    static = guided_euler_static(velocity, noise, steps, *guide_tensors(guide, noise.shape, noise.device))
    torch.testing.assert_close(static, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(static[:, :frozen], previous[:, :frozen], rtol=0, atol=0)
    with pytest.raises(ValueError, match="steps"):
        guided_euler_static(velocity, noise, 0, *guide_tensors(guide, noise.shape, noise.device))


def lerobot_policy(kind: str, device: str = "cpu"):  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    from vla_accel_ros.models.lerobot.checkpoint import load_lerobot

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
    tokenizers = fixtures / "tokenizers" / ("smolvlm2" if kind == "smolvla" else "paligemma")
    return load_lerobot(fixtures / kind, tokenizer_dir=tokenizers, device=device), dict(
        np.load(fixtures / f"{kind}_reference.npz"))


def guided_chunks(policy, ref) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """(the guided chunk through sample_chunk, the same guide through the static-shape sampler,
    unnormalised as sample_chunk's)."""
    from vla_accel_ros.models.api import Prefix
    from vla_accel_ros.models.lerobot.policy import FlowPrefix

    inputs = policy.inputs([ref["front"][0], ref["wrist"][0]], ref["state"][0], str(ref["tasks"][0]))
    with torch.inference_mode():
        kv = policy.prefix(inputs)
    prefix = Prefix(cache=FlowPrefix(kv, inputs), action_hidden=torch.zeros(1, 1, 1),
                    tokens=torch.zeros(1, 0, dtype=torch.long), pooled=torch.zeros(1, 1), prefix_len=0)
    noise = torch.as_tensor(ref["noise"][0])
    horizon = policy.noise_shape()[0]
    previous = policy.sample_space(policy.sample_chunk(prefix, noise, 10)[::-1].copy())
    weights = torch.as_tensor(guidance_weights(horizon, 3, horizon // 2), dtype=torch.float32)[:, None]
    guide = ChunkGuide(previous[None], weights, 3, 5.0)
    through_policy = policy.sample_chunk(prefix, noise, 10, guide)
    with torch.inference_mode():
        sample = policy.guided_flow(kv, inputs.state, noise[None].to(policy.device), 10, guide)[0].cpu()
    actions = policy.statistics.action.unnormalise(sample[:, : policy.config.action_dim])
    return through_policy, actions.numpy().astype(np.float64)


@pytest.mark.parametrize("kind", ["smolvla", "pi0", "pi05"])
def test_a_lerobot_policys_static_shape_guided_sampler_is_its_eager_guided_sampler(kind: str) -> None:
    policy, ref = lerobot_policy(kind)
    eager, static = guided_chunks(policy, ref)
    np.testing.assert_allclose(static, eager, rtol=0, atol=1e-5)
    assert policy.graph_shapes == 0  # on the CPU nothing is recorded


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["smolvla", "pi0", "pi05"])
def test_cuda_the_guided_sampler_graph_agrees_with_the_eager_guided_sampler(kind: str) -> None:
    policy, ref = lerobot_policy(kind, "cuda")
    graphed, _ = guided_chunks(policy, ref)  # sample_chunk with a guide replays the guided graph on a GPU
    assert policy.graph_errors == [] and len(policy._guided_graphs) == 1
    policy.cuda_graphs = False
    eager, _ = guided_chunks(policy, ref)  # guided_euler, eagerly
    np.testing.assert_allclose(graphed, eager, rtol=0, atol=1e-5)
