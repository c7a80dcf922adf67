"""The runner: one observation in, one decoded action out, for one policy and one decoder.

Every path from an observation to an action goes through :class:`PolicyRunner` (the node's thread
and process workers, the lock-step core of record and replay, eval, bench); what the bench times
is what the node runs. The runner keeps the per-episode history the decoders read and starts a new
episode when told (``start_episode``) or when the observations say so (a new instruction, a jump of
the arm). :func:`run_policy_step` is the one step beneath it: :func:`~vla_accel_ros.runtime.steps.run_steps`
with a batch of one robot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from vla_accel_ros.core.actions import EE_DELTA, action_width
from vla_accel_ros.core.kalman import JointKalmanFilter
from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.observation import Observation
from vla_accel_ros.decoding.history import EpisodeHistory
from vla_accel_ros.decoding.protocol import DecodeContext, Decoder, DecodeResult
from vla_accel_ros.models.api import (
    CheckpointRef,
    IncrementalPrefill,
    PolicyLike,
    ResolvedCheckpoint,
    as_chunk_sampling,
    as_incremental_prefilling,
)
from vla_accel_ros.models.configuration import VisionReuseConfig
from vla_accel_ros.models.sampling import SamplingConfig
from vla_accel_ros.runtime.steps import RobotStep, run_steps

# A measured joint jump this large (rad) between two observations is a new episode (sim reset):
# the decoder's history (filter, tokens, gripper) no longer describes the arm.
EPISODE_JUMP_RAD = 0.3


class RemotePolicy(Protocol):
    """A remote family's policy (``Family.remote``: a policy server's client), which counts its own
    requests, replies and round trips."""

    def remote_stats(self) -> dict[str, Any]: ...


class PolicyRunner:
    """Observation -> :class:`DecodeResult` (the action and the decoder's accounting) for one policy
    and one decoder.

    Keeps the per-episode history the decoders read (recent joints through a joint-space Kalman
    filter, previous tokens and gripper values), the incremental vision encoder when ``vision`` is
    enabled, and the decoder's own episode state. A new episode starts at :meth:`start_episode`, and
    by itself when the instruction changes or the arm's position jumps (a stream without explicit
    episode boundaries: the node, a bag). Build one with :func:`vla_accel_ros.runtime.builder.build_runner`.
    """

    def __init__(self, policy: PolicyLike, decoder: Decoder, kin: ArmKinematics, *, action_dt_s: float,
                 period_s: float, max_steps: int = 120, clock: Callable[[], float] = time.perf_counter,
                 vision: VisionReuseConfig | None = None, sampling: SamplingConfig | None = None,
                 action_space: str = EE_DELTA, remote: bool = False, stand_in_images: bool = False) -> None:
        """``action_space``: what the policy's actions are, as its robot record declares; ``remote``:
        the policy is a remote family's, which counts itself (:class:`RemotePolicy`);
        ``stand_in_images``: fill the image slots an observation leaves empty (:meth:`with_stand_ins`)."""
        self.warnings = decoder.check_policy(policy)  # the fallbacks taken for what the policy lacks
        if policy.capabilities().flow_chunks:  # its state is the arm's joints and gripper
            as_chunk_sampling(policy).check_robot(len(kin.joint_names) + 1,
                                                  action_width(action_space, len(kin.joint_names)))
        self.policy = policy
        self.remote = remote
        self.stand_in_images = stand_in_images
        self.decoder = decoder
        self.decoder_name = decoder.name
        self.period_s = period_s
        self.history = EpisodeHistory(JointKalmanFilter(kin, action_dt_s), max_steps=max_steps,
                                      control_period_s=action_dt_s, clock=clock, sampling=sampling)
        self.vision = incremental_prefill(policy, vision) if vision is not None and vision.enabled else None
        self._last_instruction: str | None = None
        self._last_q: np.ndarray | None = None
        self._episode_started = False  # start_episode() ran and no observation has been served since

    @classmethod
    def load(cls, checkpoint: str | Path | CheckpointRef | ResolvedCheckpoint, decoder_name: str,
             kin: ArmKinematics, *, unnorm_key: str = "", decoder_settings: dict[str, Any] | None = None,
             device: str = "", draft_head: str = "", **kwargs: Any) -> PolicyRunner:
        """Load the checkpoint a directory (or ``hf:DIR``, or a server's address) holds, whatever its
        family (:mod:`vla_accel_ros.models.load`; ValueError naming the file at fault). It is resolved
        here unless it comes resolved already (a :class:`ResolvedCheckpoint`: then nothing reads or
        recognises it again, only ``device`` is checked against its family).
        A decoder that needs a file beside the checkpoint (heisd: CHECKPOINT/retrieval_store) gets it
        here, so that a missing one is reported at start-up, not at every step. ``decoder_settings``
        go to the decoder's config; ``device``: where the policy runs (empty = the CPU); ``draft_head``:
        a token VLA's draft head in a directory of its own (empty: the one beside the weights)."""
        from vla_accel_ros.decoding import make_decoder
        from vla_accel_ros.decoding.specs import names_with
        from vla_accel_ros.models.load import family_named, load_policy, resolve_checkpoint

        resolved = resolve_checkpoint(checkpoint, unnorm_key=unnorm_key, device=device)
        family = family_named(resolved.family)
        served_by = names_with(lambda spec: spec.flow_head) if family.answers_with_chunks else ()
        swapped = ""
        if served_by and decoder_name not in served_by:  # a policy server's chunks come through a flow decoder
            swapped = (f"decoder '{decoder_name}' needs the model's passes; {resolved.ref} answers with chunks: "
                       f"{served_by[0]}")
            decoder_name, decoder_settings = served_by[0], None
        decoder = make_decoder(decoder_name, **(decoder_settings or {}))
        placed = device if device and device != "cpu" else None  # the CPU: the family's default placement
        runner = cls(load_policy(resolved, unnorm_key=unnorm_key, arm=kin, device=placed,
                                 draft_head=Path(draft_head) if draft_head else None), decoder, kin,
                     action_space=resolved.action_space, remote=family.remote, **kwargs)
        if swapped:
            runner.warnings = [swapped, *runner.warnings]
        if decoder.spec.retrieval_store:
            decoder.attach_checkpoint_store(resolved.directory, runner.policy)
        return runner

    @property
    def image_size(self) -> int:
        return int(self.policy.config.image_size)

    def policy_stats(self) -> dict[str, Any]:
        """What the policy counts of itself: a policy server's requests, replies, lost and bad replies,
        connections and round trips (a remote family's ``remote_stats``); empty for a model that runs here."""
        return dict(cast(RemotePolicy, self.policy).remote_stats()) if self.remote else {}

    @property
    def image_slots(self) -> int:
        """Camera images per observation the policy reads (``Observation.images``)."""
        return int(self.policy.capabilities().image_slots)

    def start_episode(self, key: int | None = None) -> None:
        """Forget the previous episode (history, filter, vision cache, decoder state). ``key`` keys the
        episode's sampling noise (eval: the episode's seed, so a seed always samples alike); None
        counts the episodes. The next observation belongs to this episode whatever its instruction."""
        self.history.reset(episode=key)
        if self.vision is not None:
            self.vision.reset()
        self.decoder.reset()
        self._episode_started = True

    def __call__(self, obs: Observation, *, target_clearance: float | None = None) -> DecodeResult:
        """Decode one action for ``obs`` within one control period. ``target_clearance`` is the
        gripper-to-target distance (m) from a simulated scene for world-aware acceptance; None on a
        robot (the decoders then use the policy's contact head)."""
        context = self.begin(obs, target_clearance=target_clearance)
        return self.end(run_policy_step(self.policy, self.with_stand_ins(obs), self.decoder, context, self.vision))

    def with_stand_ins(self, obs: Observation) -> Observation:
        """``obs`` with each image slot its cameras leave empty holding a copy of its first image,
        when stand-in images are allowed (else as it is: the policy refuses too few images)."""
        missing = self.image_slots - len(obs.images)
        if not self.stand_in_images or missing <= 0:
            return obs
        return replace(obs, extra_images=(*obs.extra_images, *[obs.image] * missing))

    def begin(self, obs: Observation, *, target_clearance: float | None = None) -> DecodeContext:
        """The first half of a call: the episode's bookkeeping and this step's decode context (a
        fleet decodes several robots' steps together between ``begin`` and ``end``)."""
        q = np.asarray(obs.joint_pos, dtype=float)
        if not self._episode_started and self._is_new_episode(obs.instruction, q):
            self.start_episode()
        self._episode_started = False
        self._last_instruction, self._last_q = obs.instruction, q
        self.history.observe_joints(q, obs.stamp)
        return self.history.context(time_left_s=self.period_s, target_clearance=target_clearance)

    def end(self, result: DecodeResult) -> DecodeResult:
        """The second half: the step's result into the episode's history."""
        self.history.record(result)
        return result

    def _is_new_episode(self, instruction: str, q: np.ndarray) -> bool:
        if instruction != self._last_instruction:
            return True
        return self._last_q is not None and float(np.max(np.abs(q - self._last_q))) > EPISODE_JUMP_RAD


def incremental_prefill(policy: PolicyLike, settings: VisionReuseConfig) -> IncrementalPrefill:
    """The policy's incremental prefill under ``settings``; ValueError when its family has none."""
    if not policy.capabilities().incremental_prefill:
        raise ValueError("this policy has no incremental prefill (vision_reuse needs one)")
    return as_incremental_prefilling(policy).incremental_prefill(settings)


# --- running one policy step ------------------------------------------------------------------
def run_policy_step(
    policy: PolicyLike,
    obs: Observation,
    decoder: Decoder,
    context: DecodeContext,
    vision: IncrementalPrefill | None = None,
) -> DecodeResult:
    """Decode one action for ``obs``: ``decoder``'s step, its passes made alone, timed on
    ``context.clock`` (:func:`~vla_accel_ros.runtime.steps.run_steps`, a batch of one).

    ``context.time_left_s`` counts from the start of the step, the prefill included. With
    ``vision``, the prefill re-encodes only the image patches that changed (the policy's
    :class:`~vla_accel_ros.models.api.IncrementalPrefill`). A plain ``prefill`` when nothing rides
    along with it; ``prefill_batch`` of the one observation with a proposal the prefill verifies
    (``world_aware`` in free space). A step served without the model (HeiSD's verify-skip) has no
    prefill (its time 0, nothing re-encoded) and no target pass.
    """
    return run_steps(policy, [RobotStep(obs, decoder, context, vision)], clock=context.clock)[0]
