"""``vla-accel convert DIR``: an OpenVLA-OFT directory's ``.pt`` components (the action head, the
proprio projector: ``<component>--<step>_checkpoint.pt``) as safetensors beside them, once.

Each file is read with ``torch.load(weights_only=True)``, which unpickles nothing but tensors and
plain containers; a file that holds anything but a flat dict of tensors is refused in one line.
The ``module.`` prefix DDP training leaves on the names is stripped. A component converted before
is left as it is. Every command and the node read the safetensors only
(:mod:`vla_accel_ros.models.oft.weights`).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="the OpenVLA-OFT checkpoint directory")


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.models.load import require_family
    from vla_accel_ros.models.oft.weights import convert_directory

    require_family(args.directory, "oft", "vla-accel convert")  # bad input: one line (vla_accel_ros.cli)
    written = convert_directory(args.directory)
    print(f"{args.directory}: {len(written)} component(s) converted to safetensors")
    return 0
