"""The HeiSD retrieval store and boundary calibration, built from demonstrations (``vla-accel build-store``).

For every ``stride``-th step of every successful demonstration episode, the checkpoint's target
prefills the observation (batched per episode) and the normalised ``prefix.pooled`` becomes a key;
its value is that step's action tokens and the next ``horizon - 1`` steps' (tokenised with the
checkpoint's own tokenizer). The default stride is 1: on ``data/demos_v3`` every step gives
18 743 entries, and the retrieved action of an unseen frame lands 4.9 bins (mean |token
difference|) from the demonstrated one, against 5.7 at stride 2 (9 462 entries). Loading the
compressed episodes costs about as much as the prefill, so a larger stride saves only part of the
build (about 5 minutes at stride 1 on two CPU cores while a training runs).
The last ``--holdout-episodes`` episodes are not stored: their frames
are the queries that measure the index (latency, recall@1; see :mod:`vla_accel_ros.decoding.retrieval`) and
how close retrieved actions come to the true ones on unseen scenes.

The boundary metric (:mod:`vla_accel_ros.decoding.boundary`) is calibrated on the stored episodes'
TCP paths (forward kinematics of the recorded joints, as the decoder computes them at run time):
ranges = min / max over all 5-step windows, threshold = the 25th percentile of m.

Writes ``OUT/store.safetensors`` and ``OUT/store.json`` (default OUT: CHECKPOINT/retrieval_store).
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_accel_ros.core.kinematics import ArmKinematics
from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.core.resources import default_urdf
from vla_accel_ros.decoding.boundary import calibrate_boundary, window_features
from vla_accel_ros.decoding.retrieval import (
    RetrievalStore,
    RetrievalStoreConfig,
    checkpoint_fingerprint,
    default_store_dir,
    trajectory_values,
)
from vla_accel_ros.models import Policy, load_checkpoint
from vla_accel_ros.training.configs import BuildStoreConfig
from vla_accel_ros.training.data import DatasetError, load_episode

R_SEQ_REFERENCE = 4.0  # the heisd decoder's default sequence-wise bound, for the held-out diagnostic


def episode_keys(policy: Policy, episode: dict[str, np.ndarray], steps: np.ndarray) -> np.ndarray:
    """Raw keys (len(steps), d), the store normalises them: ``prefix.pooled`` of those steps, one batched prefill."""
    images = torch.from_numpy(np.ascontiguousarray(episode["images"][steps]))
    text = torch.from_numpy(episode["text"]).unsqueeze(0).repeat(len(steps), 1)
    proprio = torch.from_numpy(np.ascontiguousarray(episode["proprio"][steps]))
    prefix = policy.prefill_tensors(images, text, proprio).prefix
    return prefix.pooled.to(torch.float32).cpu().numpy()


def build(cfg: BuildStoreConfig, command: str = "") -> tuple[RetrievalStore, Path]:
    """Prefill, calibrate, build, measure and save; returns the store and where it went. torch's
    thread count is ``cfg.threads`` meanwhile and restored afterwards."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _build(cfg, command)
    finally:
        torch.set_num_threads(previous_threads)


def _build(cfg: BuildStoreConfig, command: str) -> tuple[RetrievalStore, Path]:
    started = time.perf_counter()
    checkpoint = Path(cfg.checkpoint)
    policy = load_checkpoint(checkpoint)
    data = Path(cfg.data)
    if not data.is_dir():
        raise DatasetError(f"{data}: demo directory not found")
    files = sorted(data.glob("episode_*.npz"))
    if cfg.max_episodes is not None:
        files = files[: cfg.max_episodes]
    if not files:
        raise DatasetError(f"{data}: no episode_*.npz files")
    n_hold = min(cfg.holdout_episodes, len(files) - 1)
    stored_files, held_files = files[: len(files) - n_hold], files[len(files) - n_hold :]
    kin = ArmKinematics(default_urdf())
    tokenizer = policy.tokenizer
    keys, values, radii, distances = [], [], [], []
    skipped = 0
    for path in progress_bar(stored_files, desc="store: prefill demos", unit="ep", disable=not cfg.progress):
        episode = load_episode(path, policy.config.max_text_len)
        if not episode["success"]:
            skipped += 1
            continue
        _check_image_size(path, episode, policy)
        tokens = tokenizer.encode(episode["actions"])
        steps = np.arange(0, len(tokens), cfg.stride)
        keys.append(episode_keys(policy, episode, steps))
        values.append(trajectory_values(tokens, cfg.horizon)[steps])
        tcp = np.array([kin.fk(q).position for q in episode["proprio"][:, : kin.n]])
        r, d = window_features(tcp)
        radii.append(r)
        distances.append(d)
    if not keys:
        raise DatasetError(f"{data}: no successful episodes among {len(stored_files)} files")
    queries, truths = [], []
    for path in progress_bar(held_files, desc="store: held-out queries", unit="ep",
                             disable=not cfg.progress or not held_files):
        episode = load_episode(path, policy.config.max_text_len)
        _check_image_size(path, episode, policy)
        steps = np.arange(len(episode["actions"]))
        queries.append(episode_keys(policy, episode, steps))
        truths.append(tokenizer.encode(episode["actions"]))
    all_keys, all_values = np.concatenate(keys), np.concatenate(values)
    calibration, calibration_info = calibrate_boundary(np.concatenate(radii), np.concatenate(distances))
    if queries:
        bench_queries = np.concatenate(queries)
        query_source = f"{len(bench_queries)} frames of {len(held_files)} held-out episodes"
    else:  # a single episode: self-queries still time the index, recall is trivially 1
        rng = np.random.default_rng(0)
        bench_queries = all_keys[rng.choice(len(all_keys), size=min(256, len(all_keys)), replace=False)]
        query_source = f"{len(bench_queries)} stored keys (no held-out episodes)"
    store_config = RetrievalStoreConfig(horizon=cfg.horizon, index=cfg.index)
    meta: dict[str, Any] = {
        "calibration": {**calibration.to_dict(), **calibration_info},
        "provenance": {
            "checkpoint": str(checkpoint.resolve()),
            "checkpoint_sha256": checkpoint_fingerprint(checkpoint),
            "data": str(data.resolve()),
            "episodes_stored": len(keys),
            "episodes_skipped_failed": skipped,
            "episodes_held_out": [p.name for p in held_files],
            "stride": cfg.stride,
            "frames": int(len(all_keys)),
            "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
        },
    }
    store = RetrievalStore.build(all_keys, all_values, store_config, meta, benchmark_queries=bench_queries)
    store.meta["index_benchmark"]["query_source"] = query_source
    if queries:
        store.meta["held_out_retrieval"] = held_out_quality(store, bench_queries, np.concatenate(truths))
    store.meta["provenance"]["build_s"] = round(time.perf_counter() - started, 1)
    out = Path(cfg.out) if cfg.out else default_store_dir(checkpoint)
    store.save(out)
    return store, out


def _check_image_size(path: Path, episode: dict[str, np.ndarray], policy: Policy) -> None:
    size = policy.config.image_size
    if episode["images"].shape[1:] != (size, size, 3):
        raise DatasetError(f"{path}: images are {episode['images'].shape[1:]}, "
                           f"the checkpoint expects ({size}, {size}, 3)")


def held_out_quality(store: RetrievalStore, queries: np.ndarray, truths: np.ndarray) -> dict[str, float]:
    """How close the retrieved current action comes to the demonstrated one on unseen episodes:
    mean |token difference| (bins), and the share within the default sequence-wise bound."""
    distance = np.array([np.abs(store.query(q).values[0, 0] - t).mean() for q, t in zip(queries, truths)])
    return {
        "queries": int(len(queries)),
        "mean_token_distance": float(distance.mean()),
        "median_token_distance": float(np.median(distance)),
        "share_within_r_seq_4": float(np.mean(distance <= R_SEQ_REFERENCE)),
    }


