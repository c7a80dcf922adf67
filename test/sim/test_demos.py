import json

import numpy as np

from vla_accel_ros.cli import main


def test_demos_command_writes_documented_format(tmp_path):
    out = tmp_path / "demos"
    assert main(["demos", "--episodes", "2", "--seed", "11", "--out", str(out), "--image-size", "64"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["success_rate"] == 1.0
    files = sorted(out.glob("episode_*.npz"))
    assert len(files) == 2
    with np.load(files[0], allow_pickle=False) as ep:
        steps = ep["actions"].shape[0]
        assert ep["images"].shape == (steps, 64, 64, 3) and ep["images"].dtype == np.uint8
        assert ep["joint_pos"].shape == (steps, 7)
        assert ep["gripper"].shape == (steps,)
        assert ep["near_contact"].dtype == bool
        assert ep["tcp_pos"].shape == (steps, 3) and ep["target_pos"].shape == (steps, 3)
        # The target cube rests on the table until the gripper reaches it.
        assert abs(float(ep["target_pos"][0, 2]) - 0.02) < 2e-3
        assert str(ep["instruction"]).startswith("pick up the")
        assert bool(ep["success"]) and int(ep["seed"]) == 11
