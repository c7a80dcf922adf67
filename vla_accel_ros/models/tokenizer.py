"""Action and instruction tokenizers.

Actions follow the OpenVLA convention: each of the 7 dimensions is normalised to [-1, 1] by the
training data's 1st/99th percentiles, clipped, and digitised against ``linspace(-1, 1, 256)``.
That gives 255 bins (token ids 0..254); id 255 exists in the vocabulary but is never emitted, so
the model's output layer has ``N_BINS = 256`` classes. Decoding returns bin centres, so a round
trip is exact to half a bin.

Instructions are plain UTF-8 bytes (ids 0..255) padded with ``TEXT_PAD = 256``.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

N_BINS = 256  # vocabulary of action tokens (ids 0..255; 255 is never emitted)
BOS = N_BINS  # action-embedding id that starts the action (vocabulary 257 = 256 bins + BOS)
N_CENTRES = N_BINS - 1
ACTION_DIM = 7
TEXT_VOCAB = 257  # 256 byte values + pad
TEXT_PAD = 256
# A dimension whose q01 == q99 (e.g. an axis the expert never rotates) still needs a non-empty
# range, otherwise normalisation divides by zero. Half-width of the range forced on such a dimension.
_MIN_HALF_RANGE = 1e-4


BIN_EDGES = np.linspace(-1.0, 1.0, N_BINS)  # OpenVLA's bin edges on [-1, 1]; never written to


def digitise(normalised: np.ndarray) -> np.ndarray:
    """Bins (...) int64 in [0, 255) of values normalised to [-1, 1] (OpenVLA's binning)."""
    # digitize gives 1..256 on [-1, 1]; the top edge (exactly +1) folds into the last bin.
    return np.clip(np.digitize(normalised, BIN_EDGES) - 1, 0, N_CENTRES - 1).astype(np.int64)


class ActionTokenizer:
    """Maps continuous 7-D actions to token ids in [0, 255) and back."""

    def __init__(self, q01: np.ndarray, q99: np.ndarray) -> None:
        q01 = np.asarray(q01, dtype=np.float64).reshape(-1)
        q99 = np.asarray(q99, dtype=np.float64).reshape(-1)
        if q01.shape != (ACTION_DIM,) or q99.shape != (ACTION_DIM,):
            raise ValueError(f"q01 and q99 must have shape ({ACTION_DIM},), got {q01.shape} and {q99.shape}")
        if not (np.all(np.isfinite(q01)) and np.all(np.isfinite(q99))):
            raise ValueError("q01 and q99 must be finite")
        if np.any(q99 <= q01):
            bad = np.nonzero(q99 <= q01)[0].tolist()
            raise ValueError(f"q99 must be greater than q01 in every dimension; not so in dims {bad}")
        self.q01 = q01
        self.q99 = q99
        self.edges = BIN_EDGES
        self.centres = (self.edges[:-1] + self.edges[1:]) / 2.0
        # (255, 7): the action value of every token id in every dimension, by the same arithmetic
        # as ``denormalise`` (so ``decode`` is one lookup, bit for bit the same)
        self._token_values = self.denormalise(np.repeat(self.centres[:, None], ACTION_DIM, axis=1))
        self._dims = np.arange(ACTION_DIM)
        self._q01, self._q99, self._edges = q01.tolist(), q99.tolist(), self.edges.tolist()  # for encode_one

    @classmethod
    def from_actions(cls, actions: np.ndarray) -> ActionTokenizer:
        """Fit q01/q99 on a dataset of actions (N, 7); degenerate dimensions get a tiny range."""
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[1] != ACTION_DIM or actions.shape[0] == 0:
            raise ValueError(f"actions must have shape (N>0, {ACTION_DIM}), got {actions.shape}")
        if not np.all(np.isfinite(actions)):
            raise ValueError("actions contain NaN or inf")
        q01 = np.quantile(actions, 0.01, axis=0)
        q99 = np.quantile(actions, 0.99, axis=0)
        mid = (q01 + q99) / 2.0
        half = np.maximum((q99 - q01) / 2.0, _MIN_HALF_RANGE)
        return cls(mid - half, mid + half)

    @property
    def bin_width(self) -> np.ndarray:
        """Width of one bin in action units, per dimension: (q99 - q01) / 255."""
        return (self.q99 - self.q01) / N_CENTRES

    def normalise(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        return np.clip(2.0 * (values - self.q01) / (self.q99 - self.q01) - 1.0, -1.0, 1.0)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Tokens (..., 7) int64 in [0, 255) for actions (..., 7); values outside q01/q99 are clipped."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape[-1:] != (ACTION_DIM,):
            raise ValueError(f"actions must end in dimension {ACTION_DIM}, got shape {values.shape}")
        if not np.all(np.isfinite(values)):
            raise ValueError("actions contain NaN or inf")
        return digitise(self.normalise(values))

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """Actions (..., 7) float64 at the bin centres of tokens (..., 7); id 255 decodes as 254."""
        tokens = np.asarray(tokens)
        if tokens.shape[-1:] != (ACTION_DIM,):
            raise ValueError(f"tokens must end in dimension {ACTION_DIM}, got shape {tokens.shape}")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must be integers, got dtype {tokens.dtype}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= N_BINS):
            raise ValueError(f"tokens must lie in [0, {N_BINS})")
        return self.decode_checked(np.minimum(tokens, N_CENTRES - 1))

    def decode_checked(self, tokens: np.ndarray) -> np.ndarray:
        """:meth:`decode` of tokens (..., 7) known to be integers in [0, 255) (a decoder's own,
        clipped): one table lookup, without the checks."""
        return self._token_values[tokens, self._dims]

    def encode_one(self, action: np.ndarray) -> np.ndarray:
        """:meth:`encode` of one finite action (7,), by the same arithmetic on plain floats (a
        decoder encodes one prediction per control step, where NumPy's calls cost more)."""
        tokens = []
        for value, low, high in zip(np.asarray(action, dtype=np.float64).tolist(), self._q01, self._q99):
            normalised = min(max(2.0 * (value - low) / (high - low) - 1.0, -1.0), 1.0)
            tokens.append(min(max(bisect.bisect_right(self._edges, normalised) - 1, 0), N_CENTRES - 1))
        return np.array(tokens, dtype=np.int64)

    def denormalise(self, normalised: np.ndarray) -> np.ndarray:
        """Actions (..., 7) from normalised values in [-1, 1] (clipped): the inverse of ``normalise``."""
        normalised = np.clip(np.asarray(normalised, dtype=np.float64), -1.0, 1.0)
        return (normalised + 1.0) / 2.0 * (self.q99 - self.q01) + self.q01

    def to_dict(self) -> dict[str, Any]:
        return {"type": "openvla_bins", "n_bins": N_BINS, "q01": self.q01.tolist(), "q99": self.q99.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActionTokenizer:
        for key in ("q01", "q99"):
            if key not in data:
                raise ValueError(f"tokenizer entry is missing '{key}'")
        if int(data.get("n_bins", N_BINS)) != N_BINS:
            raise ValueError(f"tokenizer has n_bins={data['n_bins']}, this version supports {N_BINS}")
        return cls(np.asarray(data["q01"], dtype=np.float64), np.asarray(data["q99"], dtype=np.float64))

    def __repr__(self) -> str:
        return f"ActionTokenizer(q01={np.round(self.q01, 5).tolist()}, q99={np.round(self.q99, 5).tolist()})"


def encode_instruction(text: str, max_len: int) -> np.ndarray:
    """Byte ids (max_len,) int64 of the instruction, lower-cased and stripped, truncated, then padded.

    Lower-casing makes "Pick up the Red cube" and "pick up the red cube" the same prompt.
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    data = text.strip().lower().encode("utf-8")[:max_len]
    ids = np.full(max_len, TEXT_PAD, dtype=np.int64)
    ids[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return ids
