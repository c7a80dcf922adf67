"""``vla-accel predict``: one observation in, the action and the timings out, for a checkpoint of any
family (the package's own, a Llava-style Hugging Face VLA, OpenVLA as published, OpenVLA-OFT).

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
  ``decoder``, ``dtype`` (the dtype the policy computes in, its ``compute_dtype``), ``unnorm_key``,
  ``target_passes``.

A LeRobot flow policy (SmolVLA, π0, π0.5) predicts a chunk instead: one ``--image`` per camera in the
config's order (PNG/JPEG, or a ``.npy`` of H x W x 3 uint8 or 3 x H x W float in [0, 1]),
``--state`` (a comma list or a ``.npy``), ``--noise`` (a ``.npy`` of chunk_size x max_action_dim,
the sampler's initial noise as LeRobot draws it; default: drawn from ``--seed``) and ``--steps``
(default: the config's). Its JSON holds ``actions`` (H x action dim, unnormalised) and
``actions_normalized`` (before unnormalising), ``type``, ``steps`` and ``timing_ms``.

An OpenVLA-OFT checkpoint predicts a whole chunk in one pass, from every ``--image`` given (in the
model's image slots: ``--image PRIMARY --image WRIST``) and the raw ``--state`` (normalised as OFT
does it). Its object holds ``actions`` (H x D, unnormalised as OFT's ``predict_action`` returns
them) and ``actions_normalized`` (the head's outputs), ``chunk_size``, ``action_dim``, ``n_images``,
``timing_ms`` (load, forward, total) and what ran; token decoders and ``--logits`` do not apply.

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
    parser.add_argument("--image", required=True, type=Path, action="append",
                        help="a camera image (PNG, JPEG, or .npy); repeat once per camera in the model's order "
                             "(OpenVLA-OFT: --image PRIMARY --image WRIST)")
    parser.add_argument("--instruction", required=True, help="the task, e.g. 'pick up the red cube'")
    parser.add_argument("--unnorm-key", default="", help="the dataset whose action statistics unnormalise the "
                                                         "action (required when the model has several)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                        help="the weights' dtype (default: as stored, or the checkpoint's vla_spec.json)")
    parser.add_argument("--device", default=None, help="where the model runs: cpu, cuda or cuda:N (default: cpu); "
                                                       "a device this torch cannot use is refused before loading")
    parser.add_argument("--decoder", default=None, choices=names(),
                        help=f"the decoder (default: {BASELINE}, greedy; an OpenVLA-OFT model: chunk)")
    parser.add_argument("--joints", type=float, nargs="+", default=None,
                        help="the arm's joint positions (default: zeros of the package arm's 7)")
    parser.add_argument("--gripper", type=float, default=0.04, help="the finger opening in metres")
    parser.add_argument("--state", default=None,
                        help="the raw robot state, as a comma list or a .npy (LeRobot policies and OpenVLA-OFT; "
                             "OFT's default: the joints then the gripper)")
    parser.add_argument("--noise", type=Path, default=None,
                        help="a .npy of chunk_size x max_action_dim: the flow sampler's initial noise "
                             "(LeRobot policies)")
    parser.add_argument("--steps", type=int, default=None, help="flow steps (default: the config's; LeRobot policies)")
    parser.add_argument("--seed", type=int, default=0, help="the noise's seed when no --noise is given")
    parser.add_argument("--tokenizer-dir", type=Path, default=None,
                        help="a LeRobot policy's tokenizer (and SmolVLA's VLM config) when not in the Hugging Face "
                             "cache")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="OpenVLA-OFT: actions per chunk, which the checkpoint does not store (default: "
                             "vla_spec.json's chunk_size, else OFT's for the platform its statistics' dataset "
                             "names: LIBERO 8, ALOHA 25, BRIDGE 5)")
    parser.add_argument("--bounds", choices=("q01_q99", "min_max"), default=None,
                        help="OpenVLA-OFT: the statistics that scale actions and state (default: vla_spec.json's, "
                             "else q01_q99)")
    parser.add_argument("--draft-head", type=Path, default=None,
                        help="a token VLA's draft head in a directory of its own (vla-accel train-draft --out), "
                             "for --decoder sd, kerv, ...")
    parser.add_argument("--logits", action="store_true", help="also print the 7 x 256 action logits")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the contract above)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")


def run(args: argparse.Namespace) -> int:
    result = predict(args)  # bad input: one line (vla_accel_ros.cli)
    if args.json:
        print(json.dumps(result))
        return 0
    if "actions" in result:
        what = result.get("type", result.get("decoder"))
        print(f"{result['family']} {result['checkpoint']} ({result['dtype']}), {what}: a chunk of "
              f"{len(result['actions'])} x {len(result['actions'][0])}")
        print("actions:\n" + "\n".join(str(np.round(row, 6).tolist()) for row in result["actions"]))
        print("timing (ms):   " + ", ".join(f"{k} {v:.1f}" for k, v in result["timing_ms"].items()))
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
    from vla_accel_ros.models.api import CheckpointRef
    from vla_accel_ros.models.load import family_named, resolve_checkpoint

    ref = CheckpointRef.parse(args.checkpoint)
    # the checks that need no model (the device, complete weights of the shapes the config implies),
    # before torch is imported, an image is read or weights load: a bad directory is refused at once
    resolved = resolve_checkpoint(ref, unnorm_key=args.unnorm_key, device=args.device or "")
    registered = family_named(resolved.family)
    family = registered.name

    import torch

    from vla_accel_ros.core.kinematics import ArmKinematics
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.core.resources import default_urdf
    from vla_accel_ros.decoding import make_decoder
    from vla_accel_ros.models.load import load_policy
    from vla_accel_ros.runtime.runner import PolicyRunner

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.draft_head is not None and "draft_head" not in registered.options:
        raise ValueError(f"--draft-head does not apply to {ref}, of the {family} family")
    if "flow_chunks" in registered.capabilities:  # a flow VLA: its chunk from the state and the cameras
        return predict_chunk(args, ref, resolved, family)
    images = [read_image(path) for path in args.image]
    if "action_chunk" in registered.capabilities:  # a chunk in one pass (OpenVLA-OFT)
        return predict_oft(args, ref, resolved, images, family)
    for flag in ("state", "noise", "steps", "tokenizer_dir", "chunk_size", "bounds"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} does not apply to {ref}, of the {family} family")
    if len(images) != 1:
        raise ValueError(f"a checkpoint of the {family} family takes one image, got {len(images)} (--image)")
    image = images[0]
    args.decoder = args.decoder or BASELINE
    start = time.perf_counter()
    policy = load_policy(resolved, unnorm_key=args.unnorm_key, device=args.device, dtype=args.dtype,
                         draft_head=args.draft_head)
    load_ms = (time.perf_counter() - start) * 1e3
    kin = ArmKinematics(default_urdf())
    joints = np.zeros(len(kin.joint_names)) if args.joints is None else np.asarray(args.joints, dtype=float)
    size = int(policy.config.image_size)
    if not policy.capabilities().resizes_images and image.shape[:2] != (size, size):
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
        "dtype": str(policy.compute_dtype).removeprefix("torch."),
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


def predict_chunk(args: argparse.Namespace, ref: Any, resolved: Any, family: str) -> dict[str, Any]:
    """The JSON object of one flow VLA's chunk (a LeRobot policy; module docstring)."""
    import torch

    from vla_accel_ros.core.observation_files import read_array, read_image_file, read_vector
    from vla_accel_ros.models.load import load_policy

    if args.state is None:
        raise ValueError("--state is required for a LeRobot policy (a comma list or a .npy)")
    images = [read_image_file(path) for path in args.image]
    state = read_vector(args.state, "--state")
    start = time.perf_counter()
    policy: Any = load_policy(resolved, unnorm_key=args.unnorm_key, device=args.device, dtype=args.dtype,
                              tokenizer_dir=args.tokenizer_dir)
    load_ms = (time.perf_counter() - start) * 1e3
    noise = None if args.noise is None else read_array(args.noise, policy.noise_shape(), "--noise")
    steps = policy.config.num_steps if args.steps is None else args.steps
    start = time.perf_counter()
    chunk = policy.predict_chunk(images, state, args.instruction, noise=noise, steps=steps,
                                 generator=torch.Generator().manual_seed(args.seed))
    chunk_ms = (time.perf_counter() - start) * 1e3
    return {"actions": chunk.actions.tolist(), "actions_normalized": chunk.normalized.tolist(),
            "family": family, "type": policy.config.type, "checkpoint": str(ref),
            "dtype": str(policy.compute_dtype).removeprefix("torch."), "steps": int(steps),
            "cameras": list(policy.config.camera_names),
            "timing_ms": {"load": round(load_ms, 3), "sample": round(chunk_ms, 3)}}


def predict_oft(args: argparse.Namespace, ref: Any, resolved: Any, images: list[np.ndarray],
                family: str) -> dict[str, Any]:
    """The JSON object of one OpenVLA-OFT prediction (module docstring)."""
    from vla_accel_ros.core.observation import Observation
    from vla_accel_ros.core.observation_files import read_vector
    from vla_accel_ros.decoding.specs import CHUNK_DECODER, spec_of
    from vla_accel_ros.models.oft.checkpoint import load_oft

    if args.decoder not in (None, CHUNK_DECODER):
        why = spec_of(args.decoder).refusal(_chunk_capabilities())
        raise ValueError(f"--decoder {args.decoder}: {why}")
    if args.logits:
        raise ValueError("--logits: an OpenVLA-OFT model has no action tokens; actions_normalized is its output")
    start = time.perf_counter()
    policy = load_oft(ref.directory, unnorm_key=args.unnorm_key or None, device=args.device, dtype=args.dtype,
                      chunk_size=args.chunk_size, bounds=args.bounds, config=resolved.config)
    load_ms = (time.perf_counter() - start) * 1e3
    joints = np.zeros(7) if args.joints is None else np.asarray(args.joints, dtype=float)
    state = None if args.state is None else read_vector(args.state, "--state")
    obs = Observation(image=images[0], extra_images=tuple(images[1:]), instruction=args.instruction,
                      joint_pos=joints, gripper=args.gripper, state=state)
    start = time.perf_counter()
    prediction = policy.predict_chunk(obs)
    forward_ms = (time.perf_counter() - start) * 1e3
    return {
        "actions": prediction.actions.tolist(), "actions_normalized": prediction.normalized.tolist(),
        "chunk_size": policy.chunk.chunk_size, "action_dim": policy.chunk.action_dim, "n_images": len(images),
        "family": family, "checkpoint": str(ref), "decoder": CHUNK_DECODER,
        "dtype": str(policy.compute_dtype).removeprefix("torch."), "unnorm_key": policy.statistics.key,
        "target_passes": 1,
        "timing_ms": {"load": round(load_ms, 3), "forward": round(forward_ms, 3), "total": round(forward_ms, 3)},
    }


def _chunk_capabilities() -> Any:
    from vla_accel_ros.models.api import PolicyCapabilities

    return PolicyCapabilities(action_chunk=True)
