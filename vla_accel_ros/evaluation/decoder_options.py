"""The inputs a decoder takes besides its settings when eval or the bench builds it: a retrieval store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_accel_ros.decoding.retrieval import resolve_store, store_mismatch
from vla_accel_ros.decoding.specs import spec_of
from vla_accel_ros.models import Policy


def decoder_options(name: str, store: Path | None, base_checkpoint: Path, policy: Policy,
                    checkpoint: Path) -> dict[str, Any]:
    """What a decoder needs besides its defaults: for one with ``retrieval_store`` (heisd), the store
    (``store``, else BASE_CHECKPOINT/retrieval_store), checked against the policy; ValueError saying how to
    build one."""
    if not spec_of(name).retrieval_store:
        return {}
    try:
        loaded = resolve_store(store, base_checkpoint, expect_dim=policy.config.d_model)
    except (FileNotFoundError, ValueError) as err:
        raise ValueError(f"--decoder {name}: {err}") from err
    warning = store_mismatch(loaded, checkpoint)
    if warning:
        print(f"warning: {warning}")
    return {"store": loaded}
