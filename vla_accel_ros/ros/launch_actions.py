"""The launch actions of the package's launch files, around the plain functions of ``launch_args``:
declared arguments, one launch_ros Node per :class:`~vla_accel_ros.ros.launch_args.NodeLaunch`, and
an on-exit handler that ends the launch when a node exits (non-zero when the node failed).

Imported only by the launch files: ``launch`` and ``launch_ros`` come with a ROS 2 distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from launch import LaunchContext, LaunchDescription
from launch.actions import (
    DeclareLaunchArgument,
    EmitEvent,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch_ros.actions import Node

from vla_accel_ros.ros.launch_args import LaunchArgument, NodeLaunch, exit_failure


def end_launch_on_exit(name: str) -> Callable[[Any, LaunchContext], list[Any]]:
    """An OnProcessExit callback: node ``name`` exiting ends the launch (non-zero when it failed)."""
    def on_exit(event: Any, context: LaunchContext) -> list[Any]:
        reason = exit_failure(name, event.returncode)
        if reason:
            raise RuntimeError(reason)  # launch logs it, shuts the rest down and exits non-zero
        return [EmitEvent(event=Shutdown(reason=f"{name} exited"))]

    return on_exit


def package_launch_description(arguments: list[LaunchArgument],
                               nodes: Callable[[Mapping[str, str]], list[NodeLaunch]]) -> LaunchDescription:
    """Declare ``arguments``; at launch time start ``nodes(argument values)``, each ending the launch
    when it exits. A bad argument raises there, which ends the launch non-zero with the message."""

    def start(context: LaunchContext) -> list[Any]:
        actions: list[Any] = []
        for spec in nodes(context.launch_configurations):
            node = Node(**spec.node_kwargs())
            actions += [node, RegisterEventHandler(OnProcessExit(target_action=node,
                                                                 on_exit=end_launch_on_exit(spec.name)))]
        return actions

    declared = [DeclareLaunchArgument(a.name, default_value=a.default, description=a.description,
                                      choices=list(a.choices) or None) for a in arguments]
    return LaunchDescription([*declared, OpaqueFunction(function=start)])
