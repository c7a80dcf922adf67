"""The control node's answer to a parameter change at run time (its on-set-parameters callback):
``instruction`` is checked (not empty, at most ``max_instruction_chars``) and taken; ``use_sim_time``,
rclpy's own and writable by default, is refused once the node is configured. The node's other
parameters are read-only unless ``ros/parameters.py`` marks them dynamic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rcl_interfaces.msg import SetParametersResult

if TYPE_CHECKING:
    from rclpy.parameter import Parameter


def sim_time_refusal(lifecycle: str) -> str:
    """Why ``use_sim_time`` cannot change in the lifecycle state ``lifecycle`` (not unconfigured)."""
    # true without /clock stopped both timers
    return (f"use_sim_time is fixed once the node is configured (it is {lifecycle}): the control timer and every "
            f"input's time run on the clock chosen then. Set it at launch, or clean the node up, set it and "
            f"configure again")


def instruction_refusal(text: str, max_chars: int) -> str:
    """Why the instruction ``text`` (stripped) is refused; '' when it is not."""
    if not text:
        return "instruction must not be empty"
    if len(text) > max_chars:
        return f"instruction has {len(text)} characters, more than max_instruction_chars = {max_chars}"
    return ""


def change_parameters(params: Sequence[Parameter], lifecycle: str, max_instruction_chars: int,
                      reject: Callable[[str], None], set_instruction: Callable[[str], None]) -> SetParametersResult:
    """The node's lifecycle state is ``lifecycle``; ``reject(message)`` counts and logs a refused
    ``use_sim_time``; ``set_instruction(text)`` takes an accepted instruction (the node ignores it
    while unconfigured: configure reads the parameter)."""
    for p in params:
        if p.name == "use_sim_time" and lifecycle != "unconfigured":
            reason = sim_time_refusal(lifecycle)
            reject(f"parameter change refused: {reason}")
            return SetParametersResult(successful=False, reason=reason)
        if p.name == "instruction":
            text = str(p.value).strip()
            if reason := instruction_refusal(text, max_instruction_chars):
                return SetParametersResult(successful=False, reason=reason)
            set_instruction(text)
    return SetParametersResult(successful=True)
