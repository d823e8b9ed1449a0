#!/bin/bash
# Device run L (this session's only call: ~5 min of device time left): compute-sanitizer
# memcheck on the randomized world-2 sequence that takes every route (the current kernel), then
# the collective bench with 8 and 4 ranks as threads on one GPU (ordered enqueue, new this
# session), every op, bf16, 4 KiB-64 MiB, default routing, graph and eager. Results go straight
# to $OUT so a cut-off run still returns what finished.
set -u
cd "$(dirname "$0")/../gpu-bundle"
export NCCL_NVLS_ENABLE=0 DETCOLL_KERNEL_DIR="$PWD/kernels" CUDA_DEVICE_MAX_CONNECTIONS=32
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
DETCOLL_TIMEOUT_MS=60000 DETCOLL_RANDOM_CALLS=100 timeout 55 $SAN --tool memcheck --print-limit 6 ./tests/cuda-ipc-test-gpu randomized_back_to_back_world2 --test-threads=1 > "$OUT/san-memcheck.txt" 2>&1; echo "memcheck rc=$? t=$(el)"
grep -E "ERROR SUMMARY|test result|detcoll_protocol.h" "$OUT/san-memcheck.txt" | head -6
B="./bin/xtask bench --backend cuda --threads --operations all_reduce,all_gather,reduce_scatter,reduce_scatter_many --warmup 5 --iterations 30 --samples 5 --size-bytes 4K,64K,1M,16M,64M"
for run in "8 default --graph" "8 default" "8 ipc_push --graph" "4 default --graph" "4 default"; do
  set -- $run; w=$1; r=$2; g=${3:-}
  [ $(el) -gt 150 ] && break
  tag="t$w-$r${g:+-graph}"; ro=""; [ "$r" != default ] && ro="--route $r"
  timeout 50 $B --nproc $w $ro $g --output "$OUT/$tag.json" > "$OUT/$tag.md" 2> "$OUT/$tag.err"; echo "$tag rc=$? t=$(el)"
  grep -E "^\| [0-9]" "$OUT/$tag.md" | cut -c1-110 | head -30
  tail -3 "$OUT/$tag.err"
done
