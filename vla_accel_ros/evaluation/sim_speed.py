"""Sim throughput in control steps per second, with and without rendering (``vla-accel sim-speed``).

Each run resets to a seed and steps the scripted expert; the figure is the median over ``--runs``.
"""

from __future__ import annotations

import time

from vla_accel_ros.sim.env import PickCubeEnv, SimConfig
from vla_accel_ros.sim.expert import ScriptedExpert


def steps_per_second(render: bool, steps: int, image_size: int, seed: int) -> float:
    with PickCubeEnv(SimConfig(render=render, image_size=image_size)) as env:
        expert = ScriptedExpert(env)
        obs = env.reset(seed)
        done_steps = 0
        start = time.perf_counter()
        while done_steps < steps:
            if env.done:
                obs = env.reset(seed + done_steps)
                expert.reset()
            obs, _ = env.step(expert.act(obs))
            done_steps += 1
        return steps / (time.perf_counter() - start)


