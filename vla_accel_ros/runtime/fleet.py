"""Several robots on one policy: their steps decoded together, one batched pass per round.

A :class:`FleetRunner` holds one :class:`~vla_accel_ros.runtime.runner.PolicyRunner` per robot over
one shared :class:`~vla_accel_ros.models.policy.Policy`, so every robot keeps its own Kalman
filter, token history, sampling noise and decoder state. :meth:`FleetRunner.step` takes one
observation of each robot (of any subset) and:

- asks each decoder for the proposal it would verify inside the prefill (``verifies_in_prefill``:
  ``world_aware`` in free space);
- runs ONE batched prefill for all of them, with each proposal riding along with its robot's
  prefix (a robot without one gets placeholder tokens, whose rows it never reads);
- lets each decoder finish: with a proposal, ``decode_scored`` on its rows (no pass of its own);
  without, ``decode`` on its row of the prefix alone (the prefill's rows before the tokens);
- serves a decoder that skips steps (``heisd``) or a policy without batched passes (a Hugging
  Face VLA) one robot at a time, as a single runner would.

Batching changes what a step costs, never what it computes: each robot's rows see only its own
prefix (the batch dimension is independent), so its tokens are those its own runner would give.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding.protocol import N_ACTION_TOKENS, DecodeResult
from vla_accel_ros.models.policy import Policy, ScoreOutput
from vla_accel_ros.runtime.runner import PolicyRunner, run_policy_step


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
        self.batched = isinstance(policy, Policy)  # the package's VLA has batched passes

    def step(self, observations: Sequence[tuple[int, Observation]]) -> list[DecodeResult]:
        """One observation of each listed robot (index into ``runners``) -> their results, in order."""
        results: dict[int, DecodeResult] = {}
        contexts = {i: self.runners[i].begin(obs) for i, obs in observations}
        together: list[tuple[int, Observation]] = []
        for i, obs in observations:
            runner = self.runners[i]
            if not self.batched or runner.decoder.capabilities().skips_steps:
                results[i] = run_policy_step(self.policy, obs, runner.decoder, contexts[i])
            else:
                together.append((i, obs))
        if together:
            results.update(self._batched(together, contexts))
        return [self.runners[i].end(results[i]) for i, _ in observations]

    def _batched(self, batch: list[tuple[int, Observation]], contexts: dict) -> dict[int, DecodeResult]:
        policy: Policy = self.policy  # type: ignore[assignment]
        out: dict[int, DecodeResult] = {}
        clock = time.perf_counter
        with torch.inference_mode():
            started = clock()
            proposals = {}
            for i, _ in batch:
                decoder = self.runners[i].decoder
                if decoder.capabilities().verifies_in_prefill:
                    proposal = decoder.prefill_proposal(policy, contexts[i])
                    if proposal is not None:
                        proposals[i] = proposal
            proposed_at = clock()
            placeholder = [0] * (N_ACTION_TOKENS - 1)  # rows no decoder reads: the prefix's come first
            feed = torch.tensor([proposals[i][: N_ACTION_TOKENS - 1].tolist() if i in proposals else placeholder
                                 for i, _ in batch], dtype=torch.long)
            t0 = clock()
            output = policy.prefill_batch_scored(*self._tensors([obs for _, obs in batch]), feed)
            prefill_ms = (clock() - t0) * 1e3
            for row, (i, _) in enumerate(batch):
                decoder, prefix = self.runners[i].decoder, output.prefix.select(row)
                if i in proposals:
                    result = decoder.decode_scored(policy, ScoreOutput(output.logits[row : row + 1], prefix),
                                                   proposals[i], contexts[i])
                    out[i] = self._timed(result, prefill_ms, (proposed_at - started) * 1e3, started)
                else:  # the prefix alone: the prefill's rows up to its end, as a plain prefill gives them
                    result = decoder.decode(policy, prefix.truncate(0), contexts[i])
                    out[i] = self._timed(result, prefill_ms, 0.0, started)
        return out

    def _tensors(self, observations: list[Observation]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        parts = [self.policy.observation_tensors(obs) for obs in observations]
        return tuple(torch.cat([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]

    @staticmethod
    def _timed(result: DecodeResult, prefill_ms: float, proposal_ms: float, started: float) -> DecodeResult:
        """The result with the round's timings: the shared prefill, its own decoding, the round so far."""
        decode_ms = result.timings["decode"] + proposal_ms
        total_ms = (time.perf_counter() - started) * 1e3
        return replace(result, timings=dict(result.timings, prefill=prefill_ms, decode=decode_ms, total=total_ms))
