"""HeiSD (the hybrid peer): drafter speculative decoding near task boundaries, retrieved
demonstration trajectories in free motion, and verify-skip.

Each model step, the boundary metric m (:mod:`boundary`) over the last 5 TCP positions (forward
kinematics of the measured joints, through ``context.kalman.kin``) picks the mode:

- m <= threshold, too little history, NaN, or no kinematics: **drafter mode**, exactly ``sd``
  with r = ``r`` (9);
- m > threshold: **retrieval mode**. The store (:mod:`vla_accel_ros.decoding.retrieval`) is queried with the
  prefix's observation embedding (``prefix.pooled``); the retrieved current action (7 tokens) is
  the draft, verified in ONE target pass. *Sequence-wise relaxed acceptance* accepts the whole
  action when the mean token distance to the target's argmax, mean_i |d_i - a_i|, is at most
  ``r_seq`` (a[i] conditioned on d[:i], all from the same pass). The peer does not publish this
  rule in detail; this is our reading: one bound on the average lets a trajectory whose tokens
  are each a little off pass as a whole, while a single far-off token (a gripper flip is ~254
  bins) still fails it. ``r_seq`` = 4 by default because in our action space three of the seven
  dimensions (rotations) are constant, so a mean of 4 over seven tokens is about the per-token
  r = 9 spread over the three translation dimensions. Otherwise token-wise relaxed acceptance (r)
  keeps the accepted prefix and the target's bonus token, and drafter SD finishes the action.
- **verify-skip**: when the retrieved action was accepted as a whole, the next ``skip_steps``
  rows of the retrieved trajectory are queued and executed on the following control steps with
  no prefill and no target pass (:meth:`HeiSDDecoder.skip_step`: the step returns before asking
  for its prefill); then the model runs again. Queued tokens
  are clipped to the token range and decoded with ``policy.tokens_to_action``, and the
  controller downstream applies the URDF limits to them like to any action.

The queue empties at every episode start (``context.step == 0``), whenever the steps stop
following each other, and on :meth:`HeiSDDecoder.reset`.

Per step, ``DecodeResult.mode`` says which path ran ("drafter", "retrieval", "skip") and
``timings["retrieval_query"]`` holds the store query time; :meth:`HeiSDDecoder.stats` sums them up.
For a skipped step ``accepted_len`` and ``drafted`` are 0: nothing was verified.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.decoding import specs
from vla_accel_ros.decoding.acceptor import accept
from vla_accel_ros.decoding.boundary import (
    PUBLISHED_BOUNDARY,
    BoundaryConfig,
    boundary_metric,
    tcp_history,
)
from vla_accel_ros.decoding.protocol import (
    MAX_TOKEN_ID,
    N_ACTION_TOKENS,
    DecodeContext,
    Decoder,
    DecodeResult,
    Step,
    model_free_result,
)
from vla_accel_ros.decoding.specs import HeiSDConfig
from vla_accel_ros.decoding.speculation import PassLedger, SpecState, speculate_to_end
from vla_accel_ros.models.api import PolicyLike, Prefix

MODES = ("drafter", "retrieval", "skip")


class HeiSDDecoder(Decoder):
    spec = specs.HeiSD

    def __init__(self, **cfg: Any) -> None:
        self.config = HeiSDConfig(**cfg)
        self.store: Any = None
        self.boundary: BoundaryConfig | None = PUBLISHED_BOUNDARY if self.config.preset == "published" else None
        self._queue: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._next_step: int | None = None
        self.counts = dict.fromkeys(MODES, 0)
        self.retrieval_accepted = 0
        self.query_ms: deque[float] = deque(maxlen=100_000)
        self.last_metric = math.nan
        if self.config.store is not None:
            self.attach_store(self.config.store)

    # --- store --------------------------------------------------------------------------------
    def attach_store(self, store: Any, policy: PolicyLike | None = None) -> None:
        """Use ``store`` (a RetrievalStore, or a directory to load one from); with ``policy``, its
        key dimension is checked against the policy's embeddings."""
        from vla_accel_ros.decoding.retrieval import RetrievalStore

        if isinstance(store, (str, Path)):
            store = RetrievalStore.load(store)
        if not isinstance(store, RetrievalStore):
            raise ValueError(f"heisd store must be a RetrievalStore or a directory, got {type(store).__name__}")
        if self.config.skip_steps > store.horizon - 1:
            raise ValueError(
                f"heisd skip_steps={self.config.skip_steps} needs a store horizon of at least "
                f"{self.config.skip_steps + 1}, this store holds {store.horizon} actions per entry"
            )
        if policy is not None and policy.config.d_model != store.dim:
            raise ValueError(f"retrieval store keys have dim {store.dim}, the policy's embeddings "
                             f"{policy.config.d_model}: rebuild it with `vla-accel build-store` for this checkpoint")
        if self.config.preset == "calibrated":
            if not store.calibration:
                raise ValueError("this retrieval store has no boundary calibration: rebuild it with "
                                 "`vla-accel build-store`, or use preset='published'")
            self.boundary = BoundaryConfig.from_dict(store.calibration)
        self.store = store
        self.reset()

    def attach_checkpoint_store(self, checkpoint: Path | str, policy: PolicyLike | None = None) -> None:
        """Without a store yet, load the checkpoint's default one (CHECKPOINT/retrieval_store);
        FileNotFoundError says how to build it when there is none."""
        if self.store is not None:
            return
        from vla_accel_ros.decoding.retrieval import resolve_store

        d_model = policy.config.d_model if policy is not None else None
        self.attach_store(resolve_store(None, checkpoint, expect_dim=d_model), policy)

    def _require_store(self) -> Any:
        if self.store is None:
            raise ValueError(
                f"decoder '{self.name}' needs a retrieval store: build one with `vla-accel build-store --checkpoint "
                f"CKPT --data DEMOS` and pass it (--store DIR, or make_decoder('{self.name}', store=DIR))"
            )
        return self.store

    # --- episode bookkeeping ------------------------------------------------------------------
    def reset(self) -> None:
        """Forget queued actions (a new episode, or the arm moved on without us)."""
        self._queue.clear()
        self._next_step = None

    def _follow(self, context: DecodeContext) -> None:
        """Drop the queue unless ``context`` is the step right after the last one served."""
        if context.step == 0 or self._next_step is None or context.step != self._next_step:
            self._queue.clear()

    def metric(self, context: DecodeContext) -> float:
        """The boundary metric m of this step (NaN: no kinematics, too little history)."""
        if context.kalman is None or self.boundary is None:
            return math.nan
        return boundary_metric(tcp_history(context.kalman.kin, context.joint_positions), self.boundary)

    # --- verify-skip --------------------------------------------------------------------------
    def skip_step(self, context: DecodeContext) -> DecodeResult | None:
        """The next queued retrieved action, without prefill or verification; None when there is
        none for this step (the model runs)."""
        started = context.clock()
        self._follow(context)
        if not self._queue:
            return None
        tokens, action = self._queue.popleft()
        self._next_step = context.step + 1
        self.counts["skip"] += 1
        return model_free_result(self.name, action.copy(), tokens.copy(), {"decode": (context.clock() - started) * 1e3},
                                 mode="skip")

    # --- model steps --------------------------------------------------------------------------
    def step(self, policy: PolicyLike, context: DecodeContext, prefix: Prefix | None = None) -> Step:
        """A queued retrieved action without the model (none with ``prefix``: the observation is
        prefilled already); else a model step in the mode the boundary metric picks."""
        if prefix is None:
            skipped = self.skip_step(context)
            if skipped is not None:
                return skipped
        ledger = PassLedger(policy, context)
        prefill = yield from ledger.prefill(prefix)
        store = self._require_store()
        self._queue.clear()  # a model step supersedes whatever was queued
        self._next_step = context.step + 1
        m = self.metric(context)
        self.last_metric = m
        if self.boundary is None or not m > self.boundary.threshold:  # NaN (too little history) -> the model
            state = SpecState(prefill.prefix)
            yield from speculate_to_end(ledger, state, self.config.r)
            self.counts["drafter"] += 1
            return ledger.state_result(self.name, state, kf_filled=0, threshold=self.config.r, mode="drafter")
        return (yield from self._retrieve(ledger, prefill.prefix, context, store))

    def _retrieve(self, ledger: PassLedger, prefix: Prefix, context: DecodeContext, store: Any) -> Step:
        cfg = self.config
        clock = context.clock
        t0 = clock()
        hit = store.query(prefix.pooled[0])
        query_ms = (clock() - t0) * 1e3
        self.query_ms.append(query_ms)
        trajectory = np.clip(np.asarray(hit.values[0], dtype=np.int64), 0, MAX_TOKEN_ID)
        draft = trajectory[0]
        picks, extended = yield from ledger.score(prefix, draft)
        target = picks[:N_ACTION_TOKENS]
        verdict = accept(draft, target, cfg.r, N_ACTION_TOKENS)
        whole = verdict.bonus is None or (cfg.sequence_accept and float(np.mean(np.abs(draft - target))) <= cfg.r_seq)
        result: DecodeResult
        if whole:
            result = ledger.result(self.name, draft, accepted_len=N_ACTION_TOKENS, drafted=N_ACTION_TOKENS,
                                   rounds=1, kf_filled=0, threshold=cfg.r)
        else:
            state = SpecState(prefix=prefix, accepted=verdict.accepted, drafted=N_ACTION_TOKENS, rounds=1)
            state.take(draft, verdict.accepted, verdict.bonus, extended.truncate(verdict.accepted))
            yield from speculate_to_end(ledger, state, cfg.r)
            result = ledger.state_result(self.name, state, kf_filled=0, threshold=cfg.r)
        self.counts["retrieval"] += 1
        if whole:
            self.retrieval_accepted += 1
            for row in trajectory[1 : 1 + cfg.skip_steps]:
                tokens = np.clip(row, 0, MAX_TOKEN_ID).astype(np.int64)
                self._queue.append((tokens, np.asarray(ledger.scoring.tokens_to_action(tokens), dtype=float)))
        return replace(result, mode="retrieval", timings=dict(result.timings, retrieval_query=query_ms))

    # --- accounting ---------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Counts since construction: steps per mode, the retrieval-mode share of model steps, the
        share of skipped steps, the accepted share of retrieved drafts and the query p50 (ms)."""
        model_steps = self.counts["drafter"] + self.counts["retrieval"]
        steps = model_steps + self.counts["skip"]
        return {
            **{f"{mode}_steps": float(n) for mode, n in self.counts.items()},
            "retrieval_mode_share": self.counts["retrieval"] / model_steps if model_steps else 0.0,
            "verify_skip_share": self.counts["skip"] / steps if steps else 0.0,
            "retrieval_accept_rate": (self.retrieval_accepted / self.counts["retrieval"]
                                      if self.counts["retrieval"] else 0.0),
            "retrieval_query_ms_p50": float(np.median(self.query_ms)) if self.query_ms else math.nan,
        }
