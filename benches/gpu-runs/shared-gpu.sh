#!/bin/sh
# Issue 24 on one GPU, in one device call (run from the repository root with gpu-bundle/
# carried): which stream work stalls thread ranks sharing a GPU without the engine's lockstep
# and that none does with it (shared_gpu_decompose, user defaults: lazy module loading, default
# CUDA_DEVICE_MAX_CONNECTIONS); the README pattern at worlds 2/4/8 as threads run as a user
# would (no gpu-test environment), then through gpu-test with 4 MPS processes and the engine's
# GPU suite. Logs under $OUT.
set -u
export NCCL_NVLS_ENABLE=0
B=gpu-bundle
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
CALLS=${CALLS:-10000}
STAGE=${STAGE:-all}  # all | user (decomposition + threads) | suites (+ MPS processes, engine suite) | cost (+ on/off timing)
if [ "$STAGE" != suites ]; then
D=$B/examples/collective-factory-shared_gpu_decompose
for w in 2 8; do
  for l in 0 1; do
    DETCOLL_LOCKSTEP=$l DETCOLL_TIMEOUT_MS=1500 timeout 60 $D --world $w --calls 200 --bytes 4096 \
      2>&1 | tee -a "$OUT/decompose.jsonl"
  done
done
start=$(date +%s)
DETCOLL_SHARED_GPU_CALLS=$CALLS timeout 330 $B/tests/collective-factory-test-nvidia_shared_gpu \
  --nocapture --test-threads=1 2>&1 | tee "$OUT/threads.txt" | grep -E "world|test result|panicked|FAILED"
echo "threads: $(( $(date +%s) - start )) s" | tee -a "$OUT/threads.txt"
fi
[ "$STAGE" = user ] && exit 0
DETCOLL_SHARED_GPU_CALLS=$CALLS timeout 400 $B/run.sh --suite nvidia_shared_gpu_processes --suite cuda-ipc-test-gpu \
  -- --nocapture 2>&1 | tee "$OUT/gpu-test.txt" | tail -40
[ "$STAGE" = suites ] && exit 0
# STAGE=all also: what the lockstep costs, the same binary with it on and off (ranks as
# threads on one GPU; world 8 without it may time out: that is what it prevents).
for l in 1 0; do
  DETCOLL_LOCKSTEP=$l DETCOLL_TIMEOUT_MS=3000 CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 \
    timeout 120 $B/examples/cuda-ipc-cuda_bench launch_cost latency --small 2>&1 | sed "s/^{/{\"lockstep\":\"$l\",/" \
    | tee -a "$OUT/cost.jsonl" | grep -E '"all_reduce"' | head -30
done
