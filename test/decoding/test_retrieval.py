"""The HeiSD retrieval store: build / query / save / load, bad files, and build-store on tiny demos."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from vla_accel_ros.decoding.retrieval import (
    META_FILE,
    TENSORS_FILE,
    RetrievalStore,
    RetrievalStoreConfig,
    StoreError,
    choose_index,
    resolve_store,
    store_mismatch,
    trajectory_values,
)

pytest.importorskip("faiss")


def random_store(n: int = 50, d: int = 16, seed: int = 0, index: str = "flat",
                 calibration: bool = True) -> RetrievalStore:
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, d)).astype(np.float32)
    values = rng.integers(0, 255, size=(n, 4, 7))
    meta = ({"calibration": {"r_lo": 0.0, "r_hi": 1.0, "d_lo": 0.0, "d_hi": 0.1, "threshold": 0.3}}
            if calibration else {})
    return RetrievalStore.build(keys, values, RetrievalStoreConfig(index=index), meta)


def test_trajectory_values_pad_with_the_last_action() -> None:
    tokens = np.arange(3 * 7).reshape(3, 7)
    values = trajectory_values(tokens, horizon=4)
    assert values.shape == (3, 4, 7)
    np.testing.assert_array_equal(values[0], tokens[[0, 1, 2, 2]])
    np.testing.assert_array_equal(values[2], tokens[[2, 2, 2, 2]])
    with pytest.raises(ValueError, match="episode tokens"):
        trajectory_values(np.zeros((0, 7)), 4)


@pytest.mark.parametrize("index", ["flat", "hnsw"])
def test_query_with_a_stored_key_returns_its_value(index: str) -> None:
    store = random_store(index=index)
    assert store.index_kind == index and len(store) == 50 and store.dim == 16 and store.horizon == 4
    for i in (0, 7, 49):
        hit = store.query(store.keys[i] * 3.0)  # scale does not matter: keys are normalised
        assert hit.indices[0] == i
        assert hit.scores[0] == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_array_equal(hit.values[0], store.values[i])
    top3 = store.query(torch.from_numpy(store.keys[3]), k=3)
    assert top3.values.shape == (3, 4, 7) and top3.indices[0] == 3
    assert np.all(np.diff(top3.scores) <= 1e-6)  # best first
    with pytest.raises(ValueError, match="dim 16"):
        store.query(np.ones(8))
    with pytest.raises(ValueError, match="k must be"):
        store.query(store.keys[0], k=0)


def test_save_load_round_trip(tmp_path: Path) -> None:
    store = random_store(index="hnsw")
    store.meta["provenance"] = {"frames": 50}
    store.save(tmp_path / "s")
    with RetrievalStore.load(tmp_path / "s", expect_dim=16) as loaded:
        assert loaded.index_kind == "hnsw" and loaded.config == store.config
        np.testing.assert_allclose(loaded.keys, store.keys, atol=1e-6)  # renormalised on load
        np.testing.assert_array_equal(loaded.values, store.values)
        assert loaded.calibration["threshold"] == 0.3 and loaded.meta["provenance"] == {"frames": 50}
        assert loaded.query(store.keys[11]).indices[0] == 11
    meta = json.loads((tmp_path / "s" / META_FILE).read_text())
    assert meta["entries"] == 50 and meta["key_dim"] == 16 and meta["kind"] == "heisd_retrieval_store"


def test_invalid_contents_are_refused() -> None:
    keys = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="values must be"):
        RetrievalStore(keys, np.zeros((2, 3, 7), np.int64))  # horizon 3 != 4
    with pytest.raises(ValueError, match="token"):
        RetrievalStore(keys, np.full((2, 4, 7), 255))
    with pytest.raises(ValueError, match="integer"):
        RetrievalStore(keys, np.zeros((2, 4, 7), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        RetrievalStore(np.full((2, 4), np.nan, np.float32), np.zeros((2, 4, 7), np.int64))
    with pytest.raises(ValueError, match="all zeros"):
        RetrievalStore(np.zeros((2, 4), np.float32), np.zeros((2, 4, 7), np.int64))
    with pytest.raises(ValueError, match="index"):
        RetrievalStoreConfig(index="ivf")
    with pytest.raises(ValueError, match="horizon"):
        RetrievalStoreConfig(horizon=0)


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    return random_store().save(tmp_path / "store")


def test_missing_store_directory_says_how_to_build_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="vla-accel build-store"):
        resolve_store(None, tmp_path / "ckpt")
    with pytest.raises(StoreError, match="not found"):
        RetrievalStore.load(tmp_path / "nowhere")


def test_missing_json(saved: Path) -> None:
    (saved / META_FILE).unlink()
    with pytest.raises(ValueError, match=f"{META_FILE}: missing"):
        RetrievalStore.load(saved)


def test_corrupt_json(saved: Path) -> None:
    (saved / META_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=f"{META_FILE}: cannot read it as JSON"):
        RetrievalStore.load(saved)
    (saved / META_FILE).write_text(json.dumps({"kind": "something else", "format_version": 1, "config": {},
                                               "entries": 1, "key_dim": 1, "horizon": 4}))
    with pytest.raises(StoreError, match="not a retrieval store"):
        RetrievalStore.load(saved)


def test_missing_or_corrupt_tensors(saved: Path) -> None:
    keys = torch.ones(50, 16)
    save_file({"keys": keys}, str(saved / TENSORS_FILE))
    with pytest.raises(StoreError, match=f"{TENSORS_FILE}: missing tensor 'values'"):
        RetrievalStore.load(saved)
    (saved / TENSORS_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(StoreError, match=f"{TENSORS_FILE}: cannot read safetensors"):
        RetrievalStore.load(saved)
    (saved / TENSORS_FILE).unlink()
    with pytest.raises(StoreError, match=f"{TENSORS_FILE}: file not found"):
        RetrievalStore.load(saved)


def test_wrong_dimensions(saved: Path) -> None:
    with pytest.raises(StoreError, match="keys have dim 16, the policy's embeddings 32"):
        RetrievalStore.load(saved, expect_dim=32)
    meta = json.loads((saved / META_FILE).read_text())
    (saved / META_FILE).write_text(json.dumps(meta | {"entries": 49}))
    with pytest.raises(StoreError, match="tensor 'keys' must be"):
        RetrievalStore.load(saved)
    (saved / META_FILE).write_text(json.dumps(meta))
    save_file({"keys": torch.ones(50, 16), "values": torch.zeros(50, 4, 6, dtype=torch.int16)},
              str(saved / TENSORS_FILE))
    with pytest.raises(StoreError, match="tensor 'values' must be"):
        RetrievalStore.load(saved)


def test_index_choice_follows_the_measurement() -> None:
    cfg = RetrievalStoreConfig(latency_budget_ms=1.0, min_recall=0.95)
    fast_exact = {"flat": {"query_ms_p50": 0.2}, "hnsw": {"query_ms_p50": 0.05, "recall_at_1": 0.99}}
    assert choose_index(fast_exact, cfg) == "flat"
    slow_exact = {"flat": {"query_ms_p50": 3.0}, "hnsw": {"query_ms_p50": 0.1, "recall_at_1": 0.97}}
    assert choose_index(slow_exact, cfg) == "hnsw"
    poor_recall = {"flat": {"query_ms_p50": 3.0}, "hnsw": {"query_ms_p50": 0.1, "recall_at_1": 0.5}}
    assert choose_index(poor_recall, cfg) == "hnsw"  # nothing meets both: the faster one
    rng = np.random.default_rng(1)
    keys = rng.normal(size=(200, 8)).astype(np.float32)
    store = RetrievalStore.build(keys, rng.integers(0, 255, (200, 4, 7)), benchmark_queries=keys[:20] + 0.01)
    bench = store.meta["index_benchmark"]
    assert set(bench) == {"flat", "hnsw"} and bench["flat"]["recall_at_1"] == 1.0
    assert 0.0 <= bench["hnsw"]["recall_at_1"] <= 1.0 and bench["flat"]["queries"] == 20
    assert store.index_kind == choose_index(bench, store.config)


def test_store_mismatch_names_the_checkpoint(tmp_path: Path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    from vla_accel_ros.decoding.retrieval import checkpoint_fingerprint

    store = random_store()
    store.meta["provenance"] = {"checkpoint_sha256": checkpoint_fingerprint(ckpt)}
    assert store_mismatch(store, ckpt) is None
    store.meta["provenance"] = {"checkpoint_sha256": "0" * 16}
    assert "rerun `vla-accel build-store`" in store_mismatch(store, ckpt)


def write_episode(path: Path, rng: np.random.Generator, steps: int, size: int = 64) -> None:
    q_home = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    joints = q_home + np.cumsum(rng.normal(0, 0.02, (steps, 7)), axis=0)
    actions = np.concatenate([rng.uniform(-0.01, 0.01, (steps, 6)), rng.integers(0, 2, (steps, 1))], axis=1)
    np.savez_compressed(
        path,
        images=rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8),
        joint_pos=joints.astype(np.float32),
        gripper=np.full(steps, 0.04, np.float32),
        actions=actions.astype(np.float32),
        near_contact=np.zeros(steps, bool),
        instruction=np.array("pick up the red cube"),
        success=np.array(True),
    )


def test_build_store_on_tiny_demos(tmp_path: Path, tiny_checkpoint) -> None:
    from vla_accel_ros.models import load_checkpoint
    from vla_accel_ros.training.store import BuildStoreConfig, build

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    data = tmp_path / "demos"
    data.mkdir()
    rng = np.random.default_rng(0)
    lengths = [9, 12, 10]
    for i, n in enumerate(lengths):
        write_episode(data / f"episode_{i:05d}.npz", rng, n)
    cfg = BuildStoreConfig(checkpoint=str(ckpt), data=str(data), stride=2, holdout_episodes=1, threads=1,
                           progress=False)
    store, out = build(cfg)
    assert out == ckpt / "retrieval_store" and (out / META_FILE).is_file() and (out / TENSORS_FILE).is_file()
    assert len(store) == sum((n + 1) // 2 for n in lengths[:2])  # stride 2 over the two stored episodes
    policy = load_checkpoint(ckpt)
    with np.load(data / "episode_00000.npz") as ep:
        tokens = policy.tokenizer.encode(ep["actions"])
    np.testing.assert_array_equal(store.values[1], tokens[[2, 3, 4, 5]])  # step 2 and the 3 after it
    np.testing.assert_array_equal(store.values[4], tokens[[8, 8, 8, 8]])  # padded at the episode end
    loaded = RetrievalStore.load(out, expect_dim=policy.config.d_model)
    cal = loaded.calibration
    assert cal["r_lo"] < cal["r_hi"] and cal["d_lo"] < cal["d_hi"] and 0.0 <= cal["threshold"] <= 1.0
    prov = loaded.meta["provenance"]
    assert prov["episodes_held_out"] == ["episode_00002.npz"] and prov["frames"] == len(store)
    assert loaded.meta["held_out_retrieval"]["queries"] == lengths[2]
    assert store_mismatch(loaded, ckpt) is None
