"""``vla-accel hf-cost``: the passes of a Hugging Face VLA at (toward) OpenVLA's shape, timed here,
and the speed-ups the decoders' pass counts imply at that shape.
"""

from __future__ import annotations

import argparse

from vla_accel_ros.evaluation.hf_cost import CostOptions, hf_cost


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = CostOptions()
    parser.add_argument("--hidden", type=int, default=d.hidden, help="Llama width")
    parser.add_argument("--layers", type=int, default=d.layers, help="Llama layers")
    parser.add_argument("--image-size", type=int, default=d.image_size, help="image size (px)")
    parser.add_argument("--patch-size", type=int, default=d.patch_size, help="vision patch (px)")
    parser.add_argument("--repeats", type=int, default=d.repeats, help="timed runs per pass (median)")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads")
    parser.add_argument("--out", default=d.out, help="output directory (summary.json)")


def run(args: argparse.Namespace) -> int:
    opts = CostOptions(hidden=args.hidden, layers=args.layers, image_size=args.image_size, patch_size=args.patch_size,
                       repeats=args.repeats, threads=args.threads, out=args.out)
    r = hf_cost(opts)
    print(f"{r['parameters'] / 1e6:.0f} M parameters, {r['prefix_tokens']}-token prefix: prefill {r['prefill_ms']:.0f} ms, "
          f"1-token step {r['step_1_token_ms']:.1f} ms, 6-token verify {r['verify_6_tokens_ms']:.1f} ms, "
          f"prefill verifying 6 {r['prefill_verifying_6_ms']:.0f} ms")
    print("| decoder | target passes / action | implied ms / action | implied e2e speed-up |")
    print("|---|---|---|---|")
    for row in r["decoders"]:
        print(f"| {row['decoder']} | {row['target_passes']:.2f} | {row['implied_ms']:.0f} | {row['implied_speedup']:.2f}x |")
    return 0
