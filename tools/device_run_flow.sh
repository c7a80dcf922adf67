#!/usr/bin/env bash
# The checks of LeRobot's flow VLAs (SmolVLA, π0, π0.5) on a GPU, in one run, on a machine with an
# NVIDIA GPU and this repository (run from its root; docs/your_own_vla.md, "On a GPU"):
#
#   1. cuda_tests: the tests that need a CUDA device (pytest -k cuda over $CUDA_TESTS): each family's
#      chunks on the GPU against LeRobot's and its graphs (prefix, 10- and 2-step samplers) against
#      the eager passes, the bucketed incremental vision's graphs against its eager passes, the
#      guided (real-time chunking) sampler's graph against its eager sampler, the cost command's
#      flow graphs and buckets;
#   2. cost_<family> for each of $FAMILIES: vla-accel cost --family F --device $DEVICE (the published
#      shape, random weights made on the device, bfloat16 on a GPU): every pass (towers, VLM, flow
#      step, the samplers, the guided sampler, each bucket's partial prefix beside the full one, and
#      on a GPU their graph replays) as a multiple of its bound measured in the same run;
#   3. sim: vla-accel sim --device $DEVICE --cameras 2 --checkpoint $CHECKPOINT --decoder $DECODER
#      --chunk-modes sync,async:weighted_average,rtc (the SmolVLA-structured policy trained here; skipped when the
#      directory is absent): chunk-wait share, observation to first action p50/p99, success.
#
# LeRobot's own predict_action_chunk is not run here (none of LeRobot's code is in this repository).
# Each step has its own time limit (together about 9 minutes, the whole run inside 10). A step whose
# Python modules (or checkpoint) are missing is recorded as skipped, naming them. Wheels in .whl/ are
# installed first (into /tmp/site), and the EGL loaders' .deb files in .gl/ unpacked, where present.
#
# Writes under $OUT (default: outputs/device_run_flow), none in a sub-folder:
#   device_run_flow.json   the GPU, torch's and CUDA's versions, each step's command, exit status and
#                          seconds, the test counts, each family's passes (median ms, bound ms, x bound)
#                          and the issue's targets against the graphed chunks (met or missed, by how much)
#   cuda_tests.log, cuda_tests.xml           pytest's output and its JUnit report
#   cost_<family>.json, cost_<family>.log    vla-accel cost's JSON object and its table
#   chunk_modes.json, sim.log                vla-accel sim's chunk-mode table and its output
#
# Environment: PYTHON (default python3), OUT, DEVICE (default cuda; cpu runs the same steps on the
# CPU, for checking the script), FAMILIES (default "smolvla pi0 pi05"; empty: none), LAYERS (text layers built,
# 0: the real depth), REPEATS, CHECKPOINT, DECODER (flow2), EPISODES, CUDA_TESTS, TESTS_S, COST_S, SIM_S (limits, s).
set -u

PY=${PYTHON:-python3}
OUT=${OUT:-outputs/device_run_flow}
DEVICE=${DEVICE:-cuda}
FAMILIES=${FAMILIES-"smolvla pi0 pi05"}
LAYERS=${LAYERS:-0}
REPEATS=${REPEATS:-10}
CHECKPOINT=${CHECKPOINT:-runs/smolvla_s2_distilled3}
EPISODES=${EPISODES:-2}
DECODER=${DECODER:-flow2}
CUDA_TESTS=${CUDA_TESTS:-"test/models/test_lerobot.py test/models/test_lerobot_buckets.py test/models/test_realtime_chunking.py test/evaluation/test_cost.py"}
TESTS_S=${TESTS_S:-150}
COST_S=${COST_S:-90}
SIM_S=${SIM_S:-120}
WORK=$(mktemp -d /tmp/device_run_flow.XXXXXX)
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
        "$PY" -m vla_accel_ros.cli sim --device "$DEVICE" --cameras 2 --checkpoint "$CHECKPOINT" \
            --decoder "$DECODER" --chunk-modes sync,async:weighted_average,rtc --episodes "$EPISODES" --out "$WORK/sim" \
            --realtime-priority 0
    [ -f "$WORK/sim/chunk_modes.json" ] && cp "$WORK/sim/chunk_modes.json" "$OUT/chunk_modes.json"
else
    printf 'sim\tskipped\t\t0\t%s\t%s\n' "checkpoint:$CHECKPOINT" "vla-accel sim --checkpoint $CHECKPOINT" >>"$STEPS"
    echo "sim: skipped, no checkpoint directory $CHECKPOINT" | tee "$OUT/sim.log"
fi

"$PY" - "$STEPS" "$OUT" <<'EOF'
"""device_run_flow.json: the machine, what each step ran and gave, and the issue's targets."""
import json
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# the targets (ms, bfloat16, batch 1, 3 cameras) for the graphed chunks, and the prefix's x bound
TARGETS = {"pi0": {"chunk_10_steps_graph": 25.0, "chunk_2_steps_graph": 12.0},
           "pi05": {"chunk_10_steps_graph": 25.0},
           "smolvla": {"chunk_10_steps_graph": 15.0, "chunk_2_steps_graph": 8.0}}
PREFIX_X_BOUND = {"pi0": 2.0}
ROW_KEYS = ("median_ms", "min_ms", "max_ms", "bound_ms", "bound", "x_bound")

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
modes = out / "chunk_modes.json"
if modes.is_file():
    record["chunk_modes"] = json.loads(modes.read_text()).get("modes")
(out / "device_run_flow.json").write_text(json.dumps(record, indent=2) + "\n")
print(json.dumps({k: v for k, v in record.items() if k != "cost"}, indent=2))
EOF
rm -rf "$WORK"
