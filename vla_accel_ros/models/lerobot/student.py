"""A LeRobot flow policy's 2-step sampler, fitted to its own 10-step sampler on the user's
demonstrations (``vla-accel train-flow --checkpoint DIR --data DIR``), kept beside the weights as
``flow_student.safetensors`` + ``flow_student.json``. Two methods:

- ``distilled``: a copy of the modules a flow step runs (the expert, the action and time
  projections; π0's state projection too; π0.5's time MLP, which conditions the expert's norms,
  in place of the action-time MLP), trained so that 2 Euler steps of its field land where
  10 steps of the policy's land from the same noise. The prefix is the policy's, unchanged.
- ``two_anchor``: the policy's own field read at two anchors, v1 = v(x1, t=1) and
  v2 = v(x1 - v1/2, t=1/2), combined by a small learned adapter into the sample,
  x0 = x1 - (a v1 + b v2 + MLP([x1, v1, v2])) per action step. It starts as the 2-step Euler
  rule (a = b = 1/2, the MLP's output zero); only the adapter is trained.

Both cost what 2 Euler steps cost: two expert passes over the cached prefix.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vla_accel_ros.models.files import read_json_object

STUDENT_WEIGHTS = "flow_student.safetensors"
STUDENT_META = "flow_student.json"
METHODS = ("distilled", "two_anchor")
FLOW_STEP_MODULES = ("expert.", "action_in_proj.", "action_out_proj.")
# what else a flow step reads, by policy type (π0 projects its state in the suffix, SmolVLA in the
# prefix; π0.5's state is in the prompt and its time MLP conditions the expert)
SUFFIX_MODULES = {"smolvla": ("action_time_mlp_in.", "action_time_mlp_out."),
                  "pi0": ("action_time_mlp_in.", "action_time_mlp_out.", "state_proj."),
                  "pi05": ("time_mlp_in.", "time_mlp_out.")}


def flow_step_names(model: nn.Module) -> list[str]:
    """The parameters a flow step reads."""
    modules = FLOW_STEP_MODULES + SUFFIX_MODULES[str(model.config.type)]
    return [name for name, _ in model.named_parameters() if name.startswith(modules)]


def flow_step_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose flow-step modules are its own and whose VLM is ``model``'s (shared)."""
    vlm_name = "vlm" if model.config.type == "smolvla" else "paligemma"
    vlm = getattr(model, vlm_name)
    setattr(model, vlm_name, None)
    try:
        student = copy.deepcopy(model)
    finally:
        setattr(model, vlm_name, vlm)
    setattr(student, vlm_name, vlm)
    return student


class TwoAnchorAdapter(nn.Module):
    """x0 from the noise x1 and the two anchor velocities (module docstring), per action step."""

    def __init__(self, width: int, hidden: int = 64) -> None:
        super().__init__()
        self.mix = nn.Parameter(torch.tensor([0.5, 0.5]))
        self.mlp = nn.Sequential(nn.Linear(3 * width, hidden), nn.SiLU(), nn.Linear(hidden, width))
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)

    def forward(self, x1: torch.Tensor, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        correction = self.mlp(torch.cat([x1, v1, v2], dim=-1))
        return x1 - (self.mix[0] * v1 + self.mix[1] * v2 + correction)  # type: ignore[no-any-return]


class FlowStudent:
    """A fitted 2-step sampler (module docstring): ``sample(velocity, noise)`` with the policy's
    ``velocity(x, t, model)`` (``model`` None = the policy's own)."""

    steps = 2

    def __init__(self, method: str, model: nn.Module | None = None, adapter: TwoAnchorAdapter | None = None,
                 meta: dict[str, Any] | None = None) -> None:
        if method not in METHODS:
            raise ValueError(f"flow student method {method!r}; supported: {', '.join(METHODS)}")
        self.method, self.model, self.adapter, self.meta = method, model, adapter, meta or {}

    @classmethod
    def fresh(cls, method: str, policy_model: nn.Module) -> FlowStudent:
        """A student that starts as 2 Euler steps of the policy's field."""
        if method == "distilled":
            return cls(method, model=flow_step_copy(policy_model))
        return cls(method, adapter=TwoAnchorAdapter(int(policy_model.config.max_action_dim)))

    def parameters(self) -> list[nn.Parameter]:
        if self.method == "distilled":
            assert self.model is not None
            names = set(flow_step_names(self.model))
            return [p for n, p in self.model.named_parameters() if n in names]
        assert self.adapter is not None
        return list(self.adapter.parameters())

    def velocity_model(self) -> nn.Module | None:
        """The model whose field a guided (real-time chunking) 2-step sampler follows: the distilled
        copy's, or for the adapter the policy's own (None)."""
        return self.model if self.method == "distilled" else None

    def sample(self, velocity: Any, noise: torch.Tensor) -> torch.Tensor:
        """The normalised sample (B, H, max_action_dim) from ``noise`` at t = 1."""
        t1 = torch.ones(noise.shape[0], device=noise.device)
        if self.method == "distilled":
            x = noise - 0.5 * velocity(noise, t1, self.model)
            return x - 0.5 * velocity(x, t1 * 0.5, self.model)
        assert self.adapter is not None
        v1 = velocity(noise, t1, None)
        v2 = velocity(noise - 0.5 * v1, t1 * 0.5, None)
        return self.adapter(noise, v1, v2)  # type: ignore[no-any-return]

    def to(self, device: torch.device) -> None:
        """Moves the student's own modules (a distilled copy shares the policy's VLM, moved with it)."""
        for module in (self.model, self.adapter):
            if module is not None:
                module.to(device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.method == "distilled":
            assert self.model is not None
            names = set(flow_step_names(self.model))
            return {n: p.detach().contiguous() for n, p in self.model.named_parameters() if n in names}
        assert self.adapter is not None
        return {f"adapter.{n}": t.detach().contiguous() for n, t in self.adapter.state_dict().items()}

    def save(self, directory: Path, meta: dict[str, Any]) -> None:
        from safetensors.torch import save_file

        save_file(self.state_dict(), str(directory / STUDENT_WEIGHTS))
        (directory / STUDENT_META).write_text(json.dumps({"method": self.method, "steps": self.steps, **meta},
                                                         indent=2))


def load_student(directory: Path, policy_model: nn.Module) -> FlowStudent | None:
    """The student kept in ``directory`` (None when there is none); ValueError naming the file at fault."""
    from safetensors.torch import load_file

    meta_path, weights_path = directory / STUDENT_META, directory / STUDENT_WEIGHTS
    if not meta_path.is_file():
        return None
    meta = read_json_object(meta_path)
    method = meta.get("method")
    if method not in METHODS:
        raise ValueError(f"{meta_path}: method {method!r}; supported: {', '.join(METHODS)}")
    if not weights_path.is_file():
        raise ValueError(f"{weights_path}: missing (named by {meta_path.name})")
    student = FlowStudent.fresh(method, policy_model)
    tensors = load_file(str(weights_path))
    if method == "two_anchor":
        assert student.adapter is not None
        own = student.adapter.state_dict()
        values = {n[len("adapter."):]: t for n, t in tensors.items() if n.startswith("adapter.")}
    else:
        assert student.model is not None
        names = set(flow_step_names(student.model))
        own = {n: p for n, p in student.model.named_parameters() if n in names}
        values = tensors
    for name, target in own.items():
        value = values.get(name)
        if value is None or tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"{weights_path}: {name} missing or of another shape than the policy's "
                             f"{tuple(target.shape)} (a student of another policy?)")
    if method == "two_anchor":
        assert student.adapter is not None
        student.adapter.load_state_dict(values)
        student.adapter.eval().requires_grad_(False)
    else:
        assert student.model is not None
        for name, parameter in student.model.named_parameters():
            if name in values:
                parameter.data = values[name].to(parameter.dtype)
        student.model.eval().requires_grad_(False)
    student.meta = meta
    return student
