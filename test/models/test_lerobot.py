"""LeRobot's flow VLAs read natively: the chunks of LeRobot 0.6.1's own SmolVLA, π0 and π0.5 on the
fixture's policies (``test/fixtures/lerobot/README.md``), the processor statistics, the prefix's
reuse over the flow steps, ``vla-accel predict`` and the one-line refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vla_accel_ros.cli import main  # noqa: E402
from vla_accel_ros.models.lerobot.checkpoint import load_lerobot  # noqa: E402
from vla_accel_ros.models.lerobot.config import parse_config  # noqa: E402
from vla_accel_ros.models.lerobot.processor import Statistics  # noqa: E402
from vla_accel_ros.models.load import recognise  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
TOKENIZERS = {"smolvla": FIXTURES / "tokenizers" / "smolvlm2", "pi0": FIXTURES / "tokenizers" / "paligemma",
              "pi05": FIXTURES / "tokenizers" / "paligemma"}
# fp32 agreement: this many times the original's own fp32 noise (its chunks for a batch of two
# against one at a time); the original's bfloat16 run differs from its fp32 one 1e4 times more
NOISE_FACTOR = 20.0


@pytest.fixture(scope="module", params=["smolvla", "pi0", "pi05"])
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def policy(family: str):  # type: ignore[no-untyped-def]
    return load_lerobot(FIXTURES / family, tokenizer_dir=TOKENIZERS[family])


def reference(family: str) -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURES / f"{family}_reference.npz"))


def tolerance(family: str) -> float:
    calibration = json.loads((FIXTURES / f"{family}_calibration.json").read_text())
    return NOISE_FACTOR * max(calibration["batch2_vs_batch1_fp32"], 1e-7)


def test_chunks_agree_with_lerobot(family: str, policy) -> None:  # type: ignore[no-untyped-def]
    ref = reference(family)
    tol = tolerance(family)
    assert tol < 1e-4
    for i in range(len(ref["tasks"])):
        images, state, task = [ref["front"][i], ref["wrist"][i]], ref["state"][i], str(ref["tasks"][i])
        chunk = policy.predict_chunk(images, state, task, noise=ref["noise"][i])
        assert chunk.actions.shape == (50, 6)
        assert np.abs(chunk.normalized - ref["actions_normalized"][i]).max() <= tol
        assert np.abs(chunk.actions - ref["actions"][i]).max() <= tol
        two = policy.predict_chunk(images, state, task, noise=ref["noise"][i], steps=2)
        assert np.abs(two.normalized - ref["actions_normalized_2steps"][i]).max() <= tol
        # the fixture discriminates: another noise, or another task, moves the chunk far past the tolerance
        other = policy.predict_chunk(images, state, str(ref["tasks"][1 - i]), noise=ref["noise"][i])
        assert np.abs(other.normalized - ref["actions_normalized"][i]).max() > 1e3 * tol


def test_float_images_as_lerobot_holds_them(policy) -> None:  # type: ignore[no-untyped-def]
    ref = reference(policy.config.type)
    as_uint8 = policy.predict_chunk([ref["front"][0], ref["wrist"][0]], ref["state"][0], str(ref["tasks"][0]),
                                    noise=ref["noise"][0])
    floats = [np.ascontiguousarray(im.transpose(2, 0, 1)).astype(np.float32) / 255.0
              for im in (ref["front"][0], ref["wrist"][0])]
    as_float = policy.predict_chunk(floats, ref["state"][0], str(ref["tasks"][0]), noise=ref["noise"][0])
    np.testing.assert_array_equal(as_uint8.actions, as_float.actions)


def test_prefix_reuse_over_flow_steps_equals_recomputing(policy) -> None:  # type: ignore[no-untyped-def]
    ref = reference(policy.config.type)
    inputs = policy.inputs([ref["front"][1], ref["wrist"][1]], ref["state"][1], str(ref["tasks"][1]))
    noise = torch.as_tensor(ref["noise"][1])[None]
    with torch.inference_mode():
        reused = policy.integrate(policy.prefix(inputs), inputs, noise, 10)
        x, dt = noise, -0.1
        for step in range(10):  # a fresh prefix for every step
            t = torch.tensor(1.0 + step * dt, dtype=torch.float32).expand(1)
            x = x + dt * policy.velocity(policy.prefix(inputs), inputs, x, t)
    torch.testing.assert_close(reused, x, rtol=0, atol=0)


def test_statistics_from_the_processor_files(family: str, policy) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    pre = json.loads((FIXTURES / family / "policy_preprocessor.json").read_text())
    state_file = next(s["state_file"] for s in pre["steps"] if s.get("registry_name") == "normalizer_processor")
    stored = load_file(str(FIXTURES / family / state_file))
    state = torch.tensor([[0.3, -1.0, 2.0, 0.0, 5.0, -0.5]])
    if family == "pi05":  # QUANTILES: q01..q99 to [-1, 1], both ways
        low, high = stored["observation.state.q01"], stored["observation.state.q99"]
        expected = 2.0 * (state - low) / (high - low) - 1.0
    else:
        expected = (state - stored["observation.state.mean"]) / (stored["observation.state.std"] + 1e-8)
    torch.testing.assert_close(policy.statistics.state.normalise(state), expected)
    action = torch.tensor([[0.1, 0.2, -0.3, 1.0, -1.0, 0.0]])
    post = json.loads((FIXTURES / family / "policy_postprocessor.json").read_text())
    post_file = next(s["state_file"] for s in post["steps"] if s.get("registry_name") == "unnormalizer_processor")
    stats = load_file(str(FIXTURES / family / post_file))
    if family == "pi05":
        expected = (action + 1.0) * (stats["action.q99"] - stats["action.q01"]) / 2.0 + stats["action.q01"]
    else:
        expected = action * stats["action.std"] + stats["action.mean"]
    torch.testing.assert_close(policy.statistics.action.unnormalise(action), expected)
    torch.testing.assert_close(policy.statistics.action.normalise(policy.statistics.action.unnormalise(action)),
                               action, atol=1e-6, rtol=0)


def copy_policy(tmp_path: Path, family: str = "smolvla") -> Path:
    target = tmp_path / family
    shutil.copytree(FIXTURES / family, target)
    return target


def test_quantile_statistics_and_a_renamed_state_file(tmp_path: Path) -> None:
    """QUANTILES maps q01..q99 to [-1, 1]; the statistics file is found through ``state_file``."""
    directory = copy_policy(tmp_path)
    post = json.loads((directory / "policy_postprocessor.json").read_text())
    step = next(s for s in post["steps"] if s.get("registry_name") == "unnormalizer_processor")
    renamed = "policy_postprocessor_step_3_unnormalizer_processor.safetensors"
    (directory / step["state_file"]).rename(directory / renamed)
    step["state_file"] = renamed
    step["config"]["norm_map"]["ACTION"] = "QUANTILES"
    (directory / "policy_postprocessor.json").write_text(json.dumps(post))
    config = parse_config(directory / "config.json", json.loads((directory / "config.json").read_text()))
    statistics = Statistics.load(directory, config)
    q01, q99 = statistics.action.stats["q01"], statistics.action.stats["q99"]
    torch.testing.assert_close(statistics.action.unnormalise(torch.stack([-torch.ones(6), torch.ones(6)])),
                               torch.stack([q01, q99]))


def error_of(directory: Path, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as caught:
        load_lerobot(directory, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_refusals_name_the_file_or_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = copy_policy(tmp_path)
    # a missing tokenizer says where it was looked for
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    message = error_of(directory)
    assert "SmolVLM2-500M-Video-Instruct" in message and str(tmp_path / "hf" / "hub") in message
    assert "tokenizer_dir" in error_of(directory, tokenizer_dir=tmp_path / "nowhere")
    # statistics missing a feature
    from safetensors.torch import load_file, save_file

    pre = json.loads((directory / "policy_preprocessor.json").read_text())
    state_file = next(s["state_file"] for s in pre["steps"] if s.get("registry_name") == "normalizer_processor")
    stats = load_file(str(directory / state_file))
    save_file({k: v for k, v in stats.items() if not k.startswith("observation.state")}, str(directory / state_file))
    message = error_of(directory, tokenizer_dir=TOKENIZERS["smolvla"])
    assert state_file in message and "observation.state.mean" in message
    # an unsupported type lists the supported ones
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "type": "act"}))
    assert recognise(directory).name == "lerobot"
    message = error_of(directory, tokenizer_dir=TOKENIZERS["smolvla"])
    assert "'act'" in message and "supported: smolvla, pi0, pi05" in message


def test_state_and_action_widths_must_match_the_robot(policy) -> None:  # type: ignore[no-untyped-def]
    ref = reference(policy.config.type)
    with pytest.raises(ValueError, match="observation.state has 6 values, got 7"):
        policy.inputs([ref["front"][0], ref["wrist"][0]], np.zeros(7), "x")
    with pytest.raises(ValueError, match="2 images"):
        policy.inputs([ref["front"][0]], ref["state"][0], "x")
    policy.check_robot(6, 6)
    with pytest.raises(ValueError, match="the robot has 7 and 7"):
        policy.check_robot(7, 7)


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_predict_json_with_noise_and_images(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    from PIL import Image

    ref = reference(kind)
    Image.fromarray(ref["front"][0]).save(tmp_path / "front.png")
    np.save(tmp_path / "wrist.npy", ref["wrist"][0])
    np.save(tmp_path / "noise.npy", ref["noise"][0])
    state = ",".join(repr(float(v)) for v in ref["state"][0])
    args = ["predict", "--checkpoint", str(FIXTURES / kind), "--image", str(tmp_path / "front.png"), "--image",
            str(tmp_path / "wrist.npy"), f"--state={state}", "--instruction", str(ref["tasks"][0]),
            "--tokenizer-dir", str(TOKENIZERS[kind])]
    assert main([*args, "--noise", str(tmp_path / "noise.npy"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["family"] == "lerobot" and out["type"] == kind and out["steps"] == 10
    assert np.abs(np.array(out["actions"]) - ref["actions"][0]).max() <= tolerance(kind)
    assert np.abs(np.array(out["actions_normalized"]) - ref["actions_normalized"][0]).max() <= tolerance(kind)
    assert main([*args, "--noise", str(tmp_path / "noise.npy"), "--steps", "2", "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["steps"] == 2
    assert np.abs(np.array(two["actions_normalized"]) - ref["actions_normalized_2steps"][0]).max() <= tolerance(kind)
    np.save(tmp_path / "bad_noise.npy", np.zeros((50, 6), dtype=np.float32))
    assert main([*args, "--noise", str(tmp_path / "bad_noise.npy")]) == 2
    err = capsys.readouterr().err
    assert "bad_noise.npy" in err and "50 x 32" in err and "Traceback" not in err


def prefix_tensors(prefix) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Every layer's keys and values of a SmolVLA, π0 or π0.5 prefix."""
    if hasattr(prefix, "keys"):
        return [*prefix.keys, *prefix.values]
    return [t for layer in prefix.cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("kind", ["smolvla", "pi0", "pi05"])
def test_incremental_vision_every_token_changed_equals_the_full_prefix(kind: str) -> None:
    from vla_accel_ros.models.configuration import VisionReuseConfig

    policy = load_lerobot(FIXTURES / kind, tokenizer_dir=TOKENIZERS[kind])
    ref = reference(kind)
    side = policy.config.image_size
    task = str(ref["tasks"][0])
    settings = VisionReuseConfig(threshold=8.0, refresh_steps=100, max_drift=2.0, reuse_kv=True)
    incremental = policy.incremental_vision(settings)
    # square frames: no padding, whose tokens never change (and keep their keys and values)
    frames = np.random.default_rng(3).integers(0, 256, (2, side, side, 3), dtype=np.uint8)
    with torch.inference_mode():
        first = policy.inputs([frames[0], ref["wrist"][0]], ref["state"][0], task)
        incremental.prefix(first)
        assert incremental.last.refreshed and incremental.last.reason == "first frame"
        # every pixel of both cameras moves (a new frame far from the first): every token recomputed
        moved = [np.clip(frames[0].astype(int) + 100 * (frames[0] < 128) - 100 * (frames[0] >= 128), 0,
                         255).astype(np.uint8),
                 np.clip(ref["wrist"][0].astype(int) + 100 * (ref["wrist"][0] < 128) - 100 * (ref["wrist"][0] >= 128),
                         0, 255).astype(np.uint8)]
        second = policy.inputs(moved, ref["state"][1], task)
        reused = incremental.prefix(second)
        assert not incremental.last.refreshed and incremental.last.fraction == 1.0
        full = policy.prefix(second)
        for a, b in zip(prefix_tensors(reused), prefix_tensors(full), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        # the same frame again: no image token recomputed, the prefix still the full one; with a new
        # state (π0.5's is in the language, which its image tokens attend to: the same state there)
        third = policy.inputs(moved, ref["state"][1 if kind == "pi05" else 0], task)
        again = incremental.prefix(third)
        assert incremental.last.recomputed == 0
        full = policy.prefix(third)
        for a, b in zip(prefix_tensors(again), prefix_tensors(full), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        # one camera moved in one corner: only its tokens there are recomputed
        corner = moved[0].copy()
        corner[:20, :20] = 255 - corner[:20, :20]
        incremental.prefix(policy.inputs([corner, moved[1]], ref["state"][0], task))
        assert 0 < incremental.last.recomputed < incremental.last.n_patches // 4
    chunk = policy.predict_chunk(moved, ref["state"][0], task, noise=ref["noise"][0], incremental=incremental)
    assert np.isfinite(chunk.actions).all()


def layout_module():  # type: ignore[no-untyped-def]
    """``test/fixtures/lerobot/layout.py``, which writes random-weight policy directories."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lerobot_layout", FIXTURES / "layout.py")
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    return layout


def first_runner_chunk(arm, decoder: str):  # type: ignore[no-untyped-def]
    """The chunk the runtime hands the controller for one observation (``decoder`` seeded with 3),
    and that observation's image, state and the decoder's noise, for ``predict_chunk``."""
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.decoding import make_decoder
    from vla_accel_ros.runtime.runner import PolicyRunner

    runner = PolicyRunner(arm, make_decoder(decoder, seed=3), ArmKinematics(default_urdf()), action_dt_s=0.05,
                          period_s=1.0)
    image = np.random.default_rng(0).integers(0, 255, (96, 96, 3), dtype=np.uint8)
    q, opening = np.linspace(-0.5, 0.5, 7), 0.02
    chunk = runner(Observation(image, "pick up the red cube", q, opening, 0.0)).chunk
    noise = torch.randn(arm.noise_shape(), generator=torch.Generator().manual_seed(3))
    return chunk, (image, np.r_[q, opening], noise.numpy())


def test_the_runner_refuses_a_policy_whose_widths_are_not_the_arms(tmp_path: Path) -> None:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.decoding import make_decoder
    from vla_accel_ros.runtime.runner import PolicyRunner

    layout = layout_module()
    kin = ArmKinematics(default_urdf())
    policy = load_lerobot(FIXTURES / "smolvla", tokenizer_dir=TOKENIZERS["smolvla"])  # an SO-100's 6 and 6
    with pytest.raises(ValueError, match="state of 6 and gives actions of 6; the robot has 8 and 7"):
        PolicyRunner(policy, make_decoder("flow10"), kin, action_dt_s=0.05, period_s=1.0)
    arm = load_lerobot(layout.write_smolvla_dir(tmp_path / "arm"), tokenizer_dir=TOKENIZERS["smolvla"])
    runner = PolicyRunner(arm, make_decoder("flow2"), kin, action_dt_s=0.05, period_s=1.0)
    from vla_accel_ros.core.observation import Observation

    obs = Observation(image=np.zeros((128, 128, 3), np.uint8), instruction="pick up the red cube",
                      joint_pos=np.zeros(7), gripper=0.04)
    result = runner(obs)
    assert result.chunk.shape == (10, 7) and np.array_equal(result.action, result.chunk[0])
    assert np.isfinite(result.chunk).all()


def test_the_runtime_prefill_takes_every_camera_in_slot_order(policy) -> None:  # type: ignore[no-untyped-def]
    from vla_accel_ros.core.observation import Observation

    ref = reference(policy.config.type)
    front, wrist = (np.asarray(ref[k][1]) for k in ("front", "wrist"))
    if front.dtype != np.uint8:  # LeRobot's 3 x H x W floats in [0, 1]: the node's H x W x 3 uint8
        front, wrist = ((np.moveaxis(a, 0, -1) * 255).round().astype(np.uint8) for a in (front, wrist))
    state = np.asarray(ref["state"][1], dtype=np.float64)
    obs = Observation(front, str(ref["tasks"][1]), state[:-1], float(state[-1]), 0.0, extra_images=(wrist,))
    assert policy.capabilities().image_slots == 2
    noise = torch.as_tensor(ref["noise"][1])
    chunk = policy.sample_chunk(policy.prefill(obs), noise, 10)
    want = policy.predict_chunk([front, wrist], state, str(ref["tasks"][1]), noise=ref["noise"][1]).actions
    np.testing.assert_allclose(chunk, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["smolvla", "pi05"])
@pytest.mark.parametrize("decoder, steps", [("flow2", 2), ("flow10", None)])
def test_the_flow_decoders_sample_the_policys_field_in_their_step_count(tmp_path: Path, decoder: str,
                                                                       steps: int | None, kind: str) -> None:
    """``flow2``: two Euler steps of the policy's own velocity field, from the decoder's seeded
    noise (``flow10``: the policy's own step count), exactly what ``predict_chunk`` computes; for a
    SmolVLA and a π0.5 (whose prompt carries the arm's state) of the package arm's widths."""
    writer = getattr(layout_module(), f"write_{kind}_dir")
    arm = load_lerobot(writer(tmp_path / "arm"), tokenizer_dir=TOKENIZERS[kind])
    chunk, (image, state, noise) = first_runner_chunk(arm, decoder)
    want = arm.predict_chunk([image], state, "pick up the red cube", noise=noise, steps=steps)
    np.testing.assert_allclose(chunk, want.actions, rtol=0, atol=1e-6)


def test_the_controller_gets_the_chunks_first_n_action_steps(tmp_path: Path) -> None:
    """As LeRobot's ``select_action``: a policy whose ``n_action_steps`` is below its
    ``chunk_size`` has only that many of each chunk executed; more than the chunk is refused."""
    directory = layout_module().write_smolvla_dir(tmp_path / "arm")
    config = json.loads((directory / "config.json").read_text())
    config["n_action_steps"] = 4
    (directory / "config.json").write_text(json.dumps(config))
    arm = load_lerobot(directory, tokenizer_dir=TOKENIZERS["smolvla"])
    assert arm.config.chunk_size == 10
    chunk, (image, state, noise) = first_runner_chunk(arm, "flow10")
    want = arm.predict_chunk([image], state, "pick up the red cube", noise=noise)
    assert len(want.actions) == 10
    np.testing.assert_allclose(chunk, want.actions[:4], rtol=0, atol=1e-6)
    config["n_action_steps"] = 11
    (directory / "config.json").write_text(json.dumps(config))
    assert "n_action_steps must be in 1..chunk_size (10), got 11" in error_of(directory,
                                                                              tokenizer_dir=TOKENIZERS["smolvla"])


@pytest.mark.parametrize("method", ["distilled", "two_anchor"])
def test_a_fresh_2_step_student_of_either_family_is_two_euler_steps(policy, method: str) -> None:  # type: ignore[no-untyped-def]
    """``vla-accel train-flow`` starts either student as 2 Euler steps of the policy's own field
    (π0's distilled copy holds its state projection too: its suffix reads the state; π0.5's its
    time MLP, which conditions the expert's norms)."""
    from vla_accel_ros.models.lerobot.student import FlowStudent, flow_step_names

    ref = reference(policy.config.type)
    inputs = policy.inputs([ref["front"][0], ref["wrist"][0]], ref["state"][0], str(ref["tasks"][0]))
    noise = torch.as_tensor(ref["noise"][0])[None]
    student = FlowStudent.fresh(method, policy.model)
    if method == "distilled":
        names = flow_step_names(policy.model)
        assert ("state_proj.weight" in names) == (policy.config.type == "pi0")
        assert ("time_mlp_in.weight" in names) == (policy.config.type == "pi05")
        assert ("action_time_mlp_in.weight" in names) == (policy.config.type != "pi05")
        assert student.model is not None and student.model.expert is not policy.model.expert
    with torch.inference_mode():
        prefix = policy.prefix(inputs)
        euler = policy.integrate(prefix, inputs, noise, 2)
        sample = student.sample(lambda x, t, model: policy.velocity(prefix, inputs, x, t, model), noise)
    torch.testing.assert_close(sample, euler, rtol=0, atol=1e-6)


def test_a_device_this_torch_cannot_use_is_refused_in_one_line() -> None:
    assert "cpu, cuda or cuda:N" in error_of(FIXTURES / "smolvla", device="tpu")
    if not torch.cuda.is_available():
        assert "sees no CUDA device" in error_of(FIXTURES / "smolvla", device="cuda")


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="needs a CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
def test_on_either_device_the_chunks_agree_with_lerobot(family: str, device: str) -> None:
    # float32 on a GPU sums in other orders than on the CPU: allowed a tenth of what the original's
    # own bfloat16 run moves its chunk
    calibration = json.loads((FIXTURES / f"{family}_calibration.json").read_text())
    tol = tolerance(family) if device == "cpu" else calibration["bf16_vs_fp32_normalized"] / 10
    policy = load_lerobot(FIXTURES / family, tokenizer_dir=TOKENIZERS[family], device=device)
    assert next(policy.model.parameters()).device.type == device
    ref = reference(family)
    for i in range(len(ref["tasks"])):
        images, state, task = [ref["front"][i], ref["wrist"][i]], ref["state"][i], str(ref["tasks"][i])
        chunk = policy.predict_chunk(images, state, task, noise=ref["noise"][i])
        assert np.abs(chunk.normalized - ref["actions_normalized"][i]).max() <= tol
        two = policy.predict_chunk(images, state, task, noise=ref["noise"][i], steps=2)
        assert np.abs(two.normalized - ref["actions_normalized_2steps"][i]).max() <= tol
    # on a GPU the prefix and the sampler (10 and 2 steps) replay as CUDA graphs, with the eager passes' numbers
    assert policy.graph_errors == []
    assert policy.graph_shapes == (3 if device == "cuda" else 0)
    policy.cuda_graphs = False
    eager = policy.predict_chunk(images, state, task, noise=ref["noise"][i])
    np.testing.assert_allclose(eager.normalized, chunk.normalized, rtol=0, atol=1e-6)
    policy.cuda_graphs = device == "cuda"
    # the runtime's path: a prefill, the sampler (unguided and guided), incremental vision
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.models.configuration import VisionReuseConfig
    from vla_accel_ros.models.realtime_chunking import ChunkGuide

    state = np.asarray(ref["state"][0], dtype=float)
    obs = Observation(ref["front"][0], task, state[:5], float(state[5]), extra_images=(ref["wrist"][0],))
    noise = torch.as_tensor(ref["noise"][0])
    prefix = policy.prefill(obs)
    plain = policy.sample_chunk(prefix, noise, 10)
    direct = policy.predict_chunk(obs.images, state, task, noise=ref["noise"][0])
    np.testing.assert_allclose(plain, direct.actions, atol=tol)
    incremental = policy.incremental_vision(VisionReuseConfig(threshold=8.0, refresh_steps=100, max_drift=2.0,
                                                              reuse_kv=True))
    policy.prefill(obs, incremental)
    again = policy.sample_chunk(policy.prefill(obs, incremental), noise, 10)
    # nothing changed: every image token reused, unless a GPU's measured costs (bucketed incremental
    # vision, models/lerobot/buckets.py) found the full prefix cheaper than the rows pass
    assert incremental.last.recomputed == 0 or incremental.last.reason == incremental.cheaper_in_full
    np.testing.assert_allclose(again, plain, atol=max(tol, 1e-4))
    target = policy.sample_space(plain)[None]
    guide = ChunkGuide(target, torch.ones_like(target), frozen=3, max_guidance=5.0)
    guided = policy.sample_chunk(prefix, noise, 10, guide=guide)
    np.testing.assert_allclose(guided[:3], plain[:3], atol=1e-4)  # the frozen steps are the target's


@pytest.mark.parametrize("device", DEVICES)
def test_the_runner_places_a_lerobot_policy_on_its_device_and_no_other_family(tmp_path: Path, device: str) -> None:
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.core.resources import default_checkpoint, default_urdf
    from vla_accel_ros.runtime.runner import PolicyRunner

    kin = ArmKinematics(default_urdf())
    with pytest.raises(ValueError, match=r"runs on cpu only \(families that run on cuda: hf, oft, openvla, lerobot\)"):
        PolicyRunner.load(default_checkpoint(), "ar", kin, device="cuda")
    directory = layout_module().write_smolvla_dir(tmp_path / "arm")
    shutil.copytree(TOKENIZERS["smolvla"], directory / "HuggingFaceTB" / "SmolVLM2-500M-Video-Instruct")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device"):
            PolicyRunner.load(directory, "flow2", kin, device="cuda", action_dt_s=0.05, period_s=1.0)
    obs = Observation(image=np.full((128, 128, 3), 90, np.uint8), instruction="pick up the red cube",
                      joint_pos=np.zeros(7), gripper=0.04)
    chunks = []
    for place in dict.fromkeys(["cpu", device]):
        runner = PolicyRunner.load(directory, "flow2", kin, device=place, action_dt_s=0.05, period_s=1.0)
        assert runner.policy.device.type == place
        chunks.append(runner(obs).chunk)
    assert chunks[0].shape == (10, 7) and np.isfinite(chunks[-1]).all()
    np.testing.assert_allclose(chunks[-1], chunks[0], atol=1e-5)


def test_a_prefix_rebuilt_from_its_tensors_serves_the_flow_as_the_original(policy) -> None:  # type: ignore[no-untyped-def]
    # what a CUDA graph's sampler does on every run: the prefix rebuilt from flat tensors
    from vla_accel_ros.models.lerobot.cuda_graph import clone_prefix, prefix_tensors, with_tensors

    ref = reference(policy.config.type)
    inputs = policy.inputs([ref["front"][0], ref["wrist"][0]], ref["state"][0], str(ref["tasks"][0]))
    noise = torch.as_tensor(ref["noise"][0])[None]
    with torch.inference_mode():
        prefix = policy.prefix(inputs)
        before = [t.clone() for t in prefix_tensors(prefix)]
        copies = prefix_tensors(clone_prefix(prefix))
        assert all(a.data_ptr() != b.data_ptr() for a, b in zip(copies, prefix_tensors(prefix), strict=True))
        rebuilt = with_tensors(prefix, copies)
        expected = policy.integrate(prefix, inputs, noise, 10)
        torch.testing.assert_close(policy.flow(rebuilt, inputs.state, noise, 10), expected, rtol=0, atol=0)
        torch.testing.assert_close(policy.flow(rebuilt, inputs.state, noise, 10), expected, rtol=0, atol=0)
    for a, b in zip(prefix_tensors(prefix), before, strict=True):  # sampling leaves the prefix as it was
        torch.testing.assert_close(a, b, rtol=0, atol=0)
