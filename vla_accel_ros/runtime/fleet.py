"""Several robots on one policy: their steps decoded together, their passes batched.

A :class:`FleetRunner` holds one :class:`~vla_accel_ros.runtime.runner.PolicyRunner` per robot over
one shared policy, so every robot keeps its own Kalman filter, token history, sampling noise and
decoder state. :meth:`FleetRunner.step` takes one observation of each robot (of any subset), does
each robot's bookkeeping before and after, and between them runs the robots' steps with
:func:`~vla_accel_ros.runtime.steps.run_steps`, the driver a single runner uses with a batch of one:

- ONE batched prefill for all of them, each robot's proposal riding along with its prefix (the
  proposals ``world_aware`` verifies inside the prefill in free space; placeholders for a robot
  without one, whose rows it never reads), and one contact-head call for the round's rows;
- ONE batched ``score`` for the passes right after it with the same shape (the verify passes of
  ``kerv``, ``world_aware`` near contact and at an episode's first step, and the first round of
  the speculative decoders), whose time is each such robot's;
- every later pass, each robot's own; a step served without the model (``heisd``'s verify-skip)
  takes no part; a policy without batched passes (a Hugging Face VLA) serves the robots one at a
  time, as a single runner would.

Batching changes what a step costs, never what it computes: each robot's rows see only its own
prefix (the batch dimension is independent) and its own sampling noise (drawn per robot, episode
and step), so its tokens are those its own runner would give.
:attr:`FleetRunner.last_stages` times the latest round's stages (:data:`STAGES`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding.protocol import DecodeResult
from vla_accel_ros.runtime.runner import PolicyRunner
from vla_accel_ros.runtime.steps import DRIVER_STAGES, RobotStep, run_steps

# A round's stages: each robot's bookkeeping before the model (``begin``: its filter and decode
# context), the driver's (:data:`~vla_accel_ros.runtime.steps.DRIVER_STAGES`), and each robot's
# history (``end``).
STAGES = ("begin", *DRIVER_STAGES, "end")


class FleetRunner:
    """See the module docstring. ``runners``: one per robot, all over the same policy, none with
    incremental vision (its cache is per robot and per pass)."""

    def __init__(self, runners: Sequence[PolicyRunner]) -> None:
        if not runners:
            raise ValueError("a fleet needs at least one runner")
        policy = runners[0].policy
        if any(r.policy is not policy for r in runners):
            raise ValueError("the runners of a fleet must share one policy")
        if any(r.vision is not None for r in runners):
            raise ValueError("a fleet decodes with full vision (incremental vision is per robot)")
        self.runners = list(runners)
        self.policy = policy
        self.last_stages: dict[str, float] = dict.fromkeys(STAGES, 0.0)  # ms, the latest round

    def step(self, observations: Sequence[tuple[int, Observation]]) -> list[DecodeResult]:
        """One observation of each listed robot (index into ``runners``) -> their results, in order."""
        clock = time.perf_counter
        stages = dict.fromkeys(STAGES, 0.0)
        t0 = clock()
        robots = [RobotStep(obs, self.runners[i].decoder, self.runners[i].begin(obs)) for i, obs in observations]
        stages["begin"] = (clock() - t0) * 1e3
        results = run_steps(self.policy, robots, together=True, clock=clock, stages=stages)
        t1 = clock()
        out = [self.runners[i].end(result) for (i, _), result in zip(observations, results, strict=True)]
        stages["end"] = (clock() - t1) * 1e3
        self.last_stages = stages
        return out
