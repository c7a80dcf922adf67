"""``vla-accel predict``: one observation in, the action and the timings out, for a checkpoint of any
family (the package's own, a Llava-style Hugging Face VLA, OpenVLA as published).

The observation goes through the one runner with the chosen decoder (the greedy baseline by
default), as the node runs it. ``--json`` prints one JSON object, a contract that tools read:

- ``action_token_ids``: the 7 tokens (a Hugging Face or OpenVLA model's text ids; the package's
  own model's bins);
- ``action_normalized``: their bin centres in [-1, 1]; ``action``: the action as the model's own
  code returns it (OpenVLA: unnormalised with the statistics where the mask is true, the gripper
  left normalised);
- ``action_logits`` (with ``--logits``): per decoding step, the 256 action logits in id order
  (OpenVLA: ids 31744..31999), 7 x 256, each after the tokens before it;
- ``timing_ms`` (load, prefill, decode, total), and what ran: ``family``, ``checkpoint``,
  ``decoder``, ``dtype``, ``unnorm_key``, ``target_passes``.

Bad input (a missing or malformed checkpoint file, an unknown ``--unnorm-key``, an unreadable image)
is one ``predict: error: ...`` line naming the file or key, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from vla_accel_ros.decoding.specs import BASELINE, names

DTYPE_CHOICES = ("float32", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="a checkpoint directory of any family (or hf:DIR)")
    parser.add_argument("--image", required=True, type=Path, help="the camera image (PNG, JPEG, ...), RGB")
    parser.add_argument("--instruction", required=True, help="the task, e.g. 'pick up the red cube'")
    parser.add_argument("--unnorm-key", default="", help="the dataset whose action statistics unnormalise the "
                                                         "action (required when the model has several)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                        help="the weights' dtype (default: as stored, or the checkpoint's vla_spec.json)")
    parser.add_argument("--device", default=None, help="where the model runs: cpu, cuda, ... (default: cpu)")
    parser.add_argument("--decoder", default=BASELINE, choices=names(),
                        help=f"the decoder (default: {BASELINE}, greedy)")
    parser.add_argument("--joints", type=float, nargs="+", default=None,
                        help="the arm's joint positions (default: zeros of the package arm's 7)")
    parser.add_argument("--gripper", type=float, default=0.04, help="the finger opening in metres")
    parser.add_argument("--logits", action="store_true", help="also print the 7 x 256 action logits")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the contract above)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")


def run(args: argparse.Namespace) -> int:
    result = predict(args)  # bad input: one line (vla_accel_ros.cli)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['family']} {result['checkpoint']} ({result['dtype']}), decoder {result['decoder']}")
    print(f"action tokens: {result['action_token_ids']}")
    print(f"action:        {np.round(result['action'], 6).tolist()}")
    print("timing (ms):   " + ", ".join(f"{k} {v:.1f}" for k, v in result["timing_ms"].items()))
    return 0


def read_image(path: Path) -> np.ndarray:
    """The RGB uint8 array (H, W, 3) of an image file; ValueError naming it otherwise."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return np.array(image.convert("RGB"))
    except (OSError, UnidentifiedImageError) as error:
        raise ValueError(f"{path}: cannot read it as an image ({error})") from None


def predict(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON object of one prediction (module docstring)."""
    import torch

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.decoding import make_decoder
    from vla_accel_ros.models.api import CheckpointRef
    from vla_accel_ros.models.load import load_policy, recognise
    from vla_accel_ros.runtime.runner import PolicyRunner

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    image = read_image(args.image)
    ref = CheckpointRef.parse(args.checkpoint)
    family = recognise(ref).name
    start = time.perf_counter()
    policy = load_policy(ref, unnorm_key=args.unnorm_key, device=args.device, dtype=args.dtype)
    load_ms = (time.perf_counter() - start) * 1e3
    kin = ArmKinematics(default_urdf())
    joints = np.zeros(len(kin.joint_names)) if args.joints is None else np.asarray(args.joints, dtype=float)
    size = int(policy.config.image_size)
    if not hasattr(policy, "resized_image") and image.shape[:2] != (size, size):
        import cv2  # the package's own model takes its size; the node's camera conversion resizes so

        image = cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)
    obs = Observation(image=image, instruction=args.instruction, joint_pos=joints, gripper=args.gripper)
    decoder = make_decoder(args.decoder)
    try:
        runner = PolicyRunner(policy, decoder, kin, action_dt_s=0.05, period_s=float("inf"))
    except ValueError as error:  # a decoder that needs a head the model lacks
        raise ValueError(f"--decoder {args.decoder}: {error}") from None
    step = runner(obs)
    tokens = np.asarray(step.tokens, dtype=np.int64).reshape(-1)
    action_tokenizer = policy.tokenizer
    centres = action_tokenizer.centres[np.minimum(tokens, len(action_tokenizer.centres) - 1)]
    unnormalise = getattr(action_tokenizer, "unnormalise", action_tokenizer.denormalise)
    action_ids = getattr(policy, "action_ids", None)  # a Hugging Face or OpenVLA model's text ids of the bins
    result: dict[str, Any] = {
        "action_token_ids": (tokens if action_ids is None else np.asarray(action_ids)[tokens]).tolist(),
        "action_normalized": centres.tolist(),
        "action": np.asarray(unnormalise(centres), dtype=float).tolist(),
        "family": family, "checkpoint": str(ref), "decoder": decoder.name,
        "dtype": str(getattr(policy, "dtype", torch.float32)).removeprefix("torch."),
        "unnorm_key": getattr(policy, "info", {}).get("unnorm_key"),
        "target_passes": int(step.target_passes),
        "timing_ms": {"load": round(load_ms, 3), **{k: round(float(step.timings[k]), 3)
                                                     for k in ("prefill", "decode", "total") if k in step.timings}},
    }
    if args.logits:
        # one pass over the prompt and the first 6 tokens: each step's logits after the tokens before it
        with torch.inference_mode():
            scored = policy.prefill_batch([obs], torch.tensor([tokens[:-1].tolist()], dtype=torch.long))
        logits = scored.logits[0].float().cpu().numpy()  # (7, 256) by bin
        if action_ids is not None and int(action_ids[0]) > int(action_ids[-1]):
            logits = logits[:, ::-1]  # bins count down from the top id: id order is the reverse
        result["action_logits"] = logits.tolist()
    return result
