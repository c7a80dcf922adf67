"""The Ray Serve engine's settings (``vla-accel serve-openpi --engine ray``), importable without Ray."""

from __future__ import annotations

from dataclasses import dataclass

FLEET_INSTALL = "pip install 'vla_accel_ros[fleet]'"


@dataclass(frozen=True)
class RayServeOptions:
    """How the application is deployed.

    replicas: copies of the policy (Ray places them, restarts a dead one).
    max_batch: the most requests one round decodes.
    batch_wait_ms: how long a round waits for more requests after the first.
    num_gpus_per_replica: GPUs each replica holds (0: the CPU); with GPUs the policy runs on ``cuda``.
    address: a running Ray cluster (``ray://HOST:PORT``, or ``auto``); empty: a local Ray started here.
    max_queue: requests a replica holds waiting before it answers "busy" (0: 4 x max_batch).
    cpus_per_replica: Ray CPUs each replica reserves (its torch threads).
    """

    replicas: int = 1
    max_batch: int = 8
    batch_wait_ms: float = 5.0
    num_gpus_per_replica: float = 0.0
    address: str = ""
    max_queue: int = 0
    cpus_per_replica: float = 1.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if self.max_batch < 1:
            raise ValueError(f"--max-batch must be >= 1, got {self.max_batch}")
        if not 0 <= self.batch_wait_ms <= 10000:
            raise ValueError(f"--batch-wait-ms must be in 0..10000, got {self.batch_wait_ms}")
        if self.num_gpus_per_replica < 0:
            raise ValueError(f"--num-gpus-per-replica must be >= 0, got {self.num_gpus_per_replica}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.address and not (self.address == "auto" or self.address.startswith("ray://")):
            raise ValueError(f"--address must be ray://HOST:PORT (or auto), got {self.address!r}")

    @property
    def queue_bound(self) -> int:
        return self.max_queue or 4 * self.max_batch
