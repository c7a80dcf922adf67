"""ROS 2 parameter files read without ROS: which sections apply to a node, in which order, and the
errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vla_accel_ros.core.params_file import fully_qualified_name, read_node_parameters

NODE = "vla_accel_node"


@pytest.mark.parametrize("text, namespace, expected", [
    pytest.param("vla_accel_node:\n  ros__parameters:\n    decoder: ar\n    control_rate_hz: 50\n", "",
                 {"decoder": "ar", "control_rate_hz": 50}, id="node-section"),
    pytest.param("/vla_accel_node:\n  ros__parameters:\n    decoder: ar\n", "", {"decoder": "ar"}, id="slash-key"),
    pytest.param("/**:\n  ros__parameters:\n    use_sim_time: true\n", "", {"use_sim_time": True}, id="wildcard-only"),
    pytest.param("vla_accel_node:\n  ros__parameters:\n    decoder: sd\n/**:\n  ros__parameters:\n    decoder: ar\n"
                 "    tcp_frame: tool\n", "", {"decoder": "sd", "tcp_frame": "tool"},
                 id="the-node-section-wins-over-the-wildcard-in-any-order"),
    pytest.param("/arm1/vla_accel_node:\n  ros__parameters:\n    decoder: ar\nvla_accel_node:\n  ros__parameters:\n"
                 "    decoder: sd\n", "arm1", {"decoder": "ar"}, id="namespaced-slash"),
    pytest.param("arm1/vla_accel_node:\n  ros__parameters:\n    decoder: ar\n", "/arm1", {"decoder": "ar"},
                 id="namespaced-relative"),
    pytest.param("arm1:\n  vla_accel_node:\n    ros__parameters:\n      decoder: ar\n", "arm1", {"decoder": "ar"},
                 id="namespace-as-mapping"),
    pytest.param("/**/vla_accel_node:\n  ros__parameters:\n    a: 1\n/arm1/*:\n  ros__parameters:\n    b: 2\n"
                 "/arm2/*:\n  ros__parameters:\n    c: 3\n", "arm1", {"a": 1, "b": 2}, id="wildcard-patterns"),
    pytest.param("vla_accel_node:\n  ros__parameters:\n    vision:\n      threshold: 0.1\n      reuse: true\n"
                 "    joints: [a, b]\n", "", {"vision.threshold": 0.1, "vision.reuse": True, "joints": ["a", "b"]},
                 id="nested-mappings-flatten-with-dots"),
    pytest.param("sim_node:\n  ros__parameters:\n    seed: 3\nvla_accel_node:\n  ros__parameters:\n", "", {},
                 id="an-empty-section-and-another-node's"),
])
def test_read_node_parameters(tmp_path: Path, text: str, namespace: str, expected: dict[str, Any]) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    assert read_node_parameters(path, NODE, namespace) == expected


@pytest.mark.parametrize("text, words", [
    pytest.param(None, ["cannot read"], id="missing-file"),
    pytest.param("vla_accel_node: {ros__parameters: [unclosed\n", ["not valid YAML"], id="bad-yaml"),
    pytest.param("- a\n- b\n", ["must map node names"], id="not-a-mapping"),
    pytest.param("sim_node:\n  ros__parameters:\n    seed: 3\n", ["no section for node /vla_accel_node", "/sim_node"],
                 id="no-section-for-the-node"),
    pytest.param("decoder: ar\n", ["no section for node"], id="flat-mapping"),
    pytest.param("/arm2/vla_accel_node:\n  ros__parameters:\n    decoder: ar\n", ["no section", "/arm2/vla_accel_node"],
                 id="another-namespace"),
    pytest.param("vla_accel_node:\n  ros__parameters: [1, 2]\n", ["must be a mapping"], id="parameters-not-a-mapping"),
])
def test_bad_files_raise_value_error_naming_the_file(tmp_path: Path, text: str | None, words: list[str]) -> None:
    path = tmp_path / "params.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError) as info:
        read_node_parameters(path, NODE)
    message = str(info.value)
    assert str(path) in message and all(w in message for w in words), message


@pytest.mark.parametrize("node, namespace, fqn", [
    ("vla_accel_node", "", "/vla_accel_node"),
    ("vla_accel_node", "/", "/vla_accel_node"),
    ("vla_accel_node", "arm1", "/arm1/vla_accel_node"),
    ("vla_accel_node", "/robots/arm1/", "/robots/arm1/vla_accel_node"),
])
def test_fully_qualified_name(node: str, namespace: str, fqn: str) -> None:
    assert fully_qualified_name(node, namespace) == fqn
