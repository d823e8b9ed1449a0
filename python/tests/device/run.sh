#!/usr/bin/env bash
# The Python package's GPU checks, for a CUDA host with torch and without network or Rust:
#
#   WHEEL=/path/to/detcoll-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl OUT=/path/to/out \
#       python/tests/device/run.sh            # from the repository root
#
# Installs the wheel into a private folder (no network, no dependencies), starts MPS (several
# rank processes on one GPU), runs test_gpu.py (torch bf16/f16/f32 tensors at worlds 1/2/4/8 as
# processes with a gloo bootstrap group, a CUDA graph capture, the same tensors as stand-ins with
# only __cuda_array_interface__ or only __dlpack__ (standin_checks.py: bits against plain torch
# calls at worlds 1/2/8, the stream of each call, strided/misaligned refusals at worlds 1/2), the
# TP MLP example), the CPU suite when numpy is there, and the benchmark at world 1 (NCCL default,
# then NCCL Tree/Simple merged into the same table). Logs and JSON under $OUT; a compact summary
# (PASS/FAIL per step and per check) on stdout and in $OUT/summary.txt. Budget: under 8 minutes
# (steps limited to 300 + 3 x 50 s, plus setup; the GPU checks took ~95 s before the stand-ins).
#
# STEPS (default "gpu bench cpu"): which of the three steps run, e.g. STEPS=gpu for the GPU checks
# alone when a device call also runs other suites. PYTEST_ARGS: extra pytest arguments of the GPU
# checks, e.g. PYTEST_ARGS="-k fused_norm" for one check.
set -uo pipefail
cd "$(dirname "$0")/../../.."
STEPS="${STEPS:-gpu bench cpu}"
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
: "${WHEEL:?set WHEEL to the detcoll wheel (built with maturin on a machine with Rust)}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python3}"
TMP="$(mktemp -d)"
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
status=0
say() { echo "[+$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/summary.txt"; }
step() { # step NAME LIMIT_S LOG CMD...: runs CMD with a time limit, records PASS/FAIL
    local name=$1 limit=$2 logf=$3; shift 3
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$logf" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then say "PASS $name"; else say "FAIL $name (exit $rc; $OUT/$logf)"; status=1; fi
    return $rc
}

nvidia-smi -L 2>&1 | tee -a "$OUT/summary.txt"
# A wheel is a zip: without pip, unpacking it into the folder is the same install.
"$PY" -m pip install --quiet --no-deps --no-index --target "$TMP/site" "$WHEEL" >"$OUT/pip.log" 2>&1 \
    || "$PY" -m zipfile -e "$WHEEL" "$TMP/site" >>"$OUT/pip.log" 2>&1 \
    || { say "FAIL install of $WHEEL ($OUT/pip.log)"; exit 1; }
export PYTHONPATH="$TMP/site${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import os, detcoll, detcoll._nvrtc as nvrtc
print("detcoll", detcoll.__version__, "| NVRTC: DETCOLL_NVRTC =", os.environ.get("DETCOLL_NVRTC"),
      "| pip candidates", nvrtc.candidates()[:2], "| /usr/local/cuda", os.path.isdir("/usr/local/cuda"))
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda,
      "|", torch.cuda.device_count(), "x", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
PYEOF

# MPS, private to this run: several rank processes on one GPU run their kernels concurrently.
export CUDA_MPS_PIPE_DIRECTORY="$TMP/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$TMP/mps-log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
stop_mps() {
    if [ "${DETCOLL_TEST_MPS:-0}" = 1 ]; then
        echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
        sleep 1
        cp -r "$CUDA_MPS_LOG_DIRECTORY" "$OUT/mps-log" 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap stop_mps EXIT
if nvidia-cuda-mps-control -d >"$OUT/mps-start.log" 2>&1; then
    export DETCOLL_TEST_MPS=1
    # A client must get a context through it; otherwise run without MPS (worlds > GPUs skip).
    if timeout 60 "$PY" -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()" \
        >>"$OUT/mps-start.log" 2>&1; then
        say "MPS started (pipe $CUDA_MPS_PIPE_DIRECTORY)"
    else
        say "MPS started but a CUDA client failed through it ($OUT/mps-start.log): running without MPS"
        echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
        sleep 1
        export DETCOLL_TEST_MPS=0
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
else
    say "MPS did not start ($OUT/mps-start.log): worlds above the GPU count will report skipped"
fi

# 1. GPU checks (pytest when installed, else the file's own runner).
export DETCOLL_TEST_OUT="$OUT/gpu"
mkdir -p "$DETCOLL_TEST_OUT"
if ! want gpu; then
    say "SKIP gpu checks (STEPS=$STEPS)"
elif "$PY" -c "import pytest" 2>/dev/null; then
    step "gpu checks (pytest)" 300 gpu_tests.log \
        "$PY" -m pytest -v -rs -p no:cacheprovider ${PYTEST_ARGS:-} python/tests/device/test_gpu.py
else
    step "gpu checks (no pytest: built-in runner)" 300 gpu_tests.log "$PY" python/tests/device/test_gpu.py
fi
grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -n 40 | tee -a "$OUT/summary.txt"

# 2. The benchmark at world 1 (NCCL refuses two ranks on one GPU): defaults, then NCCL pinned
#    to Tree/Simple (what deterministic stacks use today) merged into the same table.
if want bench; then
BENCH=(python/benchmarks/benchmark_collectives.py --dtype bf16 --operations all_reduce all_gather reduce_scatter
       --size-bytes 4096 65536 1048576 16777216 --warmup 10 --iterations 50 --samples 5)
step "benchmark world 1 (NCCL defaults)" 50 bench_default.log \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 "${BENCH[@]}" --output "$OUT/bench_w1_default.json"
step "benchmark world 1 (NCCL_ALGO=Tree NCCL_PROTO=Simple, merged)" 50 bench_tree.log \
    env NCCL_ALGO=Tree NCCL_PROTO=Simple "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 "${BENCH[@]}" \
    --backends nccl --label "nccl[Tree/Simple]" --merge "$OUT/bench_w1_default.json" --output "$OUT/bench_w1.json"
for f in "$OUT/bench_w1.md" "$OUT/bench_w1_default.md"; do
    [ -f "$f" ] && { cat "$f" | tee -a "$OUT/summary.txt"; break; }
done
else
    say "SKIP benchmark (STEPS=$STEPS)"
fi

# 3. The CPU suite with this host's torch (the gloo-group bootstrap), when numpy is there.
if ! want cpu; then
    say "SKIP cpu suite (STEPS=$STEPS)"
elif "$PY" -c "import numpy, pytest" 2>/dev/null; then
    step "cpu suite with torch" 50 cpu_tests.log "$PY" -m pytest -q -rs -p no:cacheprovider python/tests \
        --ignore=python/tests/device
    tail -n 3 "$OUT/cpu_tests.log" | tee -a "$OUT/summary.txt"
else
    say "SKIP cpu suite: numpy or pytest is not installed here"
fi

[ -f "$OUT/gpu/summary.jsonl" ] && cp "$OUT/gpu/summary.jsonl" "$OUT/gpu_summary.jsonl" \
    && tee -a "$OUT/summary.txt" <"$OUT/gpu_summary.jsonl"
say "done: $([ $status -eq 0 ] && echo ALL PASSED || echo SOME FAILED); logs in $OUT"
exit $status
