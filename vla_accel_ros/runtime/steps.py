"""The one driver of control steps: the decoders' steps of one robot or of several, their target
passes made here, batched over robots where the policy can.

Each robot's step is its decoder's :meth:`~vla_accel_ros.decoding.protocol.Decoder.step`, a
generator that yields the target passes it needs. :func:`run_steps` starts every robot's step (a
step served without the model returns at once) and makes the prefill each asks for. A fleet's
round (``together``) makes ONE batched prefill for its robots without incremental vision when the
policy declares ``batched_passes``, each row carrying the same number of proposal positions (N - 1,
zeros where a robot proposed nothing); otherwise each robot gets its own prefill (its incremental
prefill when it has one; a plain ``prefill`` when nothing rides along), as a single runner's step
always does. After a batched prefill, the first passes that
follow it on a robot's own rows are made together, one batched ``score`` per shape (what the robots
that verify after the prefill ask for); every later pass is made alone.

Batching changes what a step costs, never what it computes: each robot's rows see only its own
prefix and its own sampling noise. The timings each result gets: ``prefill``, the prefill pass (a
batched pass's time is each robot's; 0 for a step without the model, whose ``vision_fraction`` is
0 too); ``total``, the robot's whole step; the decoder's own ``decode``, ``draft`` and ``verify``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding.protocol import (
    DecodeContext,
    Decoder,
    DecodeResult,
    PassResult,
    Step,
    TargetPass,
    advance,
    finish_alone,
)
from vla_accel_ros.models.api import (
    IncrementalPrefill,
    PolicyLike,
    Prefix,
    ScoreOutput,
    TokenScoring,
    as_contact_sensing,
    as_token_scoring,
)

# The stages of :func:`run_steps` it times (ms): starting the steps up to their prefill requests
# (``propose``: what a decoder does before the prefill), the proposals into one tensor, the batched
# prefill, the batched passes after it, the rest of the batched robots' steps (``finish``), and the
# robots served one at a time, whole (``alone``).
DRIVER_STAGES = ("propose", "tensors", "batched_pass", "batched_verify", "finish", "alone")


@dataclass(frozen=True, eq=False)
class RobotStep:
    """One robot's step: its observation, decoder, decode context and incremental prefill (or None)."""

    obs: Observation
    decoder: Decoder
    context: DecodeContext
    vision: IncrementalPrefill | None = None


@dataclass(frozen=True, eq=False)
class _BatchRow:
    """A robot's place in a batched prefill: its row, the tokens that rode along, the prefix it was given."""

    index: int
    riding: int
    prefix: Prefix


class _Running:
    """A robot's step under way: what it asked for last, and what its prefill cost."""

    def __init__(self, robot: RobotStep, policy: PolicyLike) -> None:
        self.robot = robot
        self.clock = robot.context.clock
        self.started = self.clock()
        self.steps: Step = robot.decoder.step(policy, robot.context)
        self.pending: TargetPass | DecodeResult = advance(self.steps, None)
        self.prefilled = False
        self.prefill_ms = 0.0
        self.vision_fraction = 1.0
        self.row: _BatchRow | None = None

    def request(self) -> TargetPass:
        if not isinstance(self.pending, TargetPass):
            raise RuntimeError("the step has finished")
        return self.pending

    def reply(self, result: PassResult) -> None:
        self.pending = advance(self.steps, result)

    def prefill_done(self, result: PassResult, fraction: float = 1.0) -> None:
        self.prefilled, self.prefill_ms, self.vision_fraction = True, result.seconds * 1e3, fraction
        self.reply(result)

    def result(self, policy: PolicyLike) -> DecodeResult:
        """Its remaining passes, each alone, and the result with the step's timings."""
        result = finish_alone(self.steps, self.pending, policy, self.clock)
        total_ms = (self.clock() - self.started) * 1e3
        if not self.prefilled:  # served without the model
            return replace(result, timings=dict(result.timings, prefill=0.0, total=total_ms), vision_fraction=0.0)
        return replace(result, timings=dict(result.timings, prefill=self.prefill_ms, total=total_ms),
                       vision_fraction=self.vision_fraction)


def run_steps(policy: PolicyLike, robots: Sequence[RobotStep], *, together: bool = False,
              clock: Callable[[], float] = time.perf_counter, stages: dict[str, float] | None = None
              ) -> list[DecodeResult]:
    """Each robot's step (module docstring), results in order; ``together``: a fleet's round.
    ``clock`` times the batched passes and the ``stages`` (ms, :data:`DRIVER_STAGES`), added to that
    dict when given; each robot's own passes and timings read its context's clock."""
    stages = {} if stages is None else stages
    with torch.inference_mode():
        if not (together and policy.capabilities().batched_passes):
            t0 = clock()
            results = [_alone(policy, _Running(robot, policy)) for robot in robots]
            stages["alone"] = stages.get("alone", 0.0) + (clock() - t0) * 1e3
            return results
        return _together(policy, robots, clock, stages)


def _alone(policy: PolicyLike, running: _Running) -> DecodeResult:
    """A robot's step by itself: its own prefill, every pass alone."""
    if isinstance(running.pending, TargetPass):
        robot, request = running.robot, running.request()
        if request.prefix is not None:
            raise RuntimeError(f"decoder '{robot.decoder.name}': a step's first pass is its prefill")
        feed = torch.tensor([list(request.tokens)], dtype=torch.long) if request.tokens else None
        t0 = running.clock()
        if robot.vision is not None:
            out = robot.vision.prefill_batch([robot.obs], feed)
            prefix, logits = out.prefix, out.logits if feed is not None else None
        elif feed is not None:
            out = as_token_scoring(policy).prefill_batch([robot.obs], feed)
            prefix, logits = out.prefix, out.logits
        else:
            prefix, logits = policy.prefill(robot.obs), None
        seconds = running.clock() - t0
        last = robot.vision.last if robot.vision is not None else None
        running.prefill_done(PassResult.alone(policy, prefix, logits, seconds), last.fraction if last else 1.0)
    return running.result(policy)


def _together(policy: PolicyLike, robots: Sequence[RobotStep], clock: Callable[[], float],
              stages: dict[str, float]) -> list[DecodeResult]:
    t0 = clock()
    running = [_Running(robot, policy) for robot in robots]
    t1 = clock()
    asking = [r for r in running if isinstance(r.pending, TargetPass)]
    batch = [r for r in asking if r.robot.vision is None]
    results: dict[int, DecodeResult] = {}
    if batch:
        scoring = as_token_scoring(policy)
        width = max(scoring.n_action_tokens - 1, *(len(r.request().tokens) for r in batch))
        feed = np.zeros((len(batch), width), dtype=np.int64)
        for row, r in enumerate(batch):
            tokens = r.request().tokens
            feed[row, : len(tokens)] = tokens
        t2 = clock()
        output = scoring.prefill_batch([r.robot.obs for r in batch], torch.from_numpy(feed))
        seconds = clock() - t2
        t3 = clock()
        contact = BatchContact(policy, output.prefix)
        for row, (r, (logits, prefix)) in enumerate(zip(batch, rows_of(output), strict=True)):
            k = len(r.request().tokens)
            given = prefix if k == width else prefix.truncate(k)
            r.row = _BatchRow(row, k, given)
            r.prefill_done(PassResult(given, logits[:, : k + 1] if k else None, seconds, partial(contact.row, row)))
        t4 = clock()
        _first_passes_together(policy, scoring, batch, output.prefix, clock)
        t5 = clock()
        results.update((id(r), r.result(policy)) for r in batch)
        stages.update(tensors=(t2 - t1) * 1e3, batched_pass=seconds * 1e3, batched_verify=(t5 - t4) * 1e3,
                      finish=(clock() - t5 + t4 - t3) * 1e3)
    stages["propose"] = (t1 - t0) * 1e3
    rest = [r for r in running if id(r) not in results]
    if rest:
        t6 = clock()
        results.update((id(r), _alone(policy, r)) for r in rest)
        stages["alone"] = stages.get("alone", 0.0) + (clock() - t6) * 1e3
    return [results[id(r)] for r in running]


def _first_passes_together(policy: PolicyLike, scoring: TokenScoring, batch: list[_Running], prefilled: Prefix,
                           clock: Callable[[], float]) -> None:
    """The passes the robots of a batched prefill ask for right after it on their own rows, one
    batched ``score`` per shape (tokens riding in the prefill, tokens of the pass)."""
    groups: dict[tuple[int, int], list[tuple[_Running, TargetPass, int]]] = {}
    for r in batch:
        request, row = r.pending, r.row
        if row is not None and isinstance(request, TargetPass) and request.prefix is row.prefix:
            groups.setdefault((row.riding, len(request.tokens)), []).append((r, request, row.index))
    for (riding, _), members in groups.items():
        tokens = torch.tensor([list(request.tokens) for _, request, _ in members], dtype=torch.long)
        t0 = clock()
        scored = scoring.score(prefilled.truncate(riding).select_rows([index for _, _, index in members]), tokens)
        seconds = clock() - t0
        for (r, _, _), (logits, prefix) in zip(members, rows_of(scored), strict=True):
            r.reply(PassResult.alone(policy, prefix, logits, seconds))


def rows_of(output: ScoreOutput) -> list[tuple[torch.Tensor, Prefix]]:
    """Each batch row's (logits (1, k+1, n_bins), prefix); a batch of one is its own row, with no
    slicing of its cache."""
    prefix = output.prefix
    if prefix.batch_size == 1:
        return [(output.logits, prefix)]
    return [(output.logits[row : row + 1], prefix.select(row)) for row in range(prefix.batch_size)]


class BatchContact:
    """The contact head on a batched prefill, read for every row in ONE call when the first row asks
    (a ``world_aware`` robot asks once a step without the scene: one head call per robot otherwise,
    each costing about what the batched one does)."""

    def __init__(self, policy: PolicyLike, batch: Prefix) -> None:
        self._policy = policy
        self._batch = batch
        self._probabilities: list[float] | None = None

    def row(self, index: int) -> float:
        if self._probabilities is None:
            logits = as_contact_sensing(self._policy).contact_logits(self._batch)
            self._probabilities = torch.sigmoid(logits).tolist()
        return self._probabilities[index]
