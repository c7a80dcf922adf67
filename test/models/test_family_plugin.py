"""A model family kept outside the package, added the documented way (docs/layout.md, "How to add a
model family"): a toy token VLA written into a temporary folder as a Python package of its own
(``toyvla``: its registration in ``family.py``, its policy in ``policy.py``), registered by naming
its module in ``VLA_ACCEL_FAMILIES`` with the folder on ``PYTHONPATH``, and run through
``vla-accel predict`` and one ``vla-accel eval`` episode in child processes, with no edit anywhere
in the package.

The toy is a tiny deterministic torch model (weights drawn from the seed its ``config.json``
holds): the image pooled to 4 x 4 and the instruction's bytes make the prefix's hidden state, each
action token one recurrent step after it, a linear head the logits over the bins. It declares one
capability, token scoring, and implements :class:`~vla_accel_ros.models.api.TokenScoring` in full;
its loader reads the directory's ``config.json`` as the resolved checkpoint carries it. A second
family, marked by a file of its own (``toy.json``) and no ``config.json``, resolves in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FAMILY_NAME = "toyvla"
IMAGE_SIZE = 64
MAX_STEPS = 5

TOY_FAMILY = '''
"""The toy family's registration: a directory whose config.json says model_type "toyvla"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.api import Family

MODEL_TYPE = "toyvla"


def recognises(directory: Path, config: dict[str, Any] | None) -> bool:
    return config is not None and config.get("model_type") == MODEL_TYPE


def check_files(directory: Path, config: dict[str, Any] | None, unnorm_key: str = "") -> None:
    if unnorm_key:
        raise ValueError(f"{directory}: a toy VLA has one set of statistics; unnorm_key does not apply")
    for key in ("d_model", "image_size", "q01", "q99", "seed"):
        if key not in (config or {}):
            raise ValueError(f"{directory / 'config.json'}: missing {key!r}")


FAMILY = Family(
    name="toyvla", marker='config.json with model_type "toyvla"', recognises=recognises,
    loader="toyvla.policy:load_resolved", checker="toyvla.family:check_files",
    capabilities=("token_scoring",),
)
'''

TOY_POLICY = '''
"""The toy token VLA: a tiny recurrent model over action tokens after a pooled image and instruction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vla_accel_ros.models.api import LoadOptions, PolicyCapabilities, Prefix, ResolvedCheckpoint, ScoreOutput
from vla_accel_ros.models.tokenizer import N_BINS, ActionTokenizer, encode_instruction

TEXT_LENGTH = 16
POOLED_SIDE = 4


@dataclass(frozen=True)
class ToyConfig:
    d_model: int
    image_size: int
    seed: int
    n_action_tokens: int = 7
    n_bins: int = N_BINS


@dataclass(frozen=True)
class ToyCache:
    """Every position's hidden state (B, L, d): what a prefix holds."""

    states: torch.Tensor

    def cropped(self, length: int) -> ToyCache:
        return ToyCache(self.states[:, :length])

    def rows(self, rows: list[int]) -> ToyCache:
        return ToyCache(self.states[rows])


class ToyPolicy(torch.nn.Module):
    def __init__(self, config: ToyConfig, tokenizer: ActionTokenizer) -> None:
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer
        d = config.d_model
        self.image = torch.nn.Linear(3 * POOLED_SIDE * POOLED_SIDE, d)
        self.text = torch.nn.Embedding(257, d)
        self.step_in = torch.nn.Embedding(config.n_bins, d)
        self.step = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, config.n_bins)
        generator = torch.Generator().manual_seed(config.seed)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
        self.eval()

    @property
    def n_action_tokens(self) -> int:
        return self.config.n_action_tokens

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    def capabilities(self) -> PolicyCapabilities:
        return PolicyCapabilities(token_scoring=True)

    def n_parameters(self) -> dict[str, int]:
        return {"toy": sum(p.numel() for p in self.parameters())}

    def _start(self, observations: Sequence) -> torch.Tensor:
        images = torch.stack([torch.from_numpy(np.ascontiguousarray(o.image)).float().permute(2, 0, 1) / 255.0
                              for o in observations])
        pooled = torch.nn.functional.adaptive_avg_pool2d(images, POOLED_SIDE).flatten(1)
        text = torch.stack([torch.from_numpy(encode_instruction(o.instruction, TEXT_LENGTH))
                            for o in observations])
        return torch.tanh(self.image(pooled) + self.text(text).mean(dim=1))

    def prefill(self, obs) -> Prefix:
        return self.prefill_batch([obs]).prefix

    def prefill_batch(self, observations: Sequence, tokens: torch.Tensor | None = None) -> ScoreOutput:
        start = self._start(observations)
        empty = torch.zeros((len(observations), 0), dtype=torch.long)
        prefix = Prefix(cache=ToyCache(start[:, None]), action_hidden=start[:, None], tokens=empty, pooled=start,
                        prefix_len=1)
        return self.score(prefix, empty if tokens is None else tokens)

    def score(self, prefix: Prefix, tokens: torch.Tensor) -> ScoreOutput:
        hidden = [prefix.hidden_last]
        for i in range(tokens.shape[1]):
            hidden.append(torch.tanh(self.step(hidden[-1]) + self.step_in(tokens[:, i])))
        states = torch.stack(hidden, dim=1)
        new = states[:, 1:]
        extended = Prefix(cache=ToyCache(torch.cat([prefix.cache.states, new], dim=1)),
                          action_hidden=torch.cat([prefix.action_hidden, new], dim=1),
                          tokens=torch.cat([prefix.tokens, tokens.to(prefix.tokens.dtype)], dim=1),
                          pooled=prefix.pooled, prefix_len=prefix.prefix_len, base=prefix.n_tokens)
        return ScoreOutput(self.head(states).float(), extended)

    def tokens_to_action(self, tokens: np.ndarray) -> np.ndarray:
        return self.tokenizer.decode(np.asarray(tokens, dtype=np.int64))


def load_resolved(checkpoint: ResolvedCheckpoint, options: LoadOptions) -> ToyPolicy:
    config = checkpoint.config or {}
    tokenizer = ActionTokenizer(np.asarray(config["q01"]), np.asarray(config["q99"]))
    return ToyPolicy(ToyConfig(d_model=int(config["d_model"]), image_size=int(config["image_size"]),
                               seed=int(config["seed"])), tokenizer)
'''

TOY_CONFIG = {"model_type": FAMILY_NAME, "d_model": 16, "image_size": IMAGE_SIZE, "seed": 0,
              "q01": [-0.01] * 3 + [-0.02] * 3 + [0.0], "q99": [0.01] * 3 + [0.02] * 3 + [1.0]}


# A family whose directories hold no config.json: a marker file of its own, read by its recogniser only.
MARKER_FAMILY = '''
"""A family marked by toy.json alone."""

from vla_accel_ros.models.api import Family


def recognises(directory, config):
    return (directory / "toy.json").is_file()


FAMILY = Family(name="toymarker", marker="toy.json", recognises=recognises, loader="toyvla.policy:load_resolved")
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The toy family's package (``plugins/toyvla``), a checkpoint of it and an image."""
    from PIL import Image

    root = tmp_path_factory.mktemp("toy_family")
    package = root / "plugins" / FAMILY_NAME
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A toy model family kept outside vla_accel_ros."""\n')
    (package / "family.py").write_text(textwrap.dedent(TOY_FAMILY).lstrip())
    (package / "policy.py").write_text(textwrap.dedent(TOY_POLICY).lstrip())
    (root / "plugins" / "toymarker").mkdir()
    (root / "plugins" / "toymarker" / "__init__.py").write_text("")
    (root / "plugins" / "toymarker" / "family.py").write_text(textwrap.dedent(MARKER_FAMILY).lstrip())
    checkpoint = root / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(TOY_CONFIG))
    image = root / "frame.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8)).save(image)
    return {"plugins": root / "plugins", "checkpoint": checkpoint, "image": image, "root": root}


def run_cli(toy: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m vla_accel_ros.cli ARGS`` with the toy family registered as the docs say."""
    path = os.pathsep.join(p for p in (str(toy["plugins"]), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, VLA_ACCEL_FAMILIES=f"{FAMILY_NAME}.family",
               MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    return subprocess.run([sys.executable, "-m", "vla_accel_ros.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_the_toy_family_is_not_known_without_its_registration(toy) -> None:
    proc = subprocess.run([sys.executable, "-m", "vla_accel_ros.cli", "predict", "--checkpoint",
                           str(toy["checkpoint"]), "--image", str(toy["image"]), "--instruction", "pick", "--json"],
                          env={k: v for k, v in os.environ.items() if k != "VLA_ACCEL_FAMILIES"},
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.startswith("predict: error: "), proc.stderr


def test_predict_through_the_toy_family(toy) -> None:
    proc = run_cli(toy, "predict", "--checkpoint", str(toy["checkpoint"]), "--image", str(toy["image"]),
                   "--instruction", "pick up the red cube", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["family"] == FAMILY_NAME and out["decoder"] == "ar"  # the baseline, which every token policy runs
    action = np.array(out["action"])
    assert action.shape == (7,) and np.all(np.isfinite(action))
    assert len(out["action_token_ids"]) == 7 and all(0 <= t < 255 for t in out["action_token_ids"])
    assert out["target_passes"] == 7  # ar: one pass per token after the prefill
    again = json.loads(run_cli(toy, "predict", "--checkpoint", str(toy["checkpoint"]), "--image", str(toy["image"]),
                               "--instruction", "pick up the red cube", "--json").stdout)
    assert again["action_token_ids"] == out["action_token_ids"]  # the toy is deterministic


def test_one_eval_episode_through_the_toy_family(toy) -> None:
    out = toy["root"] / "eval"
    proc = run_cli(toy, "eval", "--checkpoint", str(toy["checkpoint"]), "--decoder", "ar", "--episodes", "1",
                   "--max-steps", str(MAX_STEPS), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 1 and len(summary["per_episode"]) == 1
    assert summary["checkpoint"] == str(toy["checkpoint"]) and summary["decoder"] == "ar"
    assert set(summary["params_by_part"]) == {"toy"}  # the toy's own n_parameters()
    assert summary["actions"] == summary["per_episode"][0]["steps"] == MAX_STEPS
    assert summary["target_passes_per_action"] == 7.0  # the toy's passes, one per token


def test_a_family_with_a_marker_file_of_its_own_resolves(toy, tmp_path, monkeypatch) -> None:
    """The registry asks the family's recogniser; nothing else in the package needs the directory
    to hold a file of another family's (model.json, config.json)."""
    from vla_accel_ros.core.actions import EE_DELTA
    from vla_accel_ros.models.load import resolve_checkpoint

    monkeypatch.syspath_prepend(str(toy["plugins"]))
    monkeypatch.setenv("VLA_ACCEL_FAMILIES", "toymarker.family")
    (tmp_path / "toy.json").write_text("{}")
    resolved = resolve_checkpoint(tmp_path)
    assert resolved.family == "toymarker" and resolved.config is None and resolved.action_space == EE_DELTA
