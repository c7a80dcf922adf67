"""An EAGLE-style draft head for a Hugging Face VLA (:class:`HFDraftHead`), and its files.

The head predicts the target's next final-norm hidden state from the current one and the token
just taken from it, ``f_{j+1} ~ head(emb(x_{j+1}), f_j, index j+1)``, and reads the token with the
target's own LM head (its 256 action rows, :meth:`HFTokenVLA.action_logits`). It owns no
embedding or LM head: both are the target's, frozen (:attr:`HFTokenVLA.action_embeddings`). So a
head is tied to one model's hidden size and action ids, and :func:`load_hf_draft` refuses any other.

Unlike the built-in policy's head (:class:`vla_accel_ros.models.own.draft.DraftHead`), it does not
attend to the target's KV cache: a Hugging Face cache's layout (grouped KV heads, rotary keys) is
the model's own, and the final hidden state already summarises the context that predicts the next
token. Its layers: a LayerNorm on each input (token embeddings and hidden states differ in scale
by orders of magnitude in a large model), one linear map of both into the head's ``width``, an
embedding of the action dimension being predicted (the 7 dimensions have very different
statistics), ``blocks`` pre-LN residual MLPs, and a linear map back to the target's hidden size.

On disk, beside the model: ``draft_head.safetensors`` (float32 weights) and ``draft_head.json``
(``format``, ``format_version``, ``config``, ``target``: the action ids it was trained on,
``recipe`` and ``metrics``). ``vla-accel train-draft`` writes them; never pickle.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vla_accel_ros.models.files import read_json_object
from vla_accel_ros.models.layers import MLP
from vla_accel_ros.models.sampling import pick_tokens
from vla_accel_ros.models.tokenizer import ACTION_DIM, N_BINS

DRAFT_WEIGHTS_FILE = "draft_head.safetensors"
DRAFT_META_FILE = "draft_head.json"
DRAFT_FORMAT = "vla_accel_ros.hf_draft_head"
DRAFT_FORMAT_VERSION = 1
MAX_DEFAULT_WIDTH = 1024  # a 4096-wide decoder gets a 1024-wide head: light next to one target layer


def default_width(hidden_size: int) -> int:
    """The head's width for a target of ``hidden_size``: the same, up to ``MAX_DEFAULT_WIDTH``."""
    return min(hidden_size, MAX_DEFAULT_WIDTH)


@dataclass(frozen=True)
class HFDraftConfig:
    """hidden_size: the target decoder's width (its hidden states and embeddings). vocab_size: the
    target's text vocabulary, whose action ids the head was trained on. width: the head's inner
    width; blocks: residual MLP blocks; mlp_ratio: their expansion. n_bins, n_action_tokens: ours."""

    hidden_size: int
    vocab_size: int
    width: int
    blocks: int = 2
    mlp_ratio: int = 2
    n_bins: int = N_BINS
    n_action_tokens: int = ACTION_DIM

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"draft head config: {f.name} must be a positive integer, got {value!r}")
        if self.n_bins != N_BINS or self.n_action_tokens != ACTION_DIM:
            raise ValueError(f"draft head config: n_bins {self.n_bins} and n_action_tokens {self.n_action_tokens} "
                             f"must be {N_BINS} and {ACTION_DIM}")


class HFDraftHead(nn.Module):
    """The draft network (module docstring); float32 whatever the target's dtype."""

    def __init__(self, config: HFDraftConfig) -> None:
        super().__init__()
        d, w = config.hidden_size, config.width
        self.config = config
        self.ln_token = nn.LayerNorm(d)
        self.ln_feature = nn.LayerNorm(d)
        self.fc = nn.Linear(2 * d, w)
        self.index_emb = nn.Embedding(config.n_action_tokens, w)
        self.norms = nn.ModuleList(nn.LayerNorm(w) for _ in range(config.blocks))
        self.mlps = nn.ModuleList(MLP(w, config.mlp_ratio) for _ in range(config.blocks))
        self.ln_out = nn.LayerNorm(w)
        self.out = nn.Linear(w, d)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, token_emb: torch.Tensor, feature: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """One draft step for S independent queries: token_emb, feature (B, S, d) the target's
        embedding of the token just taken and the hidden state it was taken from; index (S,) the
        action dimension each query predicts (0..6). Returns predicted hidden states (B, S, d)."""
        x = torch.cat([self.ln_token(token_emb.float()), self.ln_feature(feature.float())], dim=-1)
        x = self.fc(x) + self.index_emb(index)
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return self.out(self.ln_out(x))

    def propose(self, feature: torch.Tensor, start: int, n: int, embeddings: torch.Tensor,
                action_logits: Callable[[torch.Tensor], torch.Tensor],
                noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """n tokens after a prefix that holds ``start`` action tokens: (tokens (B, n), logits
        (B, n, 256)). ``feature`` (B, d) is the target's hidden state at the prefix end; the first
        proposal is the target's LM head of it (its own token), each later one the LM head of the
        head's prediction from the token and hidden state before. ``embeddings`` (256, d): the
        target's input embeddings of our bins; ``noise``: the step's sampling noise (7, 256), read
        as the target reads it (:func:`vla_accel_ros.models.sampling.pick_tokens`)."""
        b = feature.shape[0]
        if n == 0:
            return (torch.empty(b, 0, dtype=torch.long, device=feature.device),
                    torch.empty(b, 0, N_BINS, device=feature.device))
        if noise is not None:
            noise = noise.to(feature.device)
        current = feature.float().unsqueeze(1)
        logits = [action_logits(current)]
        tokens = [pick_tokens(logits[-1], noise, start)]
        for i in range(1, n):
            # the dimension this proposal predicts (past the last one: the last one again, as Policy)
            index = min(start + i, self.config.n_action_tokens - 1)
            position = torch.tensor([index], device=feature.device)
            current = self(embeddings[tokens[-1]], current, position)
            logits.append(action_logits(current))
            tokens.append(pick_tokens(logits[-1], noise, index))
        return torch.cat(tokens, dim=1), torch.cat(logits, dim=1)


# --- files ------------------------------------------------------------------------------------
def save_hf_draft(head: HFDraftHead, directory: Path | str, action_ids: tuple[int, int],
                  recipe: dict[str, Any], metrics: dict[str, Any]) -> Path:
    """Write ``draft_head.safetensors`` and ``draft_head.json`` into ``directory`` (the model's);
    ``action_ids``: the HF ids of bins 0 and 255 the head was trained with. Each file is written
    beside and then renamed over its final name, so a reader never sees half of one."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in head.state_dict().items()}
    meta = {"format": DRAFT_FORMAT, "format_version": DRAFT_FORMAT_VERSION, "config": asdict(head.config),
            "target": {"action_ids": [int(action_ids[0]), int(action_ids[1])]}, "recipe": recipe, "metrics": metrics}
    weights, meta_file = directory / DRAFT_WEIGHTS_FILE, directory / DRAFT_META_FILE
    partial_weights, partial_meta = (directory / f"{path.name}.partial" for path in (weights, meta_file))
    save_file(tensors, str(partial_weights),
              metadata={"format": DRAFT_FORMAT, "format_version": str(DRAFT_FORMAT_VERSION)})
    partial_meta.write_text(json.dumps(meta, indent=2) + "\n")
    for path in (partial_weights, partial_meta):
        path.chmod(0o644)  # safetensors writes 0600; a model directory is read by other users
    os.replace(partial_weights, weights)
    os.replace(partial_meta, meta_file)
    return directory


def read_hf_draft_meta(directory: Path | str) -> dict[str, Any] | None:
    """The JSON of the draft head in ``directory``, checked; None when it has no head. ValueError
    naming the file when one of the two files is missing, or the format or config is not ours."""
    directory = Path(directory)
    weights, meta_file = directory / DRAFT_WEIGHTS_FILE, directory / DRAFT_META_FILE
    if not weights.exists() and not meta_file.exists():
        return None
    for present, absent in ((weights, meta_file), (meta_file, weights)):
        if not absent.is_file():
            raise ValueError(f"{absent}: missing beside {present.name}; a draft head is both files")
    meta = read_json_object(meta_file)
    if meta.get("format") != DRAFT_FORMAT:
        raise ValueError(f"{meta_file}: not a Hugging Face VLA draft head (format {meta.get('format')!r}, "
                         f"expected {DRAFT_FORMAT!r})")
    if meta.get("format_version") != DRAFT_FORMAT_VERSION:
        raise ValueError(f"{meta_file}: unknown format_version {meta.get('format_version')!r} "
                         f"(this version reads {DRAFT_FORMAT_VERSION})")
    config, target = meta.get("config"), meta.get("target")
    if not isinstance(config, dict) or not isinstance(target, dict):
        raise ValueError(f"{meta_file}: 'config' and 'target' must be JSON objects")  # noqa: TRY004 (a bad file)
    known = {f.name for f in fields(HFDraftConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"{meta_file}: unknown config keys {unknown}")
    try:
        meta["config"] = HFDraftConfig(**config)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{meta_file}: {error}") from None
    ids = target.get("action_ids")
    if not (isinstance(ids, list) and len(ids) == 2 and all(isinstance(i, int) for i in ids)):
        raise ValueError(f"{meta_file}: target.action_ids must be the HF ids of bins 0 and {N_BINS - 1}, got {ids!r}")
    return meta


def load_hf_draft(directory: Path | str, *, hidden_size: int, vocab_size: int, action_ids: tuple[int, int],
                  device: torch.device | str = "cpu") -> HFDraftHead | None:
    """The draft head saved in ``directory``, on ``device``; None when there is none. A head made
    for another model (hidden size, text vocabulary or action ids) is refused with a ValueError
    naming the file, as are weights that are not exactly the config's."""
    meta = read_hf_draft_meta(directory)
    if meta is None:
        return None
    directory = Path(directory)
    meta_file, weights = directory / DRAFT_META_FILE, directory / DRAFT_WEIGHTS_FILE
    config: HFDraftConfig = meta["config"]
    if config.hidden_size != hidden_size:
        raise ValueError(f"{meta_file}: the draft head reads hidden states of size {config.hidden_size}, "
                         f"the model's are {hidden_size}; retrain it (vla-accel train-draft)")
    if config.vocab_size != vocab_size:
        raise ValueError(f"{meta_file}: the draft head was trained on a text vocabulary of {config.vocab_size} tokens, "
                         f"the model's has {vocab_size}; retrain it (vla-accel train-draft)")
    trained = tuple(meta["target"]["action_ids"])
    if trained != tuple(int(i) for i in action_ids):
        raise ValueError(f"{meta_file}: the draft head was trained with action ids {trained[0]}..{trained[1]}, "
                         f"the model uses {action_ids[0]}..{action_ids[1]} (vla_spec.json); retrain it")
    head = HFDraftHead(config)
    head.load_state_dict(read_weights(weights, head.state_dict()))
    return head.to(device).eval().requires_grad_(False)


def read_weights(path: Path, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float32 tensors of the safetensors file ``path``, exactly the names and shapes of
    ``expected`` and all finite; ValueError naming the file otherwise."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except Exception as error:  # safetensors raises its own error types for corrupt or truncated files
        raise ValueError(f"{path}: cannot read safetensors ({type(error).__name__}: {error})") from error
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(f"{path}: not this draft head's weights (missing {missing[:5]}, unexpected {extra[:5]})")
    for name, reference in expected.items():
        got = tensors[name]
        if tuple(got.shape) != tuple(reference.shape):
            raise ValueError(f"{path}: tensor '{name}' has shape {tuple(got.shape)}, "
                             f"{DRAFT_META_FILE}'s config gives {tuple(reference.shape)}")
        if not got.is_floating_point() or not bool(torch.isfinite(got).all()):
            raise ValueError(f"{path}: tensor '{name}' is not finite floating point")
    return {name: t.float() for name, t in tensors.items()}
