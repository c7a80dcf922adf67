"""Behaviour kept across refactors: data recorded by an earlier version of the package, reproduced exactly.

``test/fixtures/pre_renovation/`` holds (see its README):

- two deterministic bags of the shipped policy in the sim (``kerv``; ``world_aware`` with the checked
  Kalman fill), each replayed here with the check of ``vla-accel replay --check``: every command the
  recorded one (to float round-off: another CPU's vector kernels round differently in the last bit);
- ``tokens.json``: the action tokens of the first steps of one seeded episode for every decoder and
  decoder setting below, on the shipped policy and on ``checkpoints/hf_small``, regenerated only when
  a change of behaviour is intended (``python test/system/test_recorded_behaviour.py``);
- ``tokens_by_platform.json``: the same, recorded on other platforms (the CPU's vector extension as
  torch dispatches it, and the MuJoCo version: :func:`platform`), by the same version of the package
  (``python test/system/test_recorded_behaviour.py --this-platform``).

On a platform with a recording of its own, every token must match it exactly. Elsewhere the test
judges against ``tokens.json`` and says so: round-off in the last bit can tip a token that sits at a
bin boundary (or a near tie of two logits), and the closed loop carries that on, so up to
``TOKENS_TIPPED`` of an episode's tokens may differ; a change of behaviour changes far more.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "test" / "fixtures" / "pre_renovation"
TOKENS = FIXTURES / "tokens.json"
PLATFORM_TOKENS = FIXTURES / "tokens_by_platform.json"
HF_SMALL = f"hf:{ROOT / 'checkpoints' / 'hf_small'}"
SEED = 100000
STEPS = 12
TOKENS_TIPPED = 4  # of STEPS x 7 tokens, differing by round-off on another CPU (module docstring)
COMMAND_ROUND_OFF = 1e-9  # rad: a replayed command against the recorded one
# name -> (checkpoint ("" = the shipped policy), decoder, runner settings, vision settings or None)
CASES: dict[str, tuple[str, str, dict[str, Any], dict[str, Any] | None]] = {
    "ar": ("", "ar", {}, None),
    "ar@T=0": ("", "ar", {"temperature": 0.0}, None),
    "sd": ("", "sd", {}, None),
    "kerv_released": ("", "kerv_released", {}, None),
    "kerv": ("", "kerv", {}, None),
    "kerv@T=0": ("", "kerv", {"temperature": 0.0}, None),
    "world_aware": ("", "world_aware", {}, None),
    "deadline": ("", "deadline", {}, None),
    "heisd": ("", "heisd", {}, None),
    "flow10": ("", "flow10", {}, None),
    "flow2": ("", "flow2", {}, None),
    "kerv@fill_check": ("", "kerv", {"kf_fill_check": True}, None),
    "world_aware@fill_check": ("", "world_aware", {"kf_fill_check": True, "kinematic_r_bounds": (3, 10)}, None),
    "ar+iv": ("", "ar", {}, {"reuse_kv": False}),
    "kerv+ivkv": ("", "kerv", {}, {"reuse_kv": True}),
    "world_aware+ivkv": ("", "world_aware", {}, {"reuse_kv": True}),
    "hf:ar": (HF_SMALL, "ar", {}, None),
    "hf:sd": (HF_SMALL, "sd", {}, None),
    "hf:kerv": (HF_SMALL, "kerv", {}, None),
    "hf:world_aware@fill_check": (HF_SMALL, "world_aware", {"kf_fill_check": True, "kinematic_r_bounds": (2, 6)}, None),
    "hf:deadline": (HF_SMALL, "deadline", {}, None),
    "hf:ar+ivkv": (HF_SMALL, "ar", {}, {"reuse_kv": True, "reuse_tower": True, "feature_threshold": 0.05}),
    "hf:kerv+ivkv": (HF_SMALL, "kerv", {}, {"reuse_kv": True}),
    "hf:ar+ivkv@pixels": (HF_SMALL, "ar", {}, {"reuse_kv": True, "feature_threshold": 0.0}),
}


def frozen_clock() -> float:
    """Time does not pass: no decoder ever runs out of it, so every run decodes alike."""
    return 0.0


def episode_tokens(name: str, steps: int = STEPS) -> list[list[int]]:
    """The tokens of the first ``steps`` steps of episode ``SEED`` for case ``name``."""
    import torch

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.models.configuration import VisionReuseConfig
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig

    torch.set_num_threads(1)
    checkpoint, decoder, settings, vision = CASES[name]
    config = RunnerConfig(checkpoint=checkpoint, decoder=decoder, max_steps=120,
                          vision=None if vision is None else VisionReuseConfig(**vision), **settings)
    runner = build_runner(config, ArmKinematics(default_urdf()), clock=frozen_clock)
    tokens = []
    with PickCubeEnv(SimConfig(image_size=runner.image_size, max_steps=120)) as env:
        obs = env.reset(SEED)
        runner.start_episode(SEED)
        while not env.done and len(tokens) < steps:
            result = runner(obs, target_clearance=env.target_clearance())
            tokens.append([int(t) for t in np.asarray(result.tokens).reshape(-1)])
            obs, _ = env.step(result.action)
    return tokens


FLEET = ("ar", "kerv", "world_aware@fill_check", "heisd")  # one robot each, on one shipped policy, episodes SEED + i


def fleet_tokens(steps: int = 8) -> dict[str, list[list[int]]]:
    """The tokens of the first ``steps`` steps of robots decoding together (``FleetRunner``): robot i
    runs the decoder ``FLEET[i]`` on episode ``SEED + i``."""
    import torch

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.models.load import load_policy
    from vla_accel_ros.runtime.builder import RunnerConfig, build_runner
    from vla_accel_ros.runtime.fleet import FleetRunner
    from vla_accel_ros.sim.env import PickCubeEnv, SimConfig

    torch.set_num_threads(1)
    kin = ArmKinematics(default_urdf())
    policy = load_policy(str(ROOT / "checkpoints" / "default"))
    runners = []
    for name in FLEET:
        _, decoder, settings, _ = CASES[name]
        runners.append(build_runner(RunnerConfig(decoder=decoder, max_steps=120, **settings), kin, policy=policy,
                                    clock=frozen_clock))
    for runner in runners:  # heisd's store
        if runner.decoder.capabilities().retrieval_store:
            runner.decoder.attach_checkpoint_store(ROOT / "checkpoints" / "default", policy)
    fleet = FleetRunner(runners)
    envs = [PickCubeEnv(SimConfig(image_size=runners[0].image_size, max_steps=120)) for _ in FLEET]
    observations = [env.reset(SEED + i) for i, env in enumerate(envs)]
    for i, runner in enumerate(runners):
        runner.start_episode(SEED + i)
    tokens: dict[str, list[list[int]]] = {name: [] for name in FLEET}
    for _ in range(steps):
        results = fleet.step(list(enumerate(observations)))
        for i, (name, env, result) in enumerate(zip(FLEET, envs, results)):
            tokens[name].append([int(t) for t in np.asarray(result.tokens).reshape(-1)])
            observations[i], _ = env.step(result.action)
    for env in envs:
        env.close()
    return tokens


def platform() -> str:
    """What decides the last bit of a run: the CPU's vector extension as torch dispatches it, and the
    MuJoCo version (whose contact dynamics give the clearance the world-aware decoders read)."""
    import mujoco
    import torch

    return f"{torch.backends.cpu.get_cpu_capability()} mujoco {mujoco.__version__}"


def recorded_tokens(name: str) -> tuple[Any, int, str]:
    """The recorded tokens of case ``name`` (or "fleet"), how many may differ, and the rule applied."""
    here = platform()
    own = json.loads(PLATFORM_TOKENS.read_text()).get(here, {}) if PLATFORM_TOKENS.exists() else {}
    if name in own:
        return own[name], 0, f"recorded on this platform ({here}): every token exactly"
    return (json.loads(TOKENS.read_text())[name], TOKENS_TIPPED,
            f"no recording for this platform ({here}) in {PLATFORM_TOKENS.name}: up to {TOKENS_TIPPED} tokens "
            "of tokens.json may tip by round-off")


def tipped(tokens: Any, recorded: Any) -> int:
    """How many tokens differ from the recorded ones (the shapes must agree)."""
    got, want = np.asarray(tokens), np.asarray(recorded)
    assert got.shape == want.shape
    return int(np.count_nonzero(got != want))


def test_fleet_tokens_unchanged() -> None:
    recorded, allowed, rule = recorded_tokens("fleet")
    tokens = fleet_tokens()
    assert tokens.keys() == recorded.keys()
    for name in recorded:
        assert tipped(tokens[name], recorded[name]) <= allowed, f"{name}: {rule}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_decoder_tokens_unchanged(name: str) -> None:
    recorded, allowed, rule = recorded_tokens(name)
    assert tipped(episode_tokens(name), recorded) <= allowed, rule


@pytest.mark.parametrize("bag", ["kerv", "world_aware_fill_check"])
def test_recorded_bag_replays_identical(bag: str, tmp_path: Path) -> None:
    pytest.importorskip("rclpy")
    from vla_accel_ros.rosbag.replayer import ReplayOptions, replay

    summary = replay(ReplayOptions(bag=str(FIXTURES / bag), out=str(tmp_path / "replayed"), mode="deterministic"),
                     progress=False)
    assert summary["max_abs_diff"] <= COMMAND_ROUND_OFF, summary
    assert summary["matched"] == summary["recorded_commands"] == 20


if __name__ == "__main__":  # regenerate the recordings (only when a change of behaviour is intended)
    this_platform = "--this-platform" in sys.argv[1:]
    names = [a for a in sys.argv[1:] if a != "--this-platform"] or [*sorted(CASES), "fleet"]
    target = PLATFORM_TOKENS if this_platform else TOKENS
    stored = json.loads(target.read_text()) if target.exists() else {}
    data = stored.setdefault(platform(), {}) if this_platform else stored
    for case in names:
        data[case] = fleet_tokens() if case == "fleet" else episode_tokens(case)
        print(case, data[case] if case == "fleet" else data[case][:2])
    if this_platform:
        stored = {key: dict(sorted(value.items())) for key, value in sorted(stored.items())}
    target.write_text(json.dumps(dict(sorted(stored.items())), separators=(",", ":")) + "\n")
