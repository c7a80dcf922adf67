"""Action tokenizer (OpenVLA bins) and instruction byte encoding."""

import numpy as np
import pytest

from vla_accel_ros.models.tokenizer import (
    N_BINS,
    TEXT_PAD,
    ActionTokenizer,
    encode_instruction,
)


@pytest.fixture
def tokenizer() -> ActionTokenizer:
    return ActionTokenizer(q01=np.array([-0.02, -0.01, -0.03, -0.1, -0.1, -0.2, 0.0]),
                           q99=np.array([0.02, 0.03, 0.01, 0.1, 0.2, 0.2, 1.0]))


def test_round_trip_within_half_a_bin(tokenizer: ActionTokenizer) -> None:
    rng = np.random.default_rng(0)
    values = rng.uniform(tokenizer.q01, tokenizer.q99, size=(5000, 7))
    decoded = tokenizer.decode(tokenizer.encode(values))
    assert np.all(np.abs(decoded - values) <= tokenizer.bin_width / 2 + 1e-12)


def test_tokens_stay_in_range_and_255_is_never_emitted(tokenizer: ActionTokenizer) -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(0, 1.0, size=(5000, 7))
    tokens = tokenizer.encode(values)
    assert tokens.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() <= N_BINS - 2
    edges = np.stack([tokenizer.q01, tokenizer.q99])
    assert tokenizer.encode(edges).tolist() == [[0] * 7, [254] * 7]


def test_values_outside_q01_q99_are_clipped(tokenizer: ActionTokenizer) -> None:
    far = np.stack([tokenizer.q01 - 5.0, tokenizer.q99 + 5.0])
    np.testing.assert_array_equal(tokenizer.encode(far), tokenizer.encode(np.stack([tokenizer.q01, tokenizer.q99])))
    decoded = tokenizer.decode(tokenizer.encode(far))
    np.testing.assert_allclose(decoded[0], tokenizer.q01 + tokenizer.bin_width / 2)
    np.testing.assert_allclose(decoded[1], tokenizer.q99 - tokenizer.bin_width / 2)


def test_bin_width_and_monotone_tokens(tokenizer: ActionTokenizer) -> None:
    np.testing.assert_allclose(tokenizer.bin_width, (tokenizer.q99 - tokenizer.q01) / 255)
    sweep = np.linspace(tokenizer.q01, tokenizer.q99, 1000)
    assert np.all(np.diff(tokenizer.encode(sweep), axis=0) >= 0)


def test_id_255_decodes_like_254(tokenizer: ActionTokenizer) -> None:
    np.testing.assert_allclose(tokenizer.decode(np.full(7, 255)), tokenizer.decode(np.full(7, 254)))


def test_from_actions_fits_percentiles_and_handles_constant_dims() -> None:
    rng = np.random.default_rng(2)
    actions = rng.normal(0, 0.01, size=(2000, 7))
    actions[:, 3] = 0.0  # a dimension the expert never uses
    tok = ActionTokenizer.from_actions(actions)
    np.testing.assert_allclose(tok.q01[[0, 1, 2]], np.quantile(actions[:, [0, 1, 2]], 0.01, axis=0))
    np.testing.assert_allclose(tok.q99[[0, 1, 2]], np.quantile(actions[:, [0, 1, 2]], 0.99, axis=0))
    assert tok.q99[3] > tok.q01[3]
    assert np.allclose(tok.decode(tok.encode(actions))[:, 3], 0.0, atol=tok.bin_width[3])


def test_dict_round_trip(tokenizer: ActionTokenizer) -> None:
    again = ActionTokenizer.from_dict(tokenizer.to_dict())
    np.testing.assert_array_equal(again.q01, tokenizer.q01)
    np.testing.assert_array_equal(again.q99, tokenizer.q99)


@pytest.mark.parametrize(
    "q01, q99",
    [(np.zeros(7), np.zeros(7)), (np.zeros(6), np.ones(6)), (np.zeros(7), np.full(7, np.nan)),
     (np.ones(7), np.zeros(7))],
)
def test_invalid_ranges_rejected(q01: np.ndarray, q99: np.ndarray) -> None:
    with pytest.raises(ValueError):
        ActionTokenizer(q01, q99)


def test_invalid_inputs_rejected(tokenizer: ActionTokenizer) -> None:
    with pytest.raises(ValueError):
        tokenizer.encode(np.zeros(6))
    with pytest.raises(ValueError):
        tokenizer.encode(np.full(7, np.nan))
    with pytest.raises(ValueError):
        tokenizer.decode(np.full(7, 256))
    with pytest.raises(ValueError):
        tokenizer.decode(np.zeros(7, dtype=np.float32))


def test_encode_instruction() -> None:
    ids = encode_instruction("  Pick up the RED cube ", 32)
    assert ids.shape == (32,) and ids.dtype == np.int64
    assert bytes(ids[:20].astype(np.uint8)) == b"pick up the red cube"
    assert np.all(ids[20:] == TEXT_PAD)
    assert encode_instruction("abcdef", 4).tolist() == list(b"abcd")
    assert encode_instruction("é", 4)[:2].tolist() == list("é".encode())
    assert np.all(encode_instruction("", 3) == TEXT_PAD)
    with pytest.raises(ValueError):
        encode_instruction("x", 0)


def test_one_action_and_checked_tokens_take_the_fast_path_to_the_same_result(tokenizer: ActionTokenizer) -> None:
    rng = np.random.default_rng(2)
    span = tokenizer.q99 - tokenizer.q01
    values = rng.uniform(tokenizer.q01 - span, tokenizer.q99 + span, size=(3000, 7))
    values[:1000] = tokenizer.q01 + span * (tokenizer.edges[rng.integers(0, N_BINS, (1000, 7))] + 1) / 2  # bin edges
    np.testing.assert_array_equal(np.array([tokenizer.encode_one(v) for v in values]), tokenizer.encode(values))
    tokens = rng.integers(0, N_BINS - 1, size=(100, 7))
    np.testing.assert_array_equal(tokenizer.decode_checked(tokens), tokenizer.decode(tokens))
