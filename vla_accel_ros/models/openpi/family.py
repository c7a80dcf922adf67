"""The openpi family's registration: no directory but a server's address, ``openpi://HOST:PORT`` or
``ws://`` (a policy served over openpi's protocol); its chunks come through the flow decoders, and it
needs the arm to turn joint actions into ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.models.api import Family


def recognises(directory: Path, config: dict[str, Any] | None) -> bool:
    return False  # an address, never a directory (CheckpointRef declares it)


FAMILY = Family(
    name="openpi", marker="an openpi server's address (openpi://HOST:PORT, ws://...)",
    recognises=recognises, order=60,
    loader="vla_accel_ros.models.openpi.policy:load_resolved",
    capabilities=("flow_head", "flow_chunks"), remote=True, answers_with_chunks=True,
    action_space_of="vla_accel_ros.models.openpi.policy:executed_action_space",
)
