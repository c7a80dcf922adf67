"""Command-line options shared by the training commands (train, train-flow, train-parallel-draft,
train-world): the data selection, the seed, the threads and the progress bars."""

from __future__ import annotations

import argparse
from typing import Any


def add_run_arguments(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """``--seed``, ``--max-episodes``, ``--val-fraction``, ``--threads`` and ``--no-progress``, with
    the defaults of a trainer's config (``defaults``: an instance of it)."""
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--max-episodes", type=int, default=None)
    parser.add_argument("--val-fraction", type=float, default=defaults.val_fraction, help="held-out share of episodes")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch CPU threads")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide progress bars")
