#!/bin/sh
export NCCL_NVLS_ENABLE=0
mkdir -p $OUT old new
tar -C old -xJf devrun/bundle-be10d60.tar.xz; tar -C new -xJf devrun/bundle.tar.xz
cd new; s=$(date +%s)
timeout 400 gpu-bundle/run.sh -- --nocapture > $OUT/suites.txt 2>&1
echo "suites rc=$? $(( $(date +%s) - s ))s"; grep -E "^\|" $OUT/suites.txt | tail -40
cd ..
for b in old new; do for l in 1; do
  DETCOLL_LOCKSTEP=$l DETCOLL_TIMEOUT_MS=3000 timeout 60 $b/gpu-bundle/examples/cuda-ipc-cuda_bench launch_cost latency --small 2>&1 | sed "s/^{/{\"bundle\":\"$b\",/" >> $OUT/cost.jsonl
done; done
grep -c . $OUT/cost.jsonl
