#!/bin/bash
# Issue 29 (the fused all_reduce + residual + RMSNorm) on one GPU, in one device call, from a
# bundle (`cargo xtask gpu-bundle --out gpu-bundle`; this script run from the repository root
# with the bundle in ./gpu-bundle, or copied next to it). Logs go to $OUT/r (default
# ./fused-norm-out/r), packed at the end into one tarball, $OUT/fused-norm.tgz (a device call
# returns a few files only), each step bounded so the call stays under 10 minutes:
#
#   1. the fused call's GPU suites: collective-factory nvidia_fused_norm and
#      nvidia_fused_norm_random, cuda-ipc gpu_norm, detcoll-layers gpu_decoder (STAGE=bench
#      skips them; SUITES=all adds the factory's suites of the composite routes and shared
#      GPUs — nvidia_routes, nvidia_shared_gpu, nvidia_shared_gpu_processes,
#      virtual_nodes_gpu_processes — and leaves less time for the bench);
#   2. fused_norm_bench as shipped (default routing table, the kernels the bundle has: prebuilt
#      ones in its kernels/, else the run-time NVRTC build), ranks as threads, bf16, worlds
#      2/4/8, hidden 4096/8192: the small batches (1-64 rows, where the goal is missed: the
#      `fused form` column says which form each point took) twice, then the large ones once;
#   3. world 2 with the fused call on the all_reduce's route (LL push up to 512 KiB: the
#      world-1/2 table without its all_reduce_residual_rmsnorm rules, which this script writes)
#      against the shipped table (one-shot), alternating: the fused route's A/B
#      (benches/results/h100-2026-12-05-fused-route.md);
#   4. with KERNELS_B=<directory of another kernel image> (`cargo xtask build --arch sm_90
#      --out DIR`, carried): the small batches again on that image and on the shipped one,
#      alternating, in the same call (a candidate kernel against the baseline).
#
# Every bench point checks the bits: fused = unfused = one kernel, and every rank's y and h =
# fixed_tree::residual_rmsnorm (`= reference`). SM clocks are sampled into clock.csv.
# DRY=1 runs one small point per step (checks the script). NCCL_NVLS_ENABLE=0 throughout.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/run.sh" ] && [ -d "$here/tests" ]; then B="$here"; else B="$here/../../gpu-bundle"; fi
[ -d "$B" ] || B="$PWD/gpu-bundle"
cd "$B" || { echo "no bundle at $B"; exit 2; }
OUT="${OUT:-$PWD/fused-norm-out}"; R="$OUT/r"; mkdir -p "$R"
export NCCL_NVLS_ENABLE=0 CUDA_MODULE_LOADING=EAGER
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -d "$PWD/kernels" ] && export DETCOLL_KERNEL_DIR="$PWD/kernels"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { [ $(( 560 - $(el) )) -gt "$1" ]; }   # enough of the 10-minute call left for a step of $1 s
FB=./examples/collective-factory-fused_norm_bench
[ -x "$FB" ] || { echo "no $FB in the bundle"; exit 2; }
DRY=${DRY:-0}; STAGE=${STAGE:-all}
SMALL="1,2,4,8,16,17,24,32,33,48,64"; LARGE="128,512,2048,8192"; WORLDS="2,4,8"
if [ "$DRY" = 1 ]; then SMALL="1,8"; LARGE="512"; WORLDS="2"; fi
nvidia-smi -L > "$R/gpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader -lms 500 \
  > "$R/clock.csv" 2>&1 &
CLK=$!
trap 'kill $CLK 2>/dev/null' EXIT

bench() { # tag timeout [env=value ...] -- args...
  local t=$1 to=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  left "$to" || { echo "$t skipped (time) t=$(el)"; return; }
  env "${envs[@]}" timeout "$to" "$FB" "$@" > "$R/$t.md" 2> "$R/$t.err"
  echo "$t rc=$? t=$(el)"
  grep -c "| yes | yes |" "$R/$t.md" | sed "s/^/  points with the same bits and = reference: /"
  grep -E "\| no \||panicked|Error" "$R/$t.md" "$R/$t.err" | head -5
}

if [ "$STAGE" != bench ]; then
  MORE=()
  if [ "${SUITES:-norm}" = all ]; then
    for s in nvidia_routes nvidia_shared_gpu nvidia_shared_gpu_processes virtual_nodes_gpu_processes; do
      MORE+=(--suite "collective-factory-test-$s")
    done
  fi
  timeout 400 ./run.sh --suite collective-factory-test-nvidia_fused_norm \
    --suite collective-factory-test-nvidia_fused_norm_random --suite cuda-ipc-test-gpu_norm \
    --suite detcoll-layers-test-gpu_decoder "${MORE[@]}" > "$R/suites.log" 2>&1
  echo "suites rc=$? t=$(el)"
  grep -E "test result|FAILED|panicked|TIMEOUT" "$R/suites.log" | head -12
fi

for round in 1 2; do
  bench "small-$round" 150 -- --worlds $WORLDS --hidden 4096,8192 --rows $SMALL
  [ "$DRY" = 1 ] && break
done
bench large 150 -- --worlds $WORLDS --hidden 4096,8192 --rows $LARGE

# World 2 with the fused call on the all_reduce's route (the world-1/2 table without its
# all_reduce_residual_rmsnorm rules) against the shipped table, alternating.
cat > "$R/fused-on-ar-route.json" <<'EOF'
{
 "platform": "nvidia",
 "source": "diagnostic (benches/gpu-runs/fused-norm.sh): nvidia-2gpu.json without its all_reduce_residual_rmsnorm rules",
 "rules": [
  {"op": "all_reduce", "min_bytes": 0, "max_bytes": 524289, "route": "ipc_push_ll"},
  {"op": "all_reduce", "min_bytes": 524289, "max_bytes": 4194304, "route": "ipc_one_shot"},
  {"op": "all_reduce", "min_bytes": 4194304, "max_bytes": null, "route": "ipc_push"},
  {"op": "all_gather", "min_bytes": 0, "max_bytes": 524289, "route": "ipc_push_ll"},
  {"op": "all_gather", "min_bytes": 524289, "max_bytes": null, "route": "ipc_one_shot"},
  {"op": "reduce_scatter", "min_bytes": 0, "max_bytes": 65537, "route": "ipc_push_ll"},
  {"op": "reduce_scatter", "min_bytes": 65537, "max_bytes": null, "route": "ipc_push"},
  {"op": "reduce_scatter_many", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot"}
 ]
}
EOF
for round in 1 2; do
  bench "world2-fused-on-ar-route-$round" 60 DETCOLL_ROUTING_TABLE="$R/fused-on-ar-route.json" -- --worlds 2 --hidden 4096,8192 --rows $SMALL
  bench "world2-shipped-$round" 60 -- --worlds 2 --hidden 4096,8192 --rows $SMALL
  [ "$DRY" = 1 ] && break
done

if [ -n "${KERNELS_B:-}" ]; then
  [ -d "$KERNELS_B" ] || { echo "KERNELS_B=$KERNELS_B is not a directory"; exit 2; }
  A="${DETCOLL_KERNEL_DIR:-}"
  for round in 1 2; do
    bench "ab-$round-B" 120 DETCOLL_KERNEL_DIR="$KERNELS_B" -- --worlds $WORLDS --hidden 4096,8192 --rows $SMALL
    if [ -n "$A" ]; then
      bench "ab-$round-A" 120 DETCOLL_KERNEL_DIR="$A" -- --worlds $WORLDS --hidden 4096,8192 --rows $SMALL
    else
      bench "ab-$round-A" 120 -u DETCOLL_KERNEL_DIR -- --worlds $WORLDS --hidden 4096,8192 --rows $SMALL
    fi
    [ "$DRY" = 1 ] && break
  done
fi
kill $CLK 2>/dev/null
tar czf "$OUT/fused-norm.tgz" -C "$OUT" r && rm -rf "$R"
echo "done t=$(el): $OUT/fused-norm.tgz"
