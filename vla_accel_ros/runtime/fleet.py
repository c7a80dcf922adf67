"""Several robots on one policy: their steps decoded together, two batched passes per round.

A :class:`FleetRunner` holds one :class:`~vla_accel_ros.runtime.runner.PolicyRunner` per robot over
one shared :class:`~vla_accel_ros.models.own.policy.Policy`, so every robot keeps its own Kalman
filter, token history, sampling noise and decoder state. :meth:`FleetRunner.step` takes one
observation of each robot (of any subset) and:

- asks each decoder for the proposal it would verify inside the prefill (``verifies_in_prefill``:
  ``world_aware`` in free space);
- runs ONE batched prefill for all of them, with each proposal riding along with its robot's
  prefix (a robot without one gets placeholder tokens, whose rows it never reads); a decoder with
  a proposal then finishes with ``decode_scored`` on its rows (no pass of its own);
- on its row of the prefix alone (the prefill's rows before the tokens), lets each other decoder
  either make its proposal (``split_verify``: ``kerv``; ``world_aware`` near contact and at an
  episode's first step) with ``propose_after_prefill``, its draft head call still its own, or
  ``decode`` with its own draft and verify passes (``ar``, ``sd``, ``deadline``); the contact head
  the decoders read on their rows runs once for the whole batch (:class:`RoundPolicy`);
- verifies all those proposals in ONE batched ``Policy.score`` over their prefix rows, whose time
  is each such robot's verify time, then each robot's ``finish_verified`` reads its own row of it;
- serves a decoder that skips steps (``heisd``) or a policy without batched passes (a Hugging
  Face VLA) one robot at a time, as a single runner would.

Batching changes what a step costs, never what it computes: each robot's rows see only its own
prefix (the batch dimension is independent) and its own sampling noise (drawn per robot, episode
and step), so its tokens are those its own runner would give.
:attr:`FleetRunner.last_stages` times the latest round's stages (:data:`STAGES`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding.protocol import (
    N_ACTION_TOKENS,
    DecodeContext,
    DecoderCapabilities,
    DecodeResult,
    PendingVerify,
)
from vla_accel_ros.models.api import PolicyLike, Prefix, ScoreOutput
from vla_accel_ros.runtime.runner import PolicyRunner, run_policy_step

# A round's stages, in order: each robot's bookkeeping before the model (``begin``: its filter and
# decode context), the proposals for the prefill to verify, the observations into batched tensors,
# the ONE batched prefill (``batched_pass``), the ONE batched verify pass after it
# (``batched_verify``, 0 when no robot needs one), each decoder's own work after the prefill
# (``finish``: proposals and draft heads, finishing, the passes of decoders that verify on their
# own), and each robot's history (``end``). Robots served one at a time count whole under ``alone``.
STAGES = ("begin", "propose", "tensors", "batched_pass", "batched_verify", "finish", "end", "alone")


class RoundPolicy:
    """The fleet's policy as the decoders of one round see it: every call and attribute is the
    policy's, except ``contact_probability`` of this round's row prefixes (those passed through
    :meth:`row`), which the first such call computes for every row of the batch in ONE contact-head
    call (a ``world_aware`` robot asks once a step without the scene: one head call per robot
    otherwise, each costing about what the batched one does)."""

    def __init__(self, policy: PolicyLike, batch: Prefix) -> None:
        self._policy = policy
        self._batch = batch
        self._rows: dict[int, tuple[Prefix, int]] = {}  # id -> (the row prefix, kept alive so its id stays its own; row)
        self._probabilities: list[float] | None = None

    def row(self, prefix: Prefix, index: int) -> Prefix:
        """``prefix`` (batch row ``index`` of the round's prefill, as decoded), recorded as that row."""
        self._rows[id(prefix)] = (prefix, index)
        return prefix

    def contact_probability(self, prefix: Prefix) -> float:
        known = self._rows.get(id(prefix))
        if known is None:
            return self._policy.contact_probability(prefix)
        if self._probabilities is None:
            self._probabilities = torch.sigmoid(self._policy.contact_logits(self._batch)).tolist()
        return self._probabilities[known[1]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


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
        self.batched = policy.capabilities().batched_passes
        self.last_stages: dict[str, float] = dict.fromkeys(STAGES, 0.0)  # ms, the latest round

    def step(self, observations: Sequence[tuple[int, Observation]]) -> list[DecodeResult]:
        """One observation of each listed robot (index into ``runners``) -> their results, in order."""
        clock = time.perf_counter
        stages = dict.fromkeys(STAGES, 0.0)
        t0 = clock()
        contexts = {i: self.runners[i].begin(obs) for i, obs in observations}
        stages["begin"] = (clock() - t0) * 1e3
        results: dict[int, DecodeResult] = {}
        together: list[tuple[int, Observation, DecoderCapabilities]] = []
        for i, obs in observations:
            runner = self.runners[i]
            capabilities = runner.decoder.capabilities()  # once per robot and round: a dataclass each call
            if not self.batched or capabilities.skips_steps:
                t1 = clock()
                results[i] = run_policy_step(self.policy, obs, runner.decoder, contexts[i])
                stages["alone"] += (clock() - t1) * 1e3
            else:
                together.append((i, obs, capabilities))
        if together:
            results.update(self._batched(together, contexts, stages))
        t2 = clock()
        out = [self.runners[i].end(results[i]) for i, _ in observations]
        stages["end"] = (clock() - t2) * 1e3
        self.last_stages = stages
        return out

    def _batched(self, batch: list[tuple[int, Observation, DecoderCapabilities]], contexts: dict[int, DecodeContext],
                 stages: dict[str, float]) -> dict[int, DecodeResult]:
        policy = self.policy
        out: dict[int, DecodeResult] = {}
        clock = time.perf_counter
        with torch.inference_mode():
            started = clock()
            proposals = [self.runners[i].decoder.prefill_proposal(policy, contexts[i])
                         if capabilities.verifies_in_prefill else None for i, _, capabilities in batch]
            proposed_at = clock()
            # The rows of a robot without a proposal hold zeros (placeholders no decoder reads: the
            # prefix's rows come first); the last proposed token is not fed (it would predict an 8th).
            feed = np.zeros((len(batch), N_ACTION_TOKENS - 1), dtype=np.int64)
            for row, proposal in enumerate(proposals):
                if proposal is not None:
                    feed[row] = proposal[: N_ACTION_TOKENS - 1]
            t0 = clock()
            output = policy.prefill_batch([obs for _, obs, _ in batch], torch.from_numpy(feed))
            t1 = clock()
            prefill_ms = (t1 - t0) * 1e3
            shared = RoundPolicy(policy, output.prefix)
            waiting: list[tuple[int, int, PendingVerify]] = []  # (row, robot, its step up to the verify pass)
            for row, ((i, _, capabilities), proposal, (logits, prefix)) in enumerate(
                    zip(batch, proposals, self._rows(output), strict=True)):
                decoder = self.runners[i].decoder
                if proposal is not None:
                    scored = ScoreOutput(logits, shared.row(prefix, row))
                    result = decoder.decode_scored(shared, scored, proposal, contexts[i])  # type: ignore[arg-type]
                    out[i] = self._timed(result, prefill_ms, (proposed_at - started) * 1e3, started)
                    continue
                # the prefix alone: the prefill's rows up to its end, as a plain prefill gives them
                alone = shared.row(prefix.truncate(0), row)
                if capabilities.split_verify:
                    step = decoder.propose_after_prefill(shared, alone, contexts[i])  # type: ignore[arg-type]
                    if isinstance(step, PendingVerify):
                        waiting.append((row, i, step))
                        continue
                    result = step  # finished without a verify pass to share
                else:
                    result = decoder.decode(shared, alone, contexts[i])  # type: ignore[arg-type]
                out[i] = self._timed(result, prefill_ms, 0.0, started)
            verify_ms = 0.0
            if waiting:
                t2 = clock()
                verified = policy.score(output.prefix.truncate(0).select_rows([row for row, _, _ in waiting]),
                                        torch.from_numpy(np.stack([step.tokens for _, _, step in waiting])))
                verify_s = clock() - t2
                verify_ms = verify_s * 1e3
                for (_, i, step), scored in zip(waiting, self._rows(verified), strict=True):
                    result = self.runners[i].decoder.finish_verified(shared, step, ScoreOutput(*scored), contexts[i],  # type: ignore[arg-type]
                                                                     verify_s)
                    out[i] = self._timed(result, prefill_ms, 0.0, started)
            stages.update(propose=(proposed_at - started) * 1e3, tensors=(t0 - proposed_at) * 1e3,
                          batched_pass=prefill_ms, batched_verify=verify_ms,
                          finish=(clock() - t1) * 1e3 - verify_ms)
        return out

    @staticmethod
    def _rows(output: ScoreOutput) -> list[tuple[torch.Tensor, Prefix]]:
        """Each batch row's (logits (1, k+1, 256), prefix); a batch of one is its own row, with no
        slicing of its cache."""
        prefix = output.prefix
        if prefix.batch_size == 1:
            return [(output.logits, prefix)]
        return [(output.logits[row : row + 1], prefix.select(row)) for row in range(prefix.batch_size)]

    @staticmethod
    def _timed(result: DecodeResult, prefill_ms: float, proposal_ms: float, started: float) -> DecodeResult:
        """The result with the round's timings: the shared prefill, its own decoding, the round so far."""
        decode_ms = result.timings["decode"] + proposal_ms
        total_ms = (time.perf_counter() - started) * 1e3
        return replace(result, timings=dict(result.timings, prefill=prefill_ms, decode=decode_ms, total=total_ms))
