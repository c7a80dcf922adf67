"""Whether a device a policy is asked to run on is one this process can use: the one check that
every command (``--device``), the control node and the inference node (parameter ``device``) make
before anything loads, through :mod:`vla_accel_ros.models.load`'s device check.

Importable without torch: torch is imported only to ask about a CUDA device, and then through
``torch.cuda.device_count()``, which reads NVML where it can and so leaves CUDA uninitialised in
the asking process (a child forked after it can still use the GPU).
"""

from __future__ import annotations

import re

DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")


def is_device_name(device: str) -> bool:
    """Whether ``device`` names where a policy can run: cpu, cuda or cuda:N."""
    return DEVICE_PATTERN.fullmatch(device) is not None


def require_device_available(device: str) -> None:
    """ValueError in one line unless this process's torch can run a policy on ``device``: empty or
    cpu (always), cuda or cuda:N (a CUDA device of that index is visible). An interpreter without
    torch passes: it loads no policy, and the process that does (an inference child with its own
    interpreter) asks its own torch."""
    if not device or device == "cpu":
        return
    if not is_device_name(device):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    try:
        import torch
    except ImportError:
        return
    visible = torch.cuda.device_count()
    index = int(device.partition(":")[2] or 0)
    if visible == 0:
        cuda = torch.version.cuda
        build = f"built with CUDA {cuda}" if cuda else "a build without CUDA"
        raise ValueError(f"device {device!r}: this torch sees no CUDA device (torch {torch.__version__}, {build}); "
                         "run on a host with a GPU, or leave the device empty for the CPU")
    if index >= visible:
        names = ", ".join(f"cuda:{i}" for i in range(visible))
        raise ValueError(f"device {device!r}: this torch sees {visible} CUDA device{'s' * (visible > 1)} ({names})")
