"""``vla-accel hf-cost``: the cost of a Hugging Face VLA's forward passes. A Llava-style model at (or
toward) OpenVLA's shape, random or ``hf:DIR``, has its prefill, one-token step and six-token verify
pass timed on this machine, and the speed-ups the decoders' pass counts imply at that shape are
computed from them; with ``--incremental``, the full and the incremental prefill over the frames of
a simulated pick.
"""

from __future__ import annotations

import argparse

from vla_accel_ros.commands.vision_options import add_vision_reuse_arguments, vision_config
from vla_accel_ros.evaluation.hf_cost import CostOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = CostOptions()
    parser.add_argument("--hidden", type=int, default=d.hidden, help="Llama width")
    parser.add_argument("--layers", type=int, default=d.layers, help="Llama layers")
    parser.add_argument("--image-size", type=int, default=d.image_size, help="image size (px)")
    parser.add_argument("--patch-size", type=int, default=d.patch_size, help="vision patch (px)")
    parser.add_argument("--repeats", type=int, default=d.repeats, help="timed runs per pass (median)")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads")
    parser.add_argument("--out", default=d.out, help="output directory (summary.json)")
    parser.add_argument("--checkpoint", default=d.checkpoint, help="hf:DIR: time this Hugging Face VLA at its own "
                        "image size instead of a random one at the shape above")
    parser.add_argument("--incremental", action="store_true",
                        help="also time the full and the incremental prefill (reused keys/values of unchanged image "
                             "tokens) frame by frame over a scripted pick in the sim (needs MuJoCo rendering)")
    parser.add_argument("--frames", type=int, default=d.frames, help="--incremental: sim frames (the pick's first N)")
    add_vision_reuse_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from vla_accel_ros.evaluation.hf_cost import hf_cost  # torch: only when it runs
    from vla_accel_ros.sim.gl import check_rendering

    if args.incremental and not check_rendering("hf-cost"):  # no GL: one line saying what to set, before any work
        return 2
    vision = vision_config(args, reuse_kv=True)
    opts = CostOptions(hidden=args.hidden, layers=args.layers, image_size=args.image_size,
                       patch_size=args.patch_size, repeats=args.repeats, threads=args.threads, out=args.out,
                       checkpoint=args.checkpoint, incremental=args.incremental, frames=args.frames, vision=vision)
    r = hf_cost(opts)
    print(f"{r['parameters'] / 1e6:.0f} M parameters, {r['prefix_tokens']}-token prefix: prefill "
          f"{r['prefill_ms']:.0f} ms, 1-token step {r['step_1_token_ms']:.1f} ms, 6-token verify "
          f"{r['verify_6_tokens_ms']:.1f} ms, prefill verifying 6 {r['prefill_verifying_6_ms']:.0f} ms; vision tower "
          f"and projector {r['vision_ms']:.1f} ms")
    print("| decoder | target passes / action | implied ms / action | implied e2e speed-up |")
    print("|---|---|---|---|")
    for row in r["decoders"]:
        print(f"| {row['decoder']} | {row['target_passes']:.2f} | {row['implied_ms']:.0f} | "
              f"{row['implied_speedup']:.2f}x |")
    if "incremental" in r:
        i = r["incremental"]
        rule = (f"feature threshold {vision.feature_threshold:g}" if vision.feature_threshold > 0
                else f"threshold {vision.threshold:g}")
        if vision.reuse_tower:
            rule += f", the tower at {vision.tower_threshold:g} refreshed every {vision.tower_refresh_steps}"
        print(f"incremental prefill over {i['frames']} sim frames ({rule}, refresh every {vision.refresh_steps}): full "
              f"{i['prefill_full_ms_mean']:.1f} ms, incremental {i['prefill_incremental_ms_mean']:.1f} ms per frame "
              f"(mean; p50 {i['prefill_full_ms_p50']:.1f} vs {i['prefill_incremental_ms_p50']:.1f}): "
              f"{i['incremental_prefill_speedup']:.2f}x (p50 {i['incremental_prefill_speedup_p50']:.2f}x), "
              f"{i['recomputed_fraction_mean']:.0%} of the image tokens "
              f"recomputed ({i['tower_recomputed_fraction_mean']:.0%} by the tower), {i['refreshes']} full refreshes")
    print(f"hf-cost -> {opts.out} (summary.json)")
    return 0
