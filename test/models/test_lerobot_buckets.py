"""Bucketed incremental vision (models/lerobot/buckets.py) on the LeRobot fixture policies: the same
chunks as unbucketed incremental vision and, on an unchanged frame, as the full prefix; the padding
rows change nothing; the per-frame choice against the full prefix from a cost table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vla_accel_ros.models.configuration import VisionReuseConfig  # noqa: E402
from vla_accel_ros.models.lerobot.buckets import (  # noqa: E402
    BucketedIncrementalPrefix,
    PrefixCosts,
    bucket_sizes,
    choose_prefix_pass,
    token_axis,
)
from vla_accel_ros.models.lerobot.checkpoint import load_lerobot  # noqa: E402
from vla_accel_ros.models.lerobot.cuda_graph import prefix_tensors  # noqa: E402
from vla_accel_ros.models.lerobot.incremental import IncrementalPrefix  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
TOKENIZERS = {"smolvla": FIXTURES / "tokenizers" / "smolvlm2", "pi0": FIXTURES / "tokenizers" / "paligemma",
              "pi05": FIXTURES / "tokenizers" / "paligemma"}
SETTINGS = VisionReuseConfig(threshold=8.0, refresh_steps=100, max_drift=2.0, reuse_kv=True)
BUCKETS = (0.125, 0.25, 0.5, 1.0)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_bucket_sizes_are_zero_and_each_fractions_share_rounded_up() -> None:
    assert bucket_sizes(32, BUCKETS) == (0, 4, 8, 16, 32)
    assert bucket_sizes(192, (0.3, 1.0)) == (0, 58, 192)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        bucket_sizes(32, (0.0, 1.0))


def test_the_choice_takes_the_smallest_bucket_unless_the_full_prefix_costs_less() -> None:
    sizes = (0, 4, 8, 16)
    assert choose_prefix_pass(0, 0, sizes, None).bucket == 0
    assert choose_prefix_pass(5, 1, sizes, None).bucket == 8
    assert choose_prefix_pass(17, 2, sizes, None).bucket is None  # larger than every bucket
    costs = PrefixCosts(full_ms=10.0, tower_ms={1: 3.0, 2: 6.0}, rows_ms={0: 1.0, 4: 2.0, 8: 4.5, 16: 9.0})
    assert choose_prefix_pass(0, 0, sizes, costs).bucket == 0  # no tower to run: 1 ms
    assert choose_prefix_pass(3, 1, sizes, costs).bucket == 4  # 3 + 2 < 10
    assert choose_prefix_pass(6, 2, sizes, costs).bucket is None  # 6 + 4.5 >= 10
    assert choose_prefix_pass(6, 1, sizes, costs).bucket == 8  # 3 + 4.5 < 10
    assert choose_prefix_pass(12, 1, sizes, costs).bucket is None  # 3 + 9 >= 10
    unpriced = PrefixCosts(full_ms=1.0, tower_ms={}, rows_ms={0: 5.0})
    assert choose_prefix_pass(3, 1, sizes, unpriced).bucket == 4  # no measured cost: the partial pass
    assert choose_prefix_pass(0, 0, sizes, unpriced).bucket is None  # measured: 5 >= 1


@pytest.fixture(scope="module", params=["smolvla", "pi0", "pi05"])
def policy(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return load_lerobot(FIXTURES / request.param, tokenizer_dir=TOKENIZERS[request.param])


def reference(policy) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    return dict(np.load(FIXTURES / f"{policy.config.type}_reference.npz"))


def inverted(image: np.ndarray, rows: slice, columns: slice) -> np.ndarray:
    changed = image.copy()
    changed[rows, columns] = 255 - changed[rows, columns]
    return changed


def frames(ref: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
    """A stream: a first frame, the same again, one camera's corner moved, both cameras moved in a
    few places, the same again."""
    front, wrist = ref["front"][0], ref["wrist"][0]
    corner = inverted(front, slice(0, 30), slice(0, 30))
    both = [inverted(corner, slice(60, 90), slice(0, 20)), inverted(wrist, slice(40, 64), slice(40, 64))]
    return [[front, wrist], [front, wrist], [corner, wrist], both, both]


def assert_same_valid_rows(prefix, expected) -> None:  # type: ignore[no-untyped-def]
    """Every layer's keys and values at the valid tokens (a masked token's are never read: a query
    of one attends to nothing valid, over a key set the extra slot makes one longer)."""
    valid = expected.pad_masks[0]
    axis = token_axis(expected)
    torch.testing.assert_close(prefix.pad_masks, expected.pad_masks, rtol=0, atol=0)
    for a, b in zip(prefix_tensors(prefix), prefix_tensors(expected)[:-2], strict=False):
        assert a.shape == b.shape  # the extra slot of the padding rows is cut off
        torch.testing.assert_close(a.movedim(axis, 0)[valid], b.movedim(axis, 0)[valid], rtol=0, atol=1e-5)


def test_bucketed_incremental_vision_gives_the_chunks_of_incremental_vision(policy) -> None:  # type: ignore[no-untyped-def]
    ref = reference(policy)
    task, state, noise = str(ref["tasks"][0]), ref["state"][0], ref["noise"][0]
    plain = policy.incremental_vision(SETTINGS, buckets=())
    bucketed = policy.incremental_vision(SETTINGS, buckets=BUCKETS)
    assert type(plain) is IncrementalPrefix and isinstance(bucketed, BucketedIncrementalPrefix)
    padded = 0
    for images in frames(ref):
        expected = policy.predict_chunk(images, state, task, noise=noise, incremental=plain)
        chunk = policy.predict_chunk(images, state, task, noise=noise, incremental=bucketed)
        assert bucketed.last == plain.last
        np.testing.assert_allclose(chunk.normalized, expected.normalized, rtol=0, atol=1e-5)
        np.testing.assert_allclose(chunk.actions, expected.actions, rtol=0, atol=1e-5)
        assert_same_valid_rows(bucketed._prefix, plain._prefix)
        choice = bucketed.last_choice
        if choice is not None and choice.bucket is not None:
            padded += choice.bucket - bucketed.last.recomputed
    assert padded > 0  # some frame ran padding rows, and they changed nothing


def test_on_an_unchanged_frame_the_bucketed_prefix_gives_the_full_prefixs_chunk(policy) -> None:  # type: ignore[no-untyped-def]
    ref = reference(policy)
    task, noise = str(ref["tasks"][0]), ref["noise"][0]
    images = [ref["front"][0], ref["wrist"][0]]
    bucketed = policy.incremental_vision(SETTINGS, buckets=BUCKETS)
    policy.predict_chunk(images, ref["state"][0], task, noise=noise, incremental=bucketed)
    # π0.5's state is in the language, which its image tokens attend to: the same state there
    state = ref["state"][0 if policy.config.type == "pi05" else 1]
    chunk = policy.predict_chunk(images, state, task, noise=noise, incremental=bucketed)
    assert bucketed.last.recomputed == 0 and not bucketed.last.refreshed and bucketed.last_choice.bucket == 0
    full = policy.predict_chunk(images, state, task, noise=noise)
    np.testing.assert_allclose(chunk.normalized, full.normalized, rtol=0, atol=1e-5)


def test_a_cost_table_that_prices_the_partial_pass_above_the_full_prefix_makes_a_refresh(policy) -> None:  # type: ignore[no-untyped-def]
    ref = reference(policy)
    task, state, noise = str(ref["tasks"][0]), ref["state"][0], ref["noise"][0]
    stream = frames(ref)
    n_image = BucketedIncrementalPrefix(policy, SETTINGS).n_image_tokens(policy.inputs(stream[0], state, task))
    sizes = bucket_sizes(n_image, BUCKETS)
    # the unchanged frame's pass is cheap, every pass with a tower dearer than the full prefix
    costs = PrefixCosts(full_ms=5.0, tower_ms={1: 4.0, 2: 8.0}, rows_ms={size: 1.0 + size for size in sizes})
    bucketed = policy.incremental_vision(SETTINGS, buckets=BUCKETS, costs=costs)
    for images in stream[:2]:
        policy.predict_chunk(images, state, task, noise=noise, incremental=bucketed)
    assert bucketed.last_choice.bucket == 0 and not bucketed.last.refreshed
    chunk = policy.predict_chunk(stream[2], state, task, noise=noise, incremental=bucketed)
    assert bucketed.last.refreshed and bucketed.last.reason == bucketed.cheaper_in_full
    assert bucketed.last_choice.bucket is None and ">= full" in bucketed.last_choice.reason
    full = policy.predict_chunk(stream[2], state, task, noise=noise)
    np.testing.assert_allclose(chunk.normalized, full.normalized, rtol=0, atol=0)
    # the full frame became the reference: the same frame again recomputes no image token
    policy.predict_chunk(stream[2], state, task, noise=noise, incremental=bucketed)
    assert bucketed.last.recomputed == 0 and bucketed.last_choice.bucket == 0


def test_the_cost_table_measured_on_this_device_prices_every_bucket_and_camera_count(policy) -> None:  # type: ignore[no-untyped-def]
    ref = reference(policy)
    inputs = policy.inputs([ref["front"][0], ref["wrist"][0]], ref["state"][0], str(ref["tasks"][0]))
    bucketed = policy.incremental_vision(SETTINGS, buckets=BUCKETS)
    assert not bucketed.measure_on_first_frame  # on the CPU no table unless given
    with torch.inference_mode():
        before = [t.clone() for t in prefix_tensors(bucketed.prefix(inputs))]
        costs = bucketed.measure_costs(inputs, repeats=1)
    assert set(costs.rows_ms) == set(bucketed.sizes(bucketed.n_image_tokens(inputs)))
    assert set(costs.tower_ms) == {1, 2} and costs.full_ms > 0
    assert all(ms > 0 for ms in [*costs.rows_ms.values(), *costs.tower_ms.values()])
    for a, b in zip(prefix_tensors(bucketed._prefix), before, strict=True):  # measuring leaves the cache as it was
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@CUDA
@pytest.mark.parametrize("kind", ["smolvla", "pi0", "pi05"])
def test_cuda_bucketed_graphs_agree_with_the_eager_bucketed_passes(kind: str) -> None:
    policy = load_lerobot(FIXTURES / kind, tokenizer_dir=TOKENIZERS[kind], device="cuda")
    ref = reference(policy)
    task, state, noise = str(ref["tasks"][0]), ref["state"][0], ref["noise"][0]
    # a table that prices nothing: every frame takes the partial pass, graphed and eager alike
    unpriced = PrefixCosts(0.0, {}, {})
    graphed = policy.incremental_vision(SETTINGS, costs=unpriced)  # bucketed by default on a GPU
    assert isinstance(graphed, BucketedIncrementalPrefix)
    policy.cuda_graphs = False
    eager = policy.incremental_vision(SETTINGS, buckets=BUCKETS, costs=unpriced)
    policy.cuda_graphs = True
    for images in frames(ref):
        chunk = policy.predict_chunk(images, state, task, noise=noise, incremental=graphed)
        policy.cuda_graphs = False
        expected = policy.predict_chunk(images, state, task, noise=noise, incremental=eager)
        policy.cuda_graphs = True
        assert graphed.last == eager.last
        np.testing.assert_allclose(chunk.normalized, expected.normalized, rtol=0, atol=1e-5)
    assert graphed.graph_errors == [] and graphed.graph_shapes >= 3  # 1 and 2 cameras' towers, buckets
    measured = policy.incremental_vision(SETTINGS)  # its table measured on the first frame
    assert measured.measure_on_first_frame
    for images in frames(ref):
        chunk = policy.predict_chunk(images, state, task, noise=noise, incremental=measured)
        assert np.isfinite(chunk.actions).all()
    assert measured.costs is not None and measured.costs.full_ms > 0 and measured.graph_errors == []
