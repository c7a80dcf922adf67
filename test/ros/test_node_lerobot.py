"""The node over DDS with a tiny SmolVLA-layout policy (test/fixtures/lerobot/layout.py): the
checkpoint directory as the parameter names it, its tokenizer from the Hugging Face cache, every tick
publishes, the flow decoders' chunks drive the arm within its limits."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("transformers")


_domains = iter(range(130, 133))


@pytest.fixture(scope="module")
def smolvla_dir(tmp_path_factory: pytest.TempPathFactory, fixture_layout) -> Path:
    return fixture_layout("lerobot").write_smolvla_dir(tmp_path_factory.mktemp("lerobot") / "smolvla_tiny")


@pytest.mark.parametrize("decoder", ["flow10", "flow2"])
def test_the_node_runs_a_smolvla_directory_and_every_tick_publishes(dds_rig, policy_node_over_dds, smolvla_dir,
                                                                    tmp_path, monkeypatch, decoder, fixture_layout):
    monkeypatch.setenv("HF_HOME", str(fixture_layout("lerobot").hf_cache(tmp_path / "hf")))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    rig = dds_rig(next(_domains), "robot")
    params = {"inference": True, "inference_mode": "thread", "checkpoint": str(smolvla_dir), "decoder": decoder,
              "autostart": True, "instruction": "pick up the red cube", "robot_description_timeout_s": 0.0,
              "stats_rate_hz": 10.0, "realtime_priority": 0, "inference_restarts": 0, "vision_reuse": False}
    try:
        node, _, _ = policy_node_over_dds(rig, params, timeout=120.0)
        assert node.image_size == 128  # the policy's resize_imgs_with_padding
    finally:
        rig.close()
