"""A two-camera chunked flow head trained on demos that hold the wrist camera (``demos --wrist``):
the head's condition has one slot per camera, and demos without the wrist images are refused."""

from __future__ import annotations

import numpy as np
import pytest

from vla_accel_ros.models.own.checkpoint import load_checkpoint
from vla_accel_ros.training.data import DatasetError, load_demos
from vla_accel_ros.training.flow import FlowTrainConfig, train_flow


def _demos(path, save_episode, wrist: bool) -> None:
    path.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        images = rng.integers(0, 255, (6, 64, 64, 3), dtype=np.uint8)
        actions = np.concatenate([rng.uniform(-0.01, 0.01, (6, 6)), rng.integers(0, 2, (6, 1))], 1).astype(np.float32)
        save_episode(path / f"episode_{i:05d}.npz", images, actions, rng)
        if wrist:  # the same episode with the wrist camera's frames added
            with np.load(path / f"episode_{i:05d}.npz") as data:
                fields = dict(data)
            np.savez_compressed(path / f"episode_{i:05d}.npz", **fields, wrist_images=images[:, ::-1].copy())


def test_train_flow_with_two_cameras_writes_a_two_slot_head(tmp_path, tiny_checkpoint, save_episode):
    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    _demos(tmp_path / "wrist", save_episode, wrist=True)
    data = load_demos(tmp_path / "wrist", 32, progress=False)
    assert data.wrist_images is not None and data.wrist_images.shape == data.images.shape
    cfg = FlowTrainConfig(checkpoint=str(checkpoint), data=str(tmp_path / "wrist"), out=str(tmp_path / "two"),
                          epochs=2, distill_epochs=1, batch_size=8, hidden=16, layers=1, horizon=4, cameras=2,
                          threads=1, progress=False)
    train_flow(cfg)
    policy = load_checkpoint(tmp_path / "two")
    assert policy.flow is not None and policy.flow.config.cameras == 2 and policy.flow.config.horizon == 4
    assert policy.capabilities().image_slots == 2


def test_two_cameras_need_demos_with_the_wrist_camera(tmp_path, tiny_checkpoint, save_episode):
    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    _demos(tmp_path / "front", save_episode, wrist=False)
    assert load_demos(tmp_path / "front", 32, progress=False).wrist_images is None
    cfg = FlowTrainConfig(checkpoint=str(checkpoint), data=str(tmp_path / "front"), out=str(tmp_path / "x"),
                          epochs=1, distill_epochs=1, batch_size=8, hidden=16, layers=1, cameras=2, threads=1,
                          progress=False)
    with pytest.raises(ValueError, match="wrist_images"):
        train_flow(cfg)
    with pytest.raises(ValueError, match="cameras"):
        FlowTrainConfig(checkpoint="", data="", cameras=3)
    with np.load(tmp_path / "front" / "episode_00000.npz") as data:
        fields = dict(data)
    np.savez_compressed(tmp_path / "front" / "episode_00000.npz", **fields, wrist_images=fields["images"][:2])
    with pytest.raises(DatasetError, match="episode_00000.npz: 'wrist_images' has shape"):
        load_demos(tmp_path / "front", 32, progress=False)
