"""``vla-accel cost``: what a family's passes cost at its published shape on this device, each as a
multiple of its physical bound measured in the same run, and the time per action each decoder's
measured pass counts imply.

The model is made with random weights directly on the device (:mod:`.published_models`,
:mod:`.flow_models`); its passes are :mod:`.cost_passes`'. Per pass: the median, min and max of
``repeats`` timed runs after ``warmup`` runs, the peak device memory, its FLOPs and the weight bytes
it reads, its bound and the ratio (:mod:`.bounds`). Passes made of passes (a flow chunk) add their
parts' times and bounds.

The time per action of a token VLA's decoders: the target passes per action each decoder made in
``vla-accel eval`` (its ``summary.json``: ``decoder``, ``target_passes_per_action`` and, for a
decoder that verified inside the prefill on some steps, ``prefill_verified_share``; or a
``vla-accel bench`` summary, one entry per decoder) times the pass it makes (``ar``: the 1-token
step; every other decoder: the 6-token verify pass), plus the prefill: plain on the steps the
prefill verified nothing, the prefill verifying 6 on the others, whose verification is one of the
counted passes. Its speed-up is ``ar``'s time over it when ``ar`` is among them.

With ``checkpoint``, the passes of that model (a token family's) are timed at its own shape instead;
with ``incremental``, also its full against its incremental prefill over sim frames
(:mod:`.incremental_prefill`).
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vla_accel_ros.decoding import specs
from vla_accel_ros.models.configuration import VisionReuseConfig

TOKEN_FAMILIES = ("openvla", "oft", "hf")
FLOW_FAMILIES = ("smolvla", "pi0", "pi05")
FAMILIES = TOKEN_FAMILIES + FLOW_FAMILIES
DECODING_FAMILIES = ("openvla", "hf")  # the families whose decoders --passes-from prices
DTYPES = ("float32", "bfloat16")
PASSES_KEY = "target_passes_per_action"
SHARE_KEY = "prefill_verified_share"


@dataclass(frozen=True)
class CostOptions:
    family: str = "openvla"
    device: str = "cpu"
    layers: int = 0  # text layers built; 0 = the real depth
    dtype: str = ""  # "": bfloat16 on a GPU, float32 on the CPU
    repeats: int = 5
    warmup: int = 1
    threads: int = 1
    passes_from: tuple[str, ...] = ()
    out: str = "outputs/cost"
    checkpoint: str = ""  # time this checkpoint's model instead of the published shape
    incremental: bool = False  # also the full against the incremental prefill over sim frames
    frames: int = 60
    vision: VisionReuseConfig = field(default_factory=lambda: VisionReuseConfig(reuse_kv=True))

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"--family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.dtype not in ("", *DTYPES):
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.layers < 0 or self.repeats < 1 or self.warmup < 0 or self.threads < 1:
            raise ValueError("--layers and --warmup must be >= 0, --repeats and --threads >= 1")
        if self.passes_from and self.family not in DECODING_FAMILIES:
            raise ValueError(f"--passes-from prices the decoders of {' and '.join(DECODING_FAMILIES)}; "
                             f"{self.family} makes its chunk without them")
        if self.checkpoint and (self.family not in TOKEN_FAMILIES or self.layers):
            raise ValueError(f"--checkpoint times a {', '.join(TOKEN_FAMILIES)} checkpoint at its own depth "
                             "(without --layers)")
        if self.incremental and (self.family not in DECODING_FAMILIES or not self.vision.reuse_kv
                                 or self.frames < 2):
            raise ValueError(f"--incremental times the prefill of {' and '.join(DECODING_FAMILIES)} (reused "
                             "keys/values) over at least 2 frames")

    @property
    def chosen_dtype(self) -> str:
        return self.dtype or ("float32" if self.device == "cpu" else "bfloat16")


def measured_passes(paths: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Decoder -> {target passes per action, the share verified in the prefill, the file} from eval
    or bench summaries; ValueError naming the file when one holds no pass counts."""
    found: dict[str, dict[str, Any]] = {}
    for name in paths:
        path = Path(name)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"--passes-from {path}: cannot be read as JSON ({error})") from None
        if isinstance(data, dict) and PASSES_KEY in data and isinstance(data.get("decoder"), str):
            entries = {data["decoder"]: data}  # one eval run
        elif isinstance(data, dict) and data and all(isinstance(v, dict) and PASSES_KEY in v for v in data.values()):
            entries = data  # a bench summary: entry name -> row
        else:
            raise ValueError(f"--passes-from {path}: not a vla-accel eval or bench summary.json (no "
                             f"'decoder' and '{PASSES_KEY}')")
        for decoder, entry in entries.items():
            passes = entry[PASSES_KEY]
            if not isinstance(passes, (int, float)) or passes <= 0:
                raise ValueError(f"--passes-from {path}: {decoder}'s {PASSES_KEY} is {passes!r}, not a positive number")
            found[decoder] = {"target_passes_per_action": float(passes),
                              "prefill_verified_share": float(entry.get(SHARE_KEY) or 0.0), "source": str(path)}
    return found


def implied_per_action(table: dict[str, dict[str, Any]], measured: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each decoder's implied ms per action (module docstring) from the table's medians."""
    from vla_accel_ros.evaluation.cost_passes import VERIFY_TOKENS

    prefill = table["prefill"]["median_ms"]
    verifying = table[f"prefill_verifying_{VERIFY_TOKENS}"]["median_ms"]
    rows = []
    for decoder, counts in measured.items():
        sequential = decoder.split("+")[0] == specs.AR.name
        unit = "step_1_token" if sequential else f"verify_{VERIFY_TOKENS}_tokens"
        passes, share = counts["target_passes_per_action"], counts["prefill_verified_share"]
        ms = (1 - share) * prefill + share * verifying + max(0.0, passes - share) * table[unit]["median_ms"]
        rows.append({"decoder": decoder, "target_passes_per_action": passes, "prefill_verified_share": share,
                     "pass": unit, "implied_ms_per_action": ms, "implied_hz": 1e3 / ms, "source": counts["source"]})
    ar = next((r for r in rows if r["decoder"] == specs.AR.name), None)
    for r in rows:
        r["implied_speedup_vs_ar"] = None if ar is None else ar["implied_ms_per_action"] / r["implied_ms_per_action"]
    return rows


def environment(device: Any) -> dict[str, Any]:
    """The device's name, torch's and CUDA's versions, the host and the command line."""
    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    return {"device": str(device), "device_name": name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "host": platform.node(),
            "command": " ".join(["vla-accel", *sys.argv[1:]]) if sys.argv else "vla-accel cost"}


def cost(opts: CostOptions, shape: Any = None) -> dict[str, Any]:
    """The cost table (module docstring) as a dict, also written to ``out``/cost.json. ``shape``:
    the model's sizes in place of the published ones (a token family's
    :class:`~.published_models.TokenVLAShape`, a flow family's tower layers; None: published)."""
    import torch

    from vla_accel_ros.evaluation.bounds import measure_bounds, pass_work, time_pass
    from vla_accel_ros.evaluation.cost_passes import flow_plan, token_plan
    from vla_accel_ros.models.load import require_device_available

    require_device_available(opts.device)
    measured = measured_passes(opts.passes_from)  # a bad file stops the run before the model is built
    torch.set_num_threads(opts.threads)
    device = torch.device(opts.device)
    dtype = getattr(torch, opts.chosen_dtype)
    bounds = measure_bounds(device, opts.repeats)
    with torch.inference_mode():
        if opts.family in TOKEN_FAMILIES:
            plan = token_plan(opts.family, opts.layers, device, dtype, shape, opts.checkpoint)
        else:
            plan = flow_plan(opts.family, opts.layers, device, dtype, shape)
        factor = plan.layers_real / plan.layers_built
        timings, works = {}, {}
        for spec in plan.passes:
            if spec.prepare is not None:
                spec.prepare()
            timings[spec.name] = time_pass(spec.run, device, opts.repeats, opts.warmup)
            if spec.work_of is None:
                if spec.prepare is not None:
                    spec.prepare()
                works[spec.name] = pass_work(spec.run, plan.modules)
    table: dict[str, dict[str, Any]] = {}
    for spec in plan.passes:
        whole = spec.whole
        timing = timings[spec.name]
        if spec.scaled:
            timing = timing.scaled(timings[whole] if whole else None, factor)
        if spec.work_of is None:
            work = works[spec.name]
            work = work.scaled(works[whole] if whole else None, factor) if spec.scaled else work
            flops, weight_bytes = work.flops, work.weight_bytes
        else:
            flops = sum(table[p]["flops"] * n for p, n in spec.work_of.items())
            weight_bytes = sum(table[p]["weight_bytes"] * n for p, n in spec.work_of.items())
        table[spec.name] = row(asdict(timing), flops, weight_bytes, bounds)
    for name, parts in plan.composed.items():
        summed = {key: sum(table[p][key] * n for p, n in parts.items())
                  for key in ("median_ms", "min_ms", "max_ms", "flops", "weight_bytes", "bound_ms")}
        table[name] = {**summed, "bound": "sum", "x_bound": summed["median_ms"] / summed["bound_ms"], "of": parts,
                       "peak_memory_mb": max(table[p]["peak_memory_mb"] for p in parts)}
    summary = {"family": opts.family, "options": asdict(opts), "dtype": opts.chosen_dtype,
               **environment(device), "threads": torch.get_num_threads(),
               "shape": opts.checkpoint or ("published" if shape is None else repr(shape)),
               "text_layers_built": plan.layers_built, "text_layers_real": plan.layers_real, **plan.facts,
               "clock": "CUDA events" if device.type == "cuda" else "process CPU time",
               "peak_memory": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process peak RSS",
               "bounds": asdict(bounds), "table": table,
               "graph_errors": [g.error for g in plan.graphs if g.error]}
    if measured:
        summary["decoders"] = implied_per_action(table, measured)
    if opts.incremental:
        from vla_accel_ros.evaluation.incremental_prefill import expert_frames, measure_incremental

        frames = expert_frames(int(plan.policy.config.image_size), opts.frames)
        summary["incremental"] = measure_incremental(plan.policy, frames, opts.vision)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def row(timing: dict[str, float], flops: float, weight_bytes: float, bounds: Any) -> dict[str, Any]:
    """One pass's table row: its timing, its work, its bound and which term sets it, the ratio."""
    from vla_accel_ros.evaluation.bounds import Work

    bound_ms, term = bounds.bound_ms(Work(flops, weight_bytes))
    return {**timing, "flops": flops, "weight_bytes": weight_bytes, "bound_ms": bound_ms, "bound": term,
            "x_bound": timing["median_ms"] / bound_ms if bound_ms > 0 else float("inf")}
