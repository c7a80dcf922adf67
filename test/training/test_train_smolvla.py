"""``vla-accel train-smolvla`` and ``vla-accel train-flow`` for a LeRobot policy, on tiny demos with
a wrist camera: the trained directory is LeRobot's layout, loads from its own ``vlm/`` folder with no
Hugging Face cache, keeps the VLA's vision tower, and learns; the fitted 2-step samplers start as 2
Euler steps, move towards the 10-step sampler when trained, survive a save and load, and are what
``flow2`` samples."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_accel_ros.cli import main
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding.flow import Flow2Decoder, FlowDecoder
from vla_accel_ros.models.lerobot.checkpoint import load_lerobot
from vla_accel_ros.models.lerobot.student import STUDENT_META, FlowStudent, load_student
from vla_accel_ros.training.configs import FlowTrainConfig
from vla_accel_ros.training.data import load_demos
from vla_accel_ros.training.flow import train_flow
from vla_accel_ros.training.hf_draft import episode_instructions
from vla_accel_ros.training.lerobot_flow import DemoInputs, student_gap

torch.set_num_threads(1)
SIZE, STEPS = 32, 6
TINY_HF = ["--vision-hidden", "32", "--vision-layers", "1", "--vision-heads", "2", "--hidden-size", "32",
           "--layers", "2", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "64"]


def write_demos(directory: Path) -> Path:
    """Four episodes of random frames from two cameras; each episode's actions a constant of its own."""
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True)
    for i in range(4):
        actions = np.tile(np.r_[rng.uniform(-0.02, 0.02, 3), np.zeros(3), float(i % 2)], (STEPS, 1))
        np.savez_compressed(
            directory / f"episode_{i:05d}.npz",
            images=rng.integers(0, 256, (STEPS, SIZE, SIZE, 3), dtype=np.uint8),
            wrist_images=rng.integers(0, 256, (STEPS, SIZE, SIZE, 3), dtype=np.uint8),
            joint_pos=rng.normal(0, 0.5, (STEPS, 7)).astype(np.float32), gripper=np.full(STEPS, 0.04, np.float32),
            actions=actions.astype(np.float32), near_contact=np.zeros(STEPS, bool),
            instruction=np.array(["pick up the red cube", "pick up the blue cube"][i % 2]), success=np.array(True))
    return directory


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("train_smolvla")
    demos = write_demos(root / "demos")
    vlm = root / "hf"
    assert main(["train-hf", "--data", str(demos), "--out", str(vlm), "--epochs", "1", "--batch-size", "8",
                 "--threads", "1", "--no-progress", *TINY_HF]) == 0
    out = root / "smolvla"
    assert main(["train-smolvla", "--data", str(demos), "--out", str(out), "--vlm-from", str(vlm), "--vlm-layers",
                 "2", "--chunk-size", "4", "--epochs", "12", "--batch-size", "8", "--val-fraction", "0.25",
                 "--threads", "1", "--no-progress"]) == 0
    return demos, vlm, out


def test_the_trained_directory_is_lerobots_layout_and_loads_by_itself(
        trained: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demos, vlm, out = trained
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_cache"))  # nothing from a hub cache
    config = json.loads((out / "config.json").read_text())
    assert config["type"] == "smolvla" and config["vlm_model_name"] == "vlm"
    assert list(config["input_features"]) == ["observation.state", "observation.images.front",
                                              "observation.images.wrist"]
    for name in ("model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json", "vla_spec.json",
                 "loss_curves.png", "training.json", "vlm/config.json", "vlm/tokenizer.json"):
        assert (out / name).is_file(), name
    policy = load_lerobot(out)
    episode = np.load(demos / "episode_00000.npz")
    chunk = policy.predict_chunk([episode["images"][0], episode["wrist_images"][0]],
                                 np.r_[episode["joint_pos"][0], episode["gripper"][0]], "pick up the red cube",
                                 noise=np.zeros((4, 32), np.float32))
    assert chunk.actions.shape == (4, 7) and np.all(np.isfinite(chunk.actions))
    # the vision tower is the VLA's, frozen: the same weights
    from safetensors import safe_open

    with safe_open(str(vlm / "model.safetensors"), framework="pt") as handle:
        name = next(k for k in handle.keys() if k.endswith("embeddings.patch_embedding.weight"))
        tower = handle.get_tensor(name).to(torch.float32)
    assert torch.equal(policy.model.vlm.vision_model.embeddings.patch_embedding.weight.to(torch.float32), tower)


def test_training_lowers_the_held_out_flow_loss(trained: tuple[Path, Path, Path]) -> None:
    record = json.loads((trained[2] / "training.json").read_text())
    losses = [epoch["val_flow_loss"] for epoch in record["epochs"]]
    assert len(losses) == 12 and losses[-1] < 0.8 * losses[0]


@pytest.fixture(scope="module")
def batch(trained: tuple[Path, Path, Path]):  # type: ignore[no-untyped-def]
    demos, _, out = trained
    policy = load_lerobot(out)
    data = load_demos(demos, 64, progress=False)
    return policy, DemoInputs(policy, data, episode_instructions(demos, data)), torch.arange(len(data))


@pytest.mark.parametrize("method", ["distilled", "two_anchor"])
def test_a_fresh_student_is_two_euler_steps_and_fitting_moves_it_to_the_teacher(batch, method: str) -> None:  # type: ignore[no-untyped-def]
    policy, demos, idx = batch
    student = FlowStudent.fresh(method, policy.model)
    sample, teacher, euler2 = student_gap(policy, student, demos, idx, torch.Generator().manual_seed(0))
    torch.testing.assert_close(sample, euler2, rtol=0, atol=1e-6)
    params = student.parameters()
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params, lr=3e-3)
    gaps = []
    for _ in range(30):
        sample, teacher, _ = student_gap(policy, student, demos, idx, torch.Generator().manual_seed(0))
        loss = torch.nn.functional.mse_loss(sample, teacher)
        gaps.append(float(loss.detach()))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert gaps[-1] < 0.5 * gaps[0]


def test_train_flow_writes_a_student_that_flow2_samples(trained: tuple[Path, Path, Path], tmp_path: Path) -> None:
    demos, _, out = trained
    fitted = tmp_path / "fitted"
    assert main(["train-flow", "--checkpoint", str(out), "--data", str(demos), "--out", str(fitted),
                 "--method", "two_anchor", "--distill-epochs", "3", "--batch-size", "8", "--lr", "3e-3",
                 "--threads", "1", "--no-progress"]) == 0
    meta = json.loads((fitted / STUDENT_META).read_text())
    assert meta["method"] == "two_anchor" and meta["steps"] == 2
    assert set(meta["metrics"]) >= {"student_vs_teacher", "euler2_vs_teacher", "student_vs_demo"}
    policy, plain = load_lerobot(fitted), load_lerobot(out)
    assert policy.student is not None and plain.student is None
    episode = np.load(demos / "episode_00001.npz")
    obs = Observation(image=episode["images"][0], joint_pos=episode["joint_pos"][0], gripper=0.04,
                      instruction="pick up the blue cube", extra_images=(episode["wrist_images"][0],))
    noise = torch.randn(policy.noise_shape(), generator=torch.Generator().manual_seed(1))
    prefix = policy.prefill(obs)
    with torch.inference_mode():
        expected = policy.student.sample(
            lambda x, t, m: policy.velocity(prefix.cache.kv, prefix.cache.inputs, x, t, m), noise[None])[0]
    chunk = policy.sample_chunk(prefix, noise, 2, student=True)
    np.testing.assert_allclose(chunk, policy.statistics.action.unnormalise(expected[:, :7]).numpy(), atol=1e-6)
    euler = policy.sample_chunk(prefix, noise, 2)
    assert not np.allclose(chunk, euler)  # the adapter moved away from plain Euler
    assert Flow2Decoder.student and not FlowDecoder.student  # flow2 asks for it, flow10 does not


def test_train_flow_continues_a_kept_student_and_refuses_another_method(
        trained: tuple[Path, Path, Path], tmp_path: Path) -> None:
    demos, _, out = trained
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--checkpoint", str(out), "--data", str(demos), "--method", "two_anchor", "--distill-epochs", "2",
              "--batch-size", "8", "--lr", "3e-3", "--threads", "1", "--no-progress"]
    assert main(["train-flow", *common, "--out", str(first)]) == 0
    assert main(["train-flow", *common, "--out", str(second), "--student-from", str(first)]) == 0
    policy = load_lerobot(out)
    kept, continued = load_student(first, policy.model), load_student(second, policy.model)
    assert kept is not None and continued is not None
    # Same seed, data and schedule: a second run from 2 Euler steps would write the first student again.
    moved = max(float((t - kept.state_dict()[n]).abs().max()) for n, t in continued.state_dict().items())
    assert moved > 0
    assert json.loads((second / STUDENT_META).read_text())["recipe"]["student_from"] == str(first)
    with pytest.raises(ValueError, match="its student is two_anchor, not --method distilled"):
        train_flow(FlowTrainConfig(checkpoint=str(out), data=str(demos), out=str(tmp_path / "x"), method="distilled",
                                   student_from=str(first), distill_epochs=1, threads=1, progress=False))
    with pytest.raises(ValueError, match="no flow_student.json there"):
        train_flow(FlowTrainConfig(checkpoint=str(out), data=str(demos), out=str(tmp_path / "y"), method="two_anchor",
                                   student_from=str(out), distill_epochs=1, threads=1, progress=False))


def test_the_runner_reuses_unchanged_image_tokens_of_a_smolvla(trained: tuple[Path, Path, Path]) -> None:
    """``vision_reuse`` on a SmolVLA: the first frame is a full prefix; the same frame again
    recomputes no image token, and its chunk is the full prefix's (same noise)."""
    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.decoding import make_decoder
    from vla_accel_ros.models.configuration import VisionReuseConfig
    from vla_accel_ros.runtime.runner import PolicyRunner

    demos, _, out = trained
    policy = load_lerobot(out)
    assert policy.capabilities().incremental_prefill
    episode = np.load(demos / "episode_00000.npz")
    kin = ArmKinematics(default_urdf())

    def chunks(vision: VisionReuseConfig | None) -> tuple[list[np.ndarray], PolicyRunner]:
        runner = PolicyRunner(policy, make_decoder("flow10", seed=5), kin, action_dt_s=0.05, period_s=1.0,
                              vision=vision)
        obs = Observation(image=episode["images"][0], joint_pos=episode["joint_pos"][0], gripper=0.04,
                          instruction="pick up the red cube", extra_images=(episode["wrist_images"][0],))
        return [runner(obs).chunk for _ in range(2)], runner

    full, _ = chunks(None)
    reused, runner = chunks(VisionReuseConfig(threshold=8.0))
    assert runner.vision is not None and runner.vision.last is not None
    assert runner.vision.last.recomputed == 0 and not runner.vision.last.refreshed
    for a, b in zip(full, reused, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_eval_and_bench_run_the_policy_with_both_cameras(trained: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The tools take the two-camera policy: eval and bench render the wrist camera for its second
    slot, and bench measures against its own 10-step sampler (no action tokens, so no ar)."""
    from vla_accel_ros.decoding.specs import spec_of

    out = trained[2]
    assert main(["eval", "--checkpoint", str(out), "--decoder", "flow2", "--episodes", "1", "--max-steps", "3",
                 "--out", str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["episodes"] == 1
    assert main(["bench", "--checkpoint", str(out), "--decoders", "flow2", "--no-sweep", "--episodes", "1",
                 "--max-steps", "3", "--out", str(tmp_path / "bench")]) == 0
    rows = json.loads((tmp_path / "bench" / "summary.json").read_text())
    assert list(rows) == ["flow10", "flow2"] and rows["flow10"]["speedup_vs_ar"] == 1.0
    why = spec_of("ar").refusal(load_lerobot(out).capabilities())
    assert "no action tokens" in why and "flow10" in why


def test_init_starts_from_a_policy_of_the_same_shape_and_refuses_another(
        trained: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demos, vlm, out = trained
    args = ["train-smolvla", "--data", str(demos), "--vlm-from", str(vlm), "--chunk-size", "4", "--epochs", "1",
            "--batch-size", "8", "--val-fraction", "0.25", "--threads", "1", "--no-progress", "--init", str(out)]
    assert main([*args, "--out", str(tmp_path / "other"), "--vlm-layers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "num_vlm_layers" in err and "config.json" in err and len(err.splitlines()) == 1
    assert main([*args, "--out", str(tmp_path / "more"), "--vlm-layers", "2", "--lr", "1e-9"]) == 0
    before, after = load_lerobot(out), load_lerobot(tmp_path / "more")
    for (name, x), y in zip(before.model.state_dict().items(), after.model.state_dict().values(), strict=True):
        torch.testing.assert_close(x.float(), y.float(), rtol=0, atol=1e-5, msg=name)  # a vanishing step
    torch.testing.assert_close(before.statistics.action.stats["mean"], after.statistics.action.stats["mean"])


def test_the_training_aids_shape_what_the_expert_reads(trained: tuple[Path, Path, Path]) -> None:
    """The probe and the keypoint head read the last VLM layer's input, the states behind its keys
    and values: their gradient reaches the connector, and none reaches the last layer's MLP, whose
    output no flow step reads."""
    from vla_accel_ros.training.smolvla import FlowBatches, TrainingAids, moments, prefix_of

    demos, _, out = trained
    policy = load_lerobot(out, dtype="float32")
    model = policy.model.requires_grad_(True)
    data = load_demos(demos, 64, progress=False)
    stats = {"observation.state": moments(data.proprio), "action": moments(data.actions)}
    settings = {"max_length": 16, "truncation": True, "padding": "max_length", "padding_side": "right"}
    batches = FlowBatches(model, data, episode_instructions(demos, data), policy.tokenizer, settings, stats, 4, False)
    batches.aux = torch.rand(batches.aux.shape)  # these demos record no scene: any finite targets
    batches.keypoints = torch.rand(batches.keypoints.shape) * 2 - 1
    width = model.vlm.text_model.config.hidden_size
    aids = TrainingAids(width, batches.aux.shape[1], 2, math.isqrt(batches.front_tokens), 1.0, 1.0)
    idx = torch.arange(4)
    model.zero_grad(set_to_none=True)
    aids.loss(prefix_of(model, batches, idx), batches, idx).backward()
    assert model.vlm.connector.modality_projection.proj.weight.grad.abs().sum() > 0
    assert model.vlm.text_model.layers[-1].mlp.down_proj.weight.grad is None


def test_demos_record_the_expert_where_the_smolvla_drives(trained: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """DAgger data for a flow policy: ``demos --policy DIR`` lets the chunk's first action drive and
    records the expert's labels."""
    out = trained[2]
    folder = tmp_path / "dagger"
    assert main(["demos", "--episodes", "1", "--seed", "5", "--max-steps", "4", "--image-size", str(SIZE), "--wrist",
                 "--policy", str(out), "--policy-share", "1.0", "--out", str(folder)]) == 0
    episode = np.load(folder / "episode_00000.npz")
    assert bool(episode["policy_in_loop"]) and episode["wrist_images"].shape[1:] == (SIZE, SIZE, 3)
    assert episode["actions"].shape == (4, 7) and np.all(np.isfinite(episode["actions"]))


def test_the_prefix_starts_as_the_vla_saw_its_inputs(trained: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """SmolVLA scales language embeddings by sqrt(width): the table is the VLA's divided by it. With
    scale factor 1 the connector is the least-squares fit of the VLA's projector."""
    from safetensors import safe_open

    from vla_accel_ros.training.configs import SmolVLATrainConfig
    from vla_accel_ros.training.smolvla import build_model, fit_connector, policy_config

    demos, vlm, _ = trained
    cfg = SmolVLATrainConfig(data=str(demos), out=str(tmp_path), vlm_from=str(vlm), vlm_layers=2, scale_factor=1,
                             chunk_size=4)
    data = load_demos(demos, 64, progress=False)
    model, _ = build_model(cfg, tmp_path, policy_config(cfg, data.image_size, 8, 7))
    with safe_open(str(vlm / "model.safetensors"), framework="pt") as handle:
        name = next(k for k in handle.keys() if k.endswith("embed_tokens.weight"))
        table = handle.get_tensor(name).to(torch.float32)
    width = table.shape[1]
    torch.testing.assert_close(model.vlm.text_model.get_input_embeddings().weight * math.sqrt(width), table)
    before = model.vlm.connector.modality_projection.proj.weight.clone()
    residual = fit_connector(model, vlm, data.images)
    assert residual < 0.5 and not torch.equal(before, model.vlm.connector.modality_projection.proj.weight)


def test_a_pi05s_prompts_carry_each_steps_state_and_its_student_trains_the_time_mlp(tmp_path: Path) -> None:
    """π0.5 (a random-weight directory of the package arm's widths, its tokenizer in the folder its
    preprocessor names): every demo step gets its own prompt, the one the policy makes for that
    observation; the distilled copy trains the time MLP and no state projection, starts as 2 Euler
    steps, and ``train-flow`` keeps it where ``flow2`` finds it; ``eval`` runs the directory."""
    import runpy
    import shutil

    from vla_accel_ros.models.lerobot.student import flow_step_names

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
    directory = runpy.run_path(str(fixtures / "layout.py"))["write_pi05_dir"](tmp_path / "pi05")
    shutil.copytree(fixtures / "tokenizers" / "paligemma", directory / "google" / "paligemma-3b-pt-224")
    demos = write_demos(tmp_path / "demos")
    policy = load_lerobot(directory)
    data = load_demos(demos, 64, progress=False)
    instructions = episode_instructions(demos, data)
    inputs = DemoInputs(policy, data, instructions)
    first = torch.nonzero(data.episode == 0).squeeze(1)
    assert len(torch.unique(inputs.lang_ids[first], dim=0)) > 1  # one episode, prompts of several states
    step = int(first[3])
    own = policy.inputs([data.images[step].numpy()], data.proprio[step].numpy(), instructions[0])
    assert torch.equal(own.lang_tokens[0], inputs.lang_ids[step])
    assert torch.equal(own.lang_masks[0], inputs.lang_masks[step])
    student = FlowStudent.fresh("distilled", policy.model)
    names = flow_step_names(student.model)
    assert "time_mlp_in.weight" in names and "expert.norm.dense.weight" in names
    assert not any(n.startswith(("state_proj.", "action_time_mlp_")) for n in names)
    sample, _, euler2 = student_gap(policy, student, inputs, torch.arange(8), torch.Generator().manual_seed(0))
    torch.testing.assert_close(sample, euler2, rtol=0, atol=1e-6)
    fitted = tmp_path / "fitted"
    assert main(["train-flow", "--checkpoint", str(directory), "--data", str(demos), "--out", str(fitted),
                 "--method", "distilled", "--distill-epochs", "1", "--batch-size", "8", "--lr", "3e-3",
                 "--threads", "1", "--no-progress"]) == 0
    kept = load_lerobot(fitted).student
    assert kept is not None and kept.method == "distilled" and "time_mlp_out.weight" in kept.state_dict()
    assert main(["eval", "--checkpoint", str(fitted), "--decoder", "flow2", "--episodes", "1", "--max-steps", "3",
                 "--out", str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["episodes"] == 1
