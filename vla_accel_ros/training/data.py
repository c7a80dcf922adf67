"""Demonstration directory (``episode_*.npz``, see ``vla_accel_ros.sim.demos``) -> in-memory tensors.

Everything is decoded once into contiguous tensors (images stay uint8) so that training epochs
only index memory: with few cores, re-reading compressed npz files every epoch would cost
more than the model itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vla_accel_ros.core.progress import progress_bar
from vla_accel_ros.models.tokenizer import ACTION_DIM, encode_instruction
from vla_accel_ros.sim.scene import front_camera_coordinates

REQUIRED_KEYS = ("images", "joint_pos", "gripper", "actions", "near_contact", "instruction")
AUX_DIM = 6  # target-cube position relative to the TCP (3) and the TCP position (3)
AUX_SCALE_M = 0.1  # metres per unit of the auxiliary targets


class DatasetError(ValueError):
    """A demonstration file or directory that cannot be used; the message names the file."""


@dataclass(frozen=True, eq=False)
class DemoDataset:
    """All steps of all loaded episodes. N steps, E episodes.

    images (N, H, W, 3) uint8; text (N, T) int64 instruction byte ids; proprio (N, 8) float32
    (raw joints + gripper); actions (N, 7) float32; near_contact (N,) bool; aux (N, 6) float32 (see
    AUX_DIM; NaN when unknown); keypoint_targets (N, 2, 2) float32, where the front camera images
    the named cube and the TCP (x, y in [-1, 1], NaN when unknown); episode (N,) int64
    index into ``files``; files: episode file names in load order; success (E,) bool;
    wrist_images (N, H, W, 3) uint8 when every episode was recorded with the wrist camera, else None.
    """

    images: torch.Tensor
    text: torch.Tensor
    proprio: torch.Tensor
    actions: torch.Tensor
    near_contact: torch.Tensor
    aux: torch.Tensor
    keypoint_targets: torch.Tensor
    episode: torch.Tensor
    files: tuple[str, ...]
    success: torch.Tensor
    wrist_images: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def n_episodes(self) -> int:
        return len(self.files)

    @property
    def image_size(self) -> int:
        return self.images.shape[1]

    def split(self, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Step indices (train, val): the last ``val_fraction`` of episodes (at least one when there
        are two or more) are held out, so validation scenes are never seen in training."""
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        n_val = int(round(self.n_episodes * val_fraction))
        if val_fraction > 0 and self.n_episodes >= 2:
            n_val = max(n_val, 1)
        n_val = min(n_val, self.n_episodes - 1)
        first_val = self.n_episodes - n_val
        is_val = self.episode >= first_val
        return torch.nonzero(~is_val).squeeze(1), torch.nonzero(is_val).squeeze(1)


def load_episode(path: Path, max_text_len: int) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in REQUIRED_KEYS if k not in data.files]
            if missing:
                raise DatasetError(f"{path}: missing arrays {missing}")
            optional = ("success", "tcp_pos", "target_pos", "policy_in_loop", "wrist_images")
            episode = {k: data[k] for k in (*REQUIRED_KEYS, *optional) if k in data.files}
    except DatasetError:
        raise
    except Exception as exc:  # zip / format errors from a corrupt file
        raise DatasetError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from exc
    images, actions = episode["images"], episode["actions"]
    t = images.shape[0]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3 or images.shape[1] != images.shape[2]:
        raise DatasetError(f"{path}: images must be uint8 (T, S, S, 3), got {images.dtype} {images.shape}")
    shapes = {"joint_pos": (t, 7), "gripper": (t,), "actions": (t, ACTION_DIM), "near_contact": (t,)}
    for key, shape in shapes.items():
        if episode[key].shape != shape:
            raise DatasetError(f"{path}: '{key}' has shape {episode[key].shape}, expected {shape}")
    for key in ("joint_pos", "gripper", "actions"):
        if not np.all(np.isfinite(episode[key])):
            raise DatasetError(f"{path}: '{key}' contains NaN or inf")
    if t == 0:
        raise DatasetError(f"{path}: episode has no steps")
    if "wrist_images" in episode and episode["wrist_images"].shape != images.shape:
        raise DatasetError(f"{path}: 'wrist_images' has shape {episode['wrist_images'].shape}, expected {images.shape}")
    if "tcp_pos" in episode and "target_pos" in episode:
        tcp, target = episode["tcp_pos"].astype(np.float32), episode["target_pos"].astype(np.float32)
        aux = np.concatenate([target - tcp, tcp], axis=1) / AUX_SCALE_M
        keypoints = front_camera_coordinates(np.stack([target, tcp], axis=1))
    else:
        aux = np.full((t, AUX_DIM), np.nan, np.float32)
        keypoints = np.full((t, 2, 2), np.nan, np.float32)
    return {
        "images": images,
        **({"wrist_images": episode["wrist_images"]} if "wrist_images" in episode else {}),
        "aux": aux.astype(np.float32),
        "keypoint_targets": keypoints.astype(np.float32),
        "proprio": np.concatenate([episode["joint_pos"], episode["gripper"][:, None]], axis=1).astype(np.float32),
        "actions": actions.astype(np.float32),
        "near_contact": episode["near_contact"].astype(bool),
        "text": encode_instruction(str(episode["instruction"]), max_text_len),
        "success": bool(episode["success"]) if "success" in episode else True,
        "policy_in_loop": bool(episode.get("policy_in_loop", False)),
    }


def load_demos(
    directory: Path | str,
    max_text_len: int,
    max_episodes: int | None = None,
    only_success: bool = True,
    progress: bool = True,
) -> DemoDataset:
    """Load ``directory/episode_*.npz`` in name order. Failed episodes are skipped unless
    ``only_success`` is False (imitating a failure teaches the failure), except those a policy
    drove in part (DAgger): their labels are the expert's at every step, so they teach recovery."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DatasetError(f"{directory}: demo directory not found")
    files = sorted(directory.glob("episode_*.npz"))
    if max_episodes is not None:
        files = files[:max_episodes]
    if not files:
        raise DatasetError(f"{directory}: no episode_*.npz files")
    episodes, names = [], []
    for path in progress_bar(files, desc="loading demos", unit="ep", disable=not progress):
        episode = load_episode(path, max_text_len)
        if only_success and not episode["success"] and not episode["policy_in_loop"]:
            continue
        if episodes and episode["images"].shape[1:] != episodes[0]["images"].shape[1:]:
            raise DatasetError(f"{path}: image size {episode['images'].shape[1:]} differs from earlier episodes")
        episodes.append(episode)
        names.append(path.name)
    if not episodes:
        raise DatasetError(f"{directory}: no successful episodes among {len(files)} files")
    lengths = [e["images"].shape[0] for e in episodes]
    wrist = (torch.from_numpy(np.concatenate([e["wrist_images"] for e in episodes]))
             if all("wrist_images" in e for e in episodes) else None)
    return DemoDataset(
        images=torch.from_numpy(np.concatenate([e["images"] for e in episodes])),
        text=torch.from_numpy(np.stack([e["text"] for e in episodes]).repeat(lengths, axis=0)),
        proprio=torch.from_numpy(np.concatenate([e["proprio"] for e in episodes])),
        actions=torch.from_numpy(np.concatenate([e["actions"] for e in episodes])),
        near_contact=torch.from_numpy(np.concatenate([e["near_contact"] for e in episodes])),
        aux=torch.from_numpy(np.concatenate([e["aux"] for e in episodes])),
        keypoint_targets=torch.from_numpy(np.concatenate([e["keypoint_targets"] for e in episodes])),
        episode=torch.from_numpy(np.repeat(np.arange(len(episodes)), lengths)),
        files=tuple(names),
        success=torch.tensor([e["success"] for e in episodes]),
        wrist_images=wrist,
    )


def action_windows(actions: torch.Tensor, episode: torch.Tensor, horizon: int) -> torch.Tensor:
    """(N, 7 * horizon): each step's action and the next ``horizon - 1`` of its episode, the
    episode's last action repeated past its end (a chunked head's training targets)."""
    n = len(actions)
    steps = torch.arange(n)[:, None] + torch.arange(horizon)[None, :]  # (N, H)
    last = torch.zeros(n, dtype=torch.long)  # the index of each step's episode's last step
    for e in torch.unique(episode):
        members = torch.nonzero(episode == e).flatten()
        last[members] = int(members.max())
    steps = torch.minimum(steps, last[:, None])
    return actions[steps].reshape(n, -1)
