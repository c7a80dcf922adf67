#!/usr/bin/env bash
# The checks that need a GPU, in one run, on a machine with an NVIDIA GPU and this repository (run
# from its root; docs/your_own_vla.md, "What is verified on a CPU, and what needs a GPU"). Each run
# does one part, named by the first argument; each part fits inside 10 minutes.
#
#   bash tools/device_run.sh token   the token VLAs (the default):
#     1. cuda_tests: the tests that need a CUDA device: the device parameter of the control node and
#        the inference node, the one device check, the token VLAs' graphs against eager, the cost
#        command's CUDA events;
#     2. cost_openvla: vla-accel cost --family openvla (openvla-7b's shape, random weights made on the
#        GPU, bfloat16), each pass beside its bound measured in the same run;
#     3. sim: vla-accel sim --device cuda, 2 short episodes of the Hugging Face VLA trained here
#        (checkpoints/hf_small) with kerv, the node and the MuJoCo bridge as processes over DDS.
#   bash tools/device_run.sh flow    LeRobot's flow VLAs (SmolVLA, π0, π0.5):
#     1. cuda_tests: each family's chunks on the GPU against LeRobot's, its graphs (prefix, 10- and
#        2-step samplers, the bucketed incremental vision, the guided real-time-chunking sampler)
#        against the eager passes, the cost command's flow graphs and buckets;
#     2. cost_<family> for each of $FAMILIES: every pass (towers, VLM, flow step, the samplers, the
#        guided sampler, each bucket's partial prefix beside the full one, their graph replays) as a
#        multiple of its bound measured in the same run; the issue's targets, met or missed by how much;
#     3. sim: vla-accel sim --cameras 2 --checkpoint $CHECKPOINT --chunk-modes
#        sync,async:weighted_average,rtc (skipped when the directory is absent).
#
# LeRobot's and OpenVLA's own code is not run here (none of it is in this repository). A step whose
# Python modules (or checkpoint) are missing is recorded as skipped, naming them. Wheels in .whl/ are
# installed first (into /tmp/site), and the EGL loaders' .deb files in .gl/ unpacked, where present.
#
# Writes under $OUT (default: outputs/device_run_<part>), none in a sub-folder:
#   device_run.json   the GPU, torch's and CUDA's versions, each step's command, exit status, seconds
#                     and result (test counts; each family's passes: median, bound, x bound; the
#                     targets; sim's success, ticks and latency or its chunk-mode table)
#   cuda_tests.log, cuda_tests.xml         pytest's output and its JUnit report
#   cost_<family>.json, cost_<family>.log  vla-accel cost's JSON object and its table
#   sim_summary.json or chunk_modes.json, sim.log   vla-accel sim's results and its output
#
# Environment: PYTHON (default python3: the interpreter that holds CUDA's torch), OUT, DEVICE (cuda;
# cpu runs the same steps on the CPU, for checking the script), FAMILIES (flow: "smolvla pi0 pi05"),
# LAYERS (text layers built, 0: the real depth), REPEATS, CHECKPOINT, DECODER, EPISODES, CUDA_TESTS,
# TESTS_S, COST_S, SIM_S (the steps' limits in seconds).
set -u

PART=${1:-token}
case "$PART" in
    token)
        FAMILIES=${FAMILIES-openvla}
        CHECKPOINT=${CHECKPOINT:-checkpoints/hf_small}
        DECODER=${DECODER:-kerv}
        CUDA_TESTS=${CUDA_TESTS:-"test/ros/test_node_device.py test/models/test_devices.py test/models/test_lerobot.py test/models/test_token_fast_path.py test/evaluation/test_cost.py"}
        TESTS_S=${TESTS_S:-180} COST_S=${COST_S:-180} SIM_S=${SIM_S:-150}
        SIM_ARGS=(--duration-s 6) ;;
    flow)
        FAMILIES=${FAMILIES-"smolvla pi0 pi05"}
        CHECKPOINT=${CHECKPOINT:-runs/smolvla_s2_distilled3}
        DECODER=${DECODER:-flow2}
        CUDA_TESTS=${CUDA_TESTS:-"test/models/test_lerobot.py test/models/test_lerobot_buckets.py test/models/test_realtime_chunking.py test/evaluation/test_cost.py"}
        TESTS_S=${TESTS_S:-150} COST_S=${COST_S:-90} SIM_S=${SIM_S:-120}
        SIM_ARGS=(--cameras 2 --chunk-modes sync,async:weighted_average,rtc) ;;
    *) echo "device_run.sh: error: the part is token or flow, not '$PART'" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
OUT=${OUT:-outputs/device_run_$PART}
DEVICE=${DEVICE:-cuda}
LAYERS=${LAYERS:-0}
REPEATS=${REPEATS:-10}
EPISODES=${EPISODES:-2}
WORK=$(mktemp -d /tmp/device_run.XXXXXX)
STEPS=$WORK/steps.tsv
mkdir -p "$OUT"
: >"$STEPS"

if compgen -G ".gl/*.deb" >/dev/null; then  # libEGL and its kin for MuJoCo's headless rendering
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
if compgen -G ".whl/*.whl" >/dev/null; then  # what the machine's image lacks (pinocchio, mujoco, ...)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MUJOCO_GL=${MUJOCO_GL:-egl} PYTHONUNBUFFERED=1

missing() {  # the modules among "$@" this interpreter cannot import
    "$PY" -c 'import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@"
}

step() {  # step NAME LIMIT_S LOG "MODULES" COMMAND...: run it under its limit, record status and seconds
    local name=$1 limit=$2 log=$3 modules=$4
    shift 4
    local absent
    absent=$(missing $modules)
    if [ -n "$absent" ]; then
        printf '%s\tskipped\t\t0\t%s\t%s\n' "$name" "$absent" "$*" >>"$STEPS"
        echo "$name: skipped, missing $absent" | tee "$log"
        return
    fi
    local start rc
    start=$(date +%s%N)
    timeout --kill-after=15 "$limit" "$@" >"$log" 2>&1
    rc=$?
    printf '%s\tran\t%s\t%s\t\t%s\n' "$name" "$rc" "$(( ($(date +%s%N) - start) / 1000000 ))" "$*" >>"$STEPS"
    echo "$name: exit $rc (limit ${limit} s)"
}

# shellcheck disable=SC2086  # CUDA_TESTS is a list of paths
step cuda_tests "$TESTS_S" "$OUT/cuda_tests.log" "torch transformers pytest numpy" \
    "$PY" -m pytest -q -k cuda -rs --junitxml="$OUT/cuda_tests.xml" $CUDA_TESTS

for family in $FAMILIES; do
    step "cost_$family" "$COST_S" "$OUT/cost_$family.log" "torch transformers numpy" \
        "$PY" -m vla_accel_ros.cli cost --family "$family" --device "$DEVICE" --layers "$LAYERS" \
            --repeats "$REPEATS" --out "$WORK/cost_$family"
    [ -f "$WORK/cost_$family/cost.json" ] && cp "$WORK/cost_$family/cost.json" "$OUT/cost_$family.json"
done

if [ -d "$CHECKPOINT" ]; then
    step sim "$SIM_S" "$OUT/sim.log" "torch transformers mujoco pinocchio rclpy" \
        "$PY" -m vla_accel_ros.cli sim --device "$DEVICE" --checkpoint "$CHECKPOINT" --decoder "$DECODER" \
            --episodes "$EPISODES" "${SIM_ARGS[@]}" --out "$WORK/sim" --realtime-priority 0
    for f in summary.json chunk_modes.json; do
        [ -f "$WORK/sim/$f" ] && cp "$WORK/sim/$f" "$OUT/$([ $f = summary.json ] && echo sim_summary.json || echo $f)"
    done
    if [ ! -f "$WORK/sim/summary.json" ] && [ -f "$WORK/sim/vla_accel_node.log" ]; then
        { echo "--- vla_accel_node.log, last 40 lines"; tail -n 40 "$WORK/sim/vla_accel_node.log"; } >>"$OUT/sim.log"
    fi
else
    printf 'sim\tskipped\t\t0\t%s\t%s\n' "checkpoint:$CHECKPOINT" "vla-accel sim --checkpoint $CHECKPOINT" >>"$STEPS"
    echo "sim: skipped, no checkpoint directory $CHECKPOINT" | tee "$OUT/sim.log"
fi

"$PY" - "$STEPS" "$OUT" <<'EOF'
"""device_run.json: the machine, what each step ran and gave, and the issues' targets."""
import json
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# the flow VLAs' targets (ms, bfloat16, batch 1, 3 cameras) for the graphed chunks, and the prefix's x bound
TARGETS = {"pi0": {"chunk_10_steps_graph": 25.0, "chunk_2_steps_graph": 12.0},
           "pi05": {"chunk_10_steps_graph": 25.0},
           "smolvla": {"chunk_10_steps_graph": 15.0, "chunk_2_steps_graph": 8.0}}
PREFIX_X_BOUND = {"pi0": 2.0}
ROW_KEYS = ("median_ms", "min_ms", "max_ms", "bound_ms", "bound", "x_bound")
SIM_KEYS = ("episodes", "success_rate", "ticks", "ticks_published", "fallback_ticks", "hold_ticks",
            "deadline_misses", "inference_latency_ms_p50", "inference_latency_ms_p99", "inference_target_passes_mean")

steps_file, out = Path(sys.argv[1]), Path(sys.argv[2])
record = {"python": platform.python_version(), "steps": []}
try:
    import torch

    record.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_devices=torch.cuda.device_count(),
                  device_name=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
except ImportError:
    record.update(torch=None)
for line in steps_file.read_text().splitlines():
    name, status, rc, milliseconds, absent, command = line.split("\t")
    step = {"name": name, "status": status, "command": command}
    if status == "skipped":
        step["missing"] = absent.split()
    else:
        step.update(exit_status=int(rc), seconds=round(int(milliseconds) / 1e3, 1), timed_out=int(rc) in (124, 137))
    record["steps"].append(step)
junit = out / "cuda_tests.xml"
if junit.is_file():
    suites = ET.parse(junit).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    record["cuda_tests"] = counts
record["cost"], record["targets"] = {}, []
for path in sorted(out.glob("cost_*.json")):
    summary = json.loads(path.read_text())
    family, table = summary["family"], summary["table"]
    record["cost"][family] = {"device_name": summary.get("device_name"), "dtype": summary.get("dtype"),
                              "bounds": summary.get("bounds"), "graph_errors": summary.get("graph_errors"),
                              "passes": {name: {k: row.get(k) for k in ROW_KEYS} for name, row in table.items()}}
    for name, limit in TARGETS.get(family, {}).items():
        if name in table:
            ms = table[name]["median_ms"]
            record["targets"].append({"family": family, "pass": name, "target_ms": limit, "median_ms": ms,
                                      "met": ms <= limit, "over_by_ms": max(0.0, ms - limit),
                                      "x_bound": table[name]["x_bound"]})
    if family in PREFIX_X_BOUND and "prefix_graph" in table:
        x = table["prefix_graph"]["x_bound"]
        record["targets"].append({"family": family, "pass": "prefix_graph", "target_x_bound": PREFIX_X_BOUND[family],
                                  "x_bound": x, "met": x <= PREFIX_X_BOUND[family]})
if (summary := out / "sim_summary.json").is_file():
    sim = json.loads(summary.read_text())
    record["sim"] = {k: sim.get(k) for k in SIM_KEYS}
if (modes := out / "chunk_modes.json").is_file():
    record["chunk_modes"] = json.loads(modes.read_text()).get("modes")
(out / "device_run.json").write_text(json.dumps(record, indent=2) + "\n")
print(json.dumps({k: v for k, v in record.items() if k != "cost"}, indent=2))
EOF
rm -rf "$WORK"
