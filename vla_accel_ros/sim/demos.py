"""Scripted-expert demonstrations and their on-disk format (``vla-accel demos``).

On-disk format (one directory):

- ``episode_00000.npz`` … (``numpy.savez_compressed``; load with ``allow_pickle=False``), holding
  ``images`` uint8 (T, H, W, 3) RGB from the front camera (and, recorded with ``--wrist``,
  ``wrist_images`` of the same shape from the wrist camera); ``joint_pos`` float32 (T, 7) in the arm's
  joint order; ``gripper`` float32 (T,) one finger's opening in m; ``actions`` float32 (T, 7), the
  expert's action taken at step t (OpenVLA convention); ``near_contact`` bool (T,) and
  ``target_clearance`` float32 (T,) (gripper-to-target distance at the observation); ``tcp_pos``
  and ``target_pos`` float32 (T, 3) (TCP and target-cube positions, the privileged labels of the
  policy's auxiliary loss); and 0-d ``instruction`` (str), ``color`` (str), ``success`` (bool), ``seed`` (int),
  ``policy_in_loop`` (bool: a policy drove some steps, the labels are still the expert's).
- ``summary.json``: ``episodes``, ``success_rate``, ``seed``, ``image_size``, ``control_hz``,
  ``max_steps``, ``steps_total``, ``failed_seeds``.

Episode ``i`` uses seed ``seed + i``. Training demos use seeds below 100000; evaluation uses seeds
from 100000 up, so evaluation scenes are never training scenes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
from vla_accel_ros.sim.expert import run_expert_episode


def record_demos(
    out: Path,
    episodes: int,
    seed: int,
    config: SimConfig,
    only_successes: bool = False,
    progress: bool = True,
    action_noise: float = 0.0,
    policy_action: Callable[[Observation], np.ndarray] | None = None,
    policy_share: float = 0.0,
) -> dict:
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    out.mkdir(parents=True, exist_ok=True)
    successes, steps_total, failed = 0, 0, []
    start = time.perf_counter()
    with PickCubeEnv(config) as env:
        bar = progress_bar(range(episodes), desc="demos", unit="ep", disable=not progress)
        for i in bar:
            episode_seed = seed + i
            result = run_expert_episode(
                env, episode_seed, record=True, action_noise=action_noise,
                policy_action=policy_action, policy_share=policy_share,
            )
            successes += int(result["success"])
            steps_total += result["steps"]
            if not result["success"]:
                failed.append(episode_seed)
            bar.success(successes, i + 1)
            if only_successes and not result["success"]:
                continue
            wrist = {"wrist_images": np.stack(result["wrist_images"])} if "wrist_images" in result else {}
            np.savez_compressed(
                out / f"episode_{i:05d}.npz",
                images=np.stack(result["images"]),
                **wrist,
                joint_pos=np.stack(result["joint_pos"]),
                gripper=np.asarray(result["gripper"], np.float32),
                actions=np.stack(result["actions"]).astype(np.float32),
                near_contact=np.asarray(result["near_contact"], bool),
                target_clearance=np.asarray(result["target_clearance"], np.float32),
                tcp_pos=np.stack(result["tcp_pos"]).astype(np.float32),
                target_pos=np.stack(result["target_pos"]).astype(np.float32),
                instruction=np.array(result["instruction"]),
                color=np.array(result["color"]),
                success=np.array(bool(result["success"])),
                seed=np.array(episode_seed, np.int64),
                policy_in_loop=np.array(bool(result["policy_in_loop"])),
            )
    summary = {
        "episodes": episodes,
        "success_rate": successes / episodes,
        "seed": seed,
        "image_size": config.image_size,
        "cameras": 2 if config.wrist_image else 1,
        "control_hz": config.control_hz,
        "max_steps": config.max_steps,
        "steps_total": steps_total,
        "failed_seeds": failed,
        "action_noise": action_noise,
        "policy_share": policy_share,
        "wall_s": round(time.perf_counter() - start, 2),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def greedy_policy_action(checkpoint: str) -> Callable[[Observation], np.ndarray]:
    """The checkpoint's action for one observation, as the DAgger driver: the greedy (AR) action of
    a token policy; the first action of a LeRobot flow policy's 10-step chunk (seeded noise)."""
    from vla_accel_ros.core.resources import default_checkpoint
    from vla_accel_ros.models.load import recognise

    if checkpoint != "default" and "flow_chunks" in recognise(checkpoint).capabilities:
        import torch

        from vla_accel_ros.models.lerobot.checkpoint import load_lerobot

        flow = load_lerobot(checkpoint)
        generator = torch.Generator().manual_seed(0)

        def first_of_chunk(obs: Observation) -> np.ndarray:
            state = np.r_[obs.joint_pos, obs.gripper]
            return flow.predict_chunk([obs.image, *obs.extra_images], state, obs.instruction,
                                      generator=generator).actions[0]

        return first_of_chunk
    from vla_accel_ros.models.own.checkpoint import load_checkpoint  # torch only when a policy drives

    policy = load_checkpoint(default_checkpoint() if checkpoint == "default" else checkpoint)

    def act(obs: Observation) -> np.ndarray:
        return policy.tokens_to_action(policy.greedy_decode(policy.prefill(obs))[0].numpy())

    return act


