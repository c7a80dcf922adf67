#!/usr/bin/env bash
# The checks of the token VLAs on a GPU, in one run, on a machine with an NVIDIA GPU and this
# repository (run from its root; docs/your_own_vla.md, "What is verified on a CPU, and what needs a GPU"):
#
#   1. cuda_tests: the tests that need a CUDA device (pytest -k cuda over $CUDA_TESTS): the device
#      parameter of the control node and the inference node, the one device check, LeRobot's graphs,
#      the token VLAs' graphs against eager, the cost command's CUDA events;
#   2. cost: vla-accel cost --family openvla --device cuda (openvla-7b's shape, random weights made
#      on the GPU, bfloat16), each pass beside its bound measured in the same run; its cost.json holds
#      what --json prints;
#   3. sim: vla-accel sim --device cuda, 2 short episodes of the Hugging Face VLA trained here
#      (checkpoints/hf_small) with kerv, the node and the MuJoCo bridge as processes over DDS.
#
# Each step has its own time limit (together about 8.5 minutes, the whole run inside 10). A step
# whose Python modules are missing is recorded as skipped, naming them. Wheels in .whl/ are
# installed first (into /tmp/site), and the EGL loaders' .deb files in .gl/ unpacked, where present.
#
# Writes under $OUT (default: outputs/device_run), at most 8 files, none in a sub-folder:
#   device_run.json    the GPU, torch's and CUDA's versions, each step's command, exit status,
#                      seconds and result (test counts; sim's success, ticks and latency)
#   cuda_tests.log, cuda_tests.xml   pytest's output and its JUnit report
#   cost_openvla.json, cost.log      vla-accel cost's JSON object and its table
#   sim_summary.json, sim.log        vla-accel sim's summary.json and its output (node log's tail on failure)
#
# Environment: PYTHON (default python3: on the lent GPU machines the interpreter that holds torch),
# OUT, CUDA_TESTS (the test files), TESTS_S, COST_S, SIM_S (the steps' limits in seconds).
set -u

PY=${PYTHON:-python3}
OUT=${OUT:-outputs/device_run}
CUDA_TESTS=${CUDA_TESTS:-"test/ros/test_node_device.py test/models/test_devices.py test/models/test_lerobot.py test/models/test_token_fast_path.py test/evaluation/test_cost.py"}
TESTS_S=${TESTS_S:-180}
COST_S=${COST_S:-180}
SIM_S=${SIM_S:-150}
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
step cuda_tests "$TESTS_S" "$OUT/cuda_tests.log" "torch pytest numpy" \
    "$PY" -m pytest -q -k cuda -rs --junitxml="$OUT/cuda_tests.xml" $CUDA_TESTS

step cost "$COST_S" "$OUT/cost.log" "torch transformers numpy" \
    "$PY" -m vla_accel_ros.cli cost --family openvla --device cuda --out "$WORK/cost"
[ -f "$WORK/cost/cost.json" ] && cp "$WORK/cost/cost.json" "$OUT/cost_openvla.json"  # what --json prints

step sim "$SIM_S" "$OUT/sim.log" "torch transformers mujoco pinocchio rclpy" \
    "$PY" -m vla_accel_ros.cli sim --device cuda --checkpoint checkpoints/hf_small --decoder kerv --episodes 2 \
        --duration-s 6 --out "$WORK/sim" --realtime-priority 0
if [ -f "$WORK/sim/summary.json" ]; then
    cp "$WORK/sim/summary.json" "$OUT/sim_summary.json"
elif [ -f "$WORK/sim/vla_accel_node.log" ]; then
    { echo "--- vla_accel_node.log, last 40 lines"; tail -n 40 "$WORK/sim/vla_accel_node.log"; } >>"$OUT/sim.log"
fi

"$PY" - "$STEPS" "$OUT" <<'EOF'
"""device_run.json: the machine, and what each step ran and gave."""
import json
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

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
        step["missing_modules"] = absent.split()
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
summary = out / "sim_summary.json"
if summary.is_file():
    sim = json.loads(summary.read_text())
    keys = ("episodes", "success_rate", "ticks", "ticks_published", "fallback_ticks", "hold_ticks",
            "deadline_misses", "inference_latency_ms_p50", "inference_latency_ms_p99", "inference_target_passes_mean")
    record["sim"] = {k: sim.get(k) for k in keys}
cost = out / "cost_openvla.json"
if cost.is_file():
    table = json.loads(cost.read_text())
    record["cost"] = {name: {k: row.get(k) for k in ("median_ms", "bound_ms", "x_bound")}
                      for name, row in table.get("table", {}).items()}
(out / "device_run.json").write_text(json.dumps(record, indent=2) + "\n")
print(json.dumps(record, indent=2))
EOF
rm -rf "$WORK"
