#!/bin/bash
# One device call: every GPU suite of the bundle (threads on one GPU; processes under MPS),
# then world-2 thread latency of the previous main vs this tree, then host path old vs new.
set -u
cd "$(dirname "$0")/../gpu-bundle"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
echo "== suites" ; date
timeout 420 ./run.sh > "$OUT/suites.log" 2>&1; echo "suites rc=$?" | tee -a "$OUT/suites.log"
tail -45 "$OUT/suites.log"
echo "== latency (world 2 threads on one GPU), old then new then old"; date
SIZES=4096,65536,1048576,16777216
for who in old new old2; do
  bin=./bin/xtask; [ "$who" != new ] && bin=./extra/xtask-old
  CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 100 $bin bench --backend cuda --threads --nproc 2 --operations all_reduce,all_gather,reduce_scatter --size-bytes $SIZES --warmup 10 --iterations 50 --samples 5 --output "$OUT/lat-$who.json" > "$OUT/lat-$who.md" 2> "$OUT/lat-$who.err"; echo "$who rc=$?"
  grep -E "^\|" "$OUT/lat-$who.md" | head -20
done
echo "== host path"; date
for who in old new; do
  timeout 60 ./extra/host_path-$who --bench --warm-up-time 1 --measurement-time 3 > "$OUT/host-$who.txt" 2>&1; echo "$who rc=$?"
  grep -E "time:|^[a-z_/0-9 ]+$" "$OUT/host-$who.txt" | head -30
done
date
