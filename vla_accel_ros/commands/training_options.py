"""The flags shared by the training commands (train, train-flow, train-parallel-draft, train-draft,
train-world, train-hf): the data selection, the seed, the threads and the progress bars, and the
optimiser of the draft-head trainers; a trainer config's defaults without building one, and the
trainer's config from the parsed flags."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from types import SimpleNamespace
from typing import Any


def add_run_arguments(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """``--seed``, ``--max-episodes``, ``--val-fraction``, ``--threads`` and ``--no-progress``, with
    the defaults of a trainer's config (``defaults``: :func:`config_defaults` of it)."""
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--max-episodes", type=int, default=None)
    parser.add_argument("--val-fraction", type=float, default=defaults.val_fraction, help="held-out share of episodes")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch CPU threads")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide progress bars")


def add_draft_optimiser_arguments(parser: argparse.ArgumentParser, defaults: Any, feature: str) -> None:
    """``--epochs``, ``--batch-size``, ``--lr``, ``--weight-decay``, ``--warmup-steps`` and
    ``--feature-weight`` of a draft-head trainer (``feature``: what its feature regression fits)."""
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate")
    parser.add_argument("--weight-decay", type=float, default=defaults.weight_decay)
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--feature-weight", type=float, default=defaults.feature_weight,
                        help=f"weight of the {feature} regression next to the token cross-entropy")


def config_defaults(config_type: type[Any]) -> SimpleNamespace:
    """The default of each field of the config dataclass ``config_type`` that has one, by name:
    the flags' defaults, read without building (and checking) a config."""
    return SimpleNamespace(**{f.name: f.default for f in fields(config_type) if f.default is not MISSING})


def config_from_args(config_type: type[Any], args: argparse.Namespace) -> Any:
    """The config dataclass ``config_type`` from the parsed flags that name its fields."""
    names = {f.name for f in fields(config_type)}
    return config_type(**{k: v for k, v in vars(args).items() if k in names})
