"""The HeiSD retrieval store: observation embedding -> the demonstrated action trajectory from there.

Keys are the target's own view of an observation: ``prefix.pooled`` (the mean of the final hidden
states over the observation prefix, which the prefill computes anyway), L2-normalised, so that the
inner product is the cosine similarity and a query costs nothing beyond the search. Values are the
action tokens of the demonstration step and of the next ``horizon - 1`` steps of the same episode
((horizon, 7) ints; at the episode end the last action repeats). The decoder verifies row 0 as a
draft and, when it is accepted, executes the following rows without a model step ("verify-skip").

Index choice, measured by ``vla-accel build-store`` on our store (18 743 keys, d = 128, every step
of the 392 stored expert episodes of ``data/demos_v3``; queries: the 396 frames of 8 held-out
episodes, one at a time, one faiss thread, on two CPU cores while trainings ran). *Cold*
flushes the caches before each query, as in the control loop, where a whole prefill runs between
two queries; an exact scan then reads all 9.6 MB of keys from memory:

=============================  =========  =========  =========  ========
index                          p50 cold   p99 cold   p50 warm   recall@1
=============================  =========  =========  =========  ========
exact ``IndexFlatIP``          0.49 ms    0.82 ms    0.18 ms    1.000
``IndexHNSWFlat`` M=32 ef=64   0.15 ms    0.23 ms    0.015 ms   0.992
=============================  =========  =========  =========  ========

``index="auto"`` (the default) takes the exact index whenever its cold p50 fits
``latency_budget_ms`` (1 ms), as here: HNSW would save about 0.3 ms on a retrieval step (well
under 1% of a 50 ms control period) and return a different neighbour for 0.8% of the queries.
Past the budget (a much larger store) it takes the HNSW graph if its recall@1 reaches
``min_recall``. The store keeps the raw keys (safetensors) and rebuilds the index on load (exact:
instant; HNSW: about 1 s here), so nothing binary or pickled is stored and the files are
portable across faiss versions.

On disk (``DIR/store.safetensors`` with ``keys`` (N, d) float32, or float16 for a compact store
(``save(key_dtype="float16")``: half the bytes; on the shipped store's 396 held-out frames the
nearest neighbour stays the same for 98% of them and the retrieved actions move by 0.002 bins on
average), and ``values`` (N, horizon, 7) int16,
and ``DIR/store.json`` with the config, the index measurements, the boundary calibration
and the build provenance), every problem is a ValueError naming the file (:class:`StoreError`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from vla_accel_ros.core.json_config import JsonConfig
from vla_accel_ros.decoding.protocol import MAX_TOKEN_ID, N_ACTION_TOKENS
from vla_accel_ros.models.files import SINGLE_FILE, read_json_object

FORMAT_VERSION = 1
STORE_KIND = "heisd_retrieval_store"
TENSORS_FILE = "store.safetensors"
META_FILE = "store.json"
DEFAULT_DIR_NAME = "retrieval_store"
INDEX_KINDS = ("auto", "flat", "hnsw")
KEY_DTYPES = {"float32": torch.float32, "float16": torch.float16}  # how keys may be stored on disk


class StoreError(ValueError):
    """A retrieval store that cannot be used; ``file`` is the path at fault, which the message names."""

    def __init__(self, file: Path | str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = Path(file)
        self.problem = problem


@dataclass(frozen=True)
class RetrievalStoreConfig(JsonConfig):
    """How the store is searched.

    horizon: actions per value (the current one + horizon - 1 following ones).
    index: "flat" (exact inner product), "hnsw" (approximate graph) or "auto" (measure both at
        build time, see the module docstring).
    hnsw_m / hnsw_ef_construction / hnsw_ef_search: the graph's degree and search breadths.
    latency_budget_ms / min_recall: what "auto" requires of a query.
    threads: faiss threads while searching (one query per control step: more threads only add
        synchronisation, and torch needs the cores).
    """

    horizon: int = 4
    index: str = "auto"
    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    hnsw_ef_search: int = 64
    latency_budget_ms: float = 1.0
    min_recall: float = 0.95
    threads: int = 1

    def __post_init__(self) -> None:
        if self.horizon < 1:
            raise ValueError(f"RetrievalStoreConfig.horizon must be >= 1, got {self.horizon}")
        if self.index not in INDEX_KINDS:
            raise ValueError(f"RetrievalStoreConfig.index must be one of {INDEX_KINDS}, got {self.index!r}")
        for name in ("hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"RetrievalStoreConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.latency_budget_ms) and self.latency_budget_ms > 0):
            raise ValueError(f"RetrievalStoreConfig.latency_budget_ms must be > 0, got {self.latency_budget_ms}")
        if not 0.0 < self.min_recall <= 1.0:
            raise ValueError(f"RetrievalStoreConfig.min_recall must be in (0, 1], got {self.min_recall}")


@dataclass(frozen=True)
class RetrievalHit:
    """The k nearest entries, best first: store row ``indices`` (k,), cosine ``scores`` (k,) and
    their ``values`` (k, horizon, 7) tokens."""

    indices: np.ndarray
    scores: np.ndarray
    values: np.ndarray


def normalise_keys(keys: np.ndarray | torch.Tensor) -> np.ndarray:
    """(N, d) float32, unit L2 norm per row; raises on non-finite or all-zero rows."""
    if isinstance(keys, torch.Tensor):
        keys = keys.detach().to("cpu", torch.float32).numpy()
    x = np.asarray(keys, dtype=np.float32)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"keys must be (N, d), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("keys contain NaN or inf")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError("a key is all zeros and has no direction")
    return np.ascontiguousarray(x / norms, dtype=np.float32)


def trajectory_values(tokens: np.ndarray, horizon: int) -> np.ndarray:
    """(T, horizon, 7): for every step t of one episode's action tokens (T, 7), the tokens of steps
    t .. t + horizon - 1, the last step repeated past the episode end."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 2 or tokens.shape[1] != N_ACTION_TOKENS or len(tokens) == 0:
        raise ValueError(f"episode tokens must be (T>0, {N_ACTION_TOKENS}), got shape {tokens.shape}")
    steps = np.minimum(np.arange(len(tokens))[:, None] + np.arange(horizon)[None], len(tokens) - 1)
    return tokens[steps]


def _faiss() -> Any:
    """faiss, imported on first use so that the decoders load without it."""
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - depends on the machine
        raise ImportError("the retrieval store needs faiss: pip install 'faiss-cpu>=1.8'") from err
    return faiss


def _make_index(kind: str, keys: np.ndarray, config: RetrievalStoreConfig) -> Any:
    faiss = _faiss()
    d = keys.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
        index.hnsw.efSearch = config.hnsw_ef_search
    else:
        raise ValueError(f"unknown index kind {kind!r}")
    index.add(keys)
    return index


EVICT_BYTES = 64 << 20  # twice this machine's L3: streaming it pushes the keys out of every cache level


def measure_index(index: Any, queries: np.ndarray, exact_top1: np.ndarray | None = None) -> dict[str, float]:
    """Latency of single-query searches (as the decoder queries: one at a time) and recall@1
    against ``exact_top1`` (1.0 when not given: the index is the exact one).

    ``query_ms_*`` are *cold*: a buffer larger than the caches is streamed before each query, as
    happens in the control loop, where a whole prefill runs between two queries. An exact scan then
    reads every key from memory (about 3x its warm time here); ``warm_query_ms_*`` are back-to-back
    queries, the figure a plain micro-benchmark gives."""
    evict = np.ones(EVICT_BYTES // 4, dtype=np.float32)
    found = np.empty(len(queries), dtype=np.int64)
    cold = np.empty(len(queries))
    warm = np.empty(len(queries))
    for i in range(len(queries)):
        float(evict[::16].sum())  # one read per 64-byte cache line
        t0 = time.perf_counter()
        _, idx = index.search(queries[i : i + 1], 1)
        cold[i] = time.perf_counter() - t0
        t0 = time.perf_counter()
        index.search(queries[i : i + 1], 1)
        warm[i] = time.perf_counter() - t0
        found[i] = idx[0, 0]
    recall = 1.0 if exact_top1 is None else float(np.mean(found == exact_top1))
    return {
        "query_ms_p50": float(np.percentile(cold, 50) * 1e3),
        "query_ms_p99": float(np.percentile(cold, 99) * 1e3),
        "warm_query_ms_p50": float(np.percentile(warm, 50) * 1e3),
        "warm_query_ms_p99": float(np.percentile(warm, 99) * 1e3),
        "recall_at_1": recall,
        "queries": len(queries),
    }


class RetrievalStore:
    """Nearest-neighbour search over normalised keys, returning action trajectories.

    Build with :meth:`build`, search with :meth:`query`, persist with :meth:`save` /
    :meth:`load`. ``meta`` carries what the JSON records besides the config (``calibration``,
    ``provenance``, ``index_benchmark``...). Usable as a context manager (releases the index).
    """

    def __init__(self, keys: np.ndarray | torch.Tensor, values: np.ndarray, config: RetrievalStoreConfig | None = None,
                 meta: dict[str, Any] | None = None, index_kind: str | None = None) -> None:
        self.config = config or RetrievalStoreConfig()
        keys = normalise_keys(keys)
        values = np.asarray(values)
        if not np.issubdtype(values.dtype, np.integer):
            raise ValueError(f"values must be integer tokens, got dtype {values.dtype}")
        values = values.astype(np.int64)
        if values.shape != (len(keys), self.config.horizon, N_ACTION_TOKENS):
            raise ValueError(
                f"values must be (N={len(keys)}, horizon={self.config.horizon}, {N_ACTION_TOKENS}), got {values.shape}"
            )
        if values.size and (values.min() < 0 or values.max() > MAX_TOKEN_ID):
            raise ValueError(f"value tokens must lie in [0, {MAX_TOKEN_ID}]")
        if len(keys) == 0:
            raise ValueError("a retrieval store needs at least one entry")
        self.keys = keys
        self.values = values
        self.meta: dict[str, Any] = dict(meta or {})
        kind = index_kind or ("flat" if self.config.index == "auto" else self.config.index)
        if kind not in ("flat", "hnsw"):
            raise ValueError(f"index kind must be 'flat' or 'hnsw', got {kind!r}")
        self.index_kind = kind
        self.key_dtype = "float32"  # on disk; load() sets what the file holds, save() keeps it by default
        _faiss().omp_set_num_threads(self.config.threads)
        self._index: Any = _make_index(kind, keys, self.config)

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, keys: np.ndarray | torch.Tensor, values: np.ndarray, config: RetrievalStoreConfig | None = None,
              meta: dict[str, Any] | None = None, benchmark_queries: np.ndarray | torch.Tensor | None = None
              ) -> RetrievalStore:
        """A store over ``keys`` (N, d) and ``values`` (N, horizon, 7). With ``config.index ==
        "auto"``, ``benchmark_queries`` (M, d) (held-out embeddings, as the decoder will see them)
        decide the index: see the module docstring; their figures go to ``meta["index_benchmark"]``."""
        config = config or RetrievalStoreConfig()
        meta = dict(meta or {})
        kind = None if config.index == "auto" else config.index
        if benchmark_queries is not None:
            keys_n = normalise_keys(keys)
            queries = normalise_keys(benchmark_queries)
            if queries.shape[1] != keys_n.shape[1]:
                raise ValueError(f"benchmark queries have dim {queries.shape[1]}, the keys {keys_n.shape[1]}")
            _faiss().omp_set_num_threads(config.threads)
            figures = {}
            flat = _make_index("flat", keys_n, config)
            _, exact = flat.search(queries, 1)
            figures["flat"] = measure_index(flat, queries)
            start = time.perf_counter()
            hnsw = _make_index("hnsw", keys_n, config)
            hnsw_build_s = time.perf_counter() - start
            figures["hnsw"] = dict(measure_index(hnsw, queries, exact[:, 0]), build_s=hnsw_build_s,
                                   m=config.hnsw_m, ef_search=config.hnsw_ef_search)
            if kind is None:
                kind = choose_index(figures, config)
            meta["index_benchmark"] = figures
        return cls(keys, values, config, meta, index_kind=kind)

    # --- search -------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return int(self.keys.shape[1])

    @property
    def horizon(self) -> int:
        return int(self.values.shape[1])

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def query(self, key: np.ndarray | torch.Tensor, k: int = 1) -> RetrievalHit:
        """The k entries nearest (cosine) to one key (d,) or (1, d)."""
        q = normalise_keys(key)
        if q.shape != (1, self.dim):
            raise ValueError(f"query must be one key of dim {self.dim}, got shape {q.shape}")
        if not 1 <= k <= len(self):
            raise ValueError(f"k must be in [1, {len(self)}], got {k}")
        if self._index is None:
            raise RuntimeError("the retrieval store was closed")
        scores, idx = self._index.search(q, k)
        idx = idx[0]
        if np.any(idx < 0):  # an approximate index may return fewer than k
            keep = idx >= 0
            idx, scores = idx[keep], scores[:, keep]
        return RetrievalHit(indices=idx.astype(np.int64), scores=scores[0].astype(np.float64), values=self.values[idx])

    # --- persistence --------------------------------------------------------------------------
    def save(self, directory: Path | str, key_dtype: str | None = None) -> Path:
        """Write ``directory/store.safetensors`` and ``directory/store.json``; returns the directory.
        ``key_dtype`` (one of ``KEY_DTYPES``; None: the store's own ``key_dtype``) is how the keys
        are written: "float16" halves the file for a store shipped with a checkpoint."""
        key_dtype = key_dtype or self.key_dtype
        if key_dtype not in KEY_DTYPES:
            raise ValueError(f"key_dtype must be one of {tuple(KEY_DTYPES)}, got {key_dtype!r}")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {
            "keys": torch.from_numpy(self.keys.copy()).to(KEY_DTYPES[key_dtype]),
            "values": torch.from_numpy(self.values.astype(np.int16)),
        }
        save_file(tensors, str(directory / TENSORS_FILE), metadata={"format_version": str(FORMAT_VERSION)})
        (directory / TENSORS_FILE).chmod(0o644)
        meta = {
            "format_version": FORMAT_VERSION,
            "kind": STORE_KIND,
            "config": self.config.to_dict(),
            "index_kind": self.index_kind,
            "entries": len(self),
            "key_dim": self.dim,
            "horizon": self.horizon,
            "n_action_tokens": N_ACTION_TOKENS,
            "key_dtype": key_dtype,
            **{k: v for k, v in self.meta.items() if k not in _RESERVED},
        }
        (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: Path | str, expect_dim: int | None = None) -> RetrievalStore:
        """Read a saved store, rebuilding its index. Missing, corrupt or inconsistent files raise
        a ValueError naming the file; ``expect_dim`` is the policy's d_model."""
        directory = Path(directory)
        if not directory.is_dir():
            raise StoreError(directory, "retrieval store directory not found (run `vla-accel build-store`)")
        meta_path, tensors_path = directory / META_FILE, directory / TENSORS_FILE
        meta = read_json_object(meta_path)
        for key in ("format_version", "kind", "config", "entries", "key_dim", "horizon"):
            if key not in meta:
                raise StoreError(meta_path, f"missing key '{key}'")
        if meta["kind"] != STORE_KIND:
            raise StoreError(meta_path, f"not a retrieval store (kind {meta['kind']!r})")
        if meta["format_version"] != FORMAT_VERSION:
            raise StoreError(meta_path, f"unknown format_version {meta['format_version']!r} "
                                             f"(this version reads {FORMAT_VERSION})")
        try:
            config = RetrievalStoreConfig.from_dict(meta["config"])
        except (TypeError, ValueError) as exc:
            raise StoreError(meta_path, f"bad config ({exc})") from exc
        if not tensors_path.is_file():
            raise StoreError(tensors_path, "file not found")
        try:
            tensors = load_file(str(tensors_path))
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise StoreError(tensors_path, f"cannot read safetensors ({type(exc).__name__}: {exc})") from exc
        for name in ("keys", "values"):
            if name not in tensors:
                raise StoreError(tensors_path, f"missing tensor '{name}'")
        keys, values = tensors["keys"], tensors["values"]
        n, d, h = int(meta["entries"]), int(meta["key_dim"]), int(meta["horizon"])
        if tuple(keys.shape) != (n, d) or not keys.is_floating_point() or not bool(torch.isfinite(keys).all()):
            raise StoreError(tensors_path, f"tensor 'keys' must be finite float ({n}, {d}) as {META_FILE} says, "
                                                f"got {keys.dtype} {tuple(keys.shape)}")
        if tuple(values.shape) != (n, h, N_ACTION_TOKENS) or values.is_floating_point():
            raise StoreError(tensors_path, f"tensor 'values' must be integer ({n}, {h}, {N_ACTION_TOKENS}), "
                                                f"got {values.dtype} {tuple(values.shape)}")
        if h != config.horizon:
            raise StoreError(meta_path, f"horizon {h} differs from the config's {config.horizon}")
        if expect_dim is not None and d != expect_dim:
            raise StoreError(meta_path, f"keys have dim {d}, the policy's embeddings {expect_dim}: "
                                             "the store was built for another model (rerun `vla-accel build-store`)")
        kind = meta.get("index_kind", "flat")
        extra = {k: v for k, v in meta.items() if k not in _RESERVED}
        try:
            store = cls(keys.float().numpy(), values.long().numpy(), config, extra, index_kind=kind)
        except ValueError as exc:
            raise StoreError(tensors_path, str(exc)) from exc
        store.key_dtype = next((name for name, dtype in KEY_DTYPES.items() if dtype == keys.dtype), "float32")
        return store

    # --- misc ---------------------------------------------------------------------------------
    @property
    def calibration(self) -> dict[str, Any] | None:
        """The boundary calibration recorded by build-store (None if the store has none)."""
        return self.meta.get("calibration")

    def close(self) -> None:
        self._index = None

    def __enter__(self) -> RetrievalStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RetrievalStore(entries={len(self)}, dim={self.dim}, horizon={self.horizon}, index={self.index_kind})"


_RESERVED = frozenset({"format_version", "kind", "config", "index_kind", "entries", "key_dim", "horizon",
                       "n_action_tokens", "key_dtype"})


def choose_index(figures: dict[str, dict[str, float]], config: RetrievalStoreConfig) -> str:
    """The exact index when its p50 fits the budget; else HNSW when its recall is enough (and it
    fits); else the faster of the two."""
    if figures["flat"]["query_ms_p50"] <= config.latency_budget_ms:
        return "flat"
    hnsw = figures["hnsw"]
    if hnsw["recall_at_1"] >= config.min_recall and hnsw["query_ms_p50"] <= config.latency_budget_ms:
        return "hnsw"
    return min(("flat", "hnsw"), key=lambda k: figures[k]["query_ms_p50"])


def default_store_dir(checkpoint: Path | str) -> Path:
    """Where build-store puts a checkpoint's store by default: CHECKPOINT/retrieval_store."""
    return Path(checkpoint) / DEFAULT_DIR_NAME


def resolve_store(store: Path | str | None, checkpoint: Path | str, expect_dim: int | None = None) -> RetrievalStore:
    """Load ``store`` or, when None, the checkpoint's default store; a missing store raises
    FileNotFoundError saying how to build one."""
    path = Path(store) if store is not None else default_store_dir(checkpoint)
    if not path.exists():
        raise FileNotFoundError(
            f"no retrieval store at {path}: the heisd decoder needs one; build it with "
            f"`vla-accel build-store --checkpoint {checkpoint} --data data/demos_v3 --out {path}`"
        )
    return RetrievalStore.load(path, expect_dim=expect_dim)


def checkpoint_fingerprint(checkpoint: Path | str) -> str | None:
    """sha256 (hex, first 16) of the checkpoint's weights file: the store's keys are only
    meaningful for the target that produced them."""
    weights = Path(checkpoint) / SINGLE_FILE
    if not weights.is_file():
        return None
    digest = hashlib.sha256()
    with weights.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def store_mismatch(store: RetrievalStore, checkpoint: Path | str) -> str | None:
    """A warning when ``store`` was built for another checkpoint than ``checkpoint`` (None if it
    matches or the store does not say)."""
    built_for = (store.meta.get("provenance") or {}).get("checkpoint_sha256")
    current = checkpoint_fingerprint(checkpoint)
    if built_for and current and built_for != current:
        return (f"the retrieval store was built for checkpoint weights {built_for}, not {current} ({checkpoint}): "
                "its keys will not match this target's embeddings; rerun `vla-accel build-store`")
    return None


__all__ = [
    "DEFAULT_DIR_NAME",
    "KEY_DTYPES",
    "RetrievalHit",
    "RetrievalStore",
    "RetrievalStoreConfig",
    "StoreError",
    "checkpoint_fingerprint",
    "choose_index",
    "default_store_dir",
    "measure_index",
    "normalise_keys",
    "resolve_store",
    "store_mismatch",
    "trajectory_values",
]
