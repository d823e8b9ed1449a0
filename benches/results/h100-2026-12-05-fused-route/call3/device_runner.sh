#!/bin/bash
# call 3: the bundle with the fused call's own route (one-shot at world 2): its GPU suites, then
# world 2 fused_norm_bench on the new default table against the table without the fused rules
# (the fused call on the all_reduce's LL push route, as before), three rounds alternating.
set -u
R=$(pwd); O=$OUT/r; mkdir -p $O
rm -rf gpu-bundle; xz -dc devrun/small.tar.xz | tar -xf -
cd gpu-bundle
export NCCL_NVLS_ENABLE=0 CUDA_MODULE_LOADING=EAGER LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
FB=./examples/collective-factory-fused_norm_bench
nvidia-smi -L > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader -lms 500 > $O/clock.csv 2>&1 &
ROWS=1,2,4,8,16,17,24,32,33,64,128,512
for r in 1 2 3; do
  timeout 60 $FB --worlds 2 --hidden 4096,8192 --rows $ROWS > $O/new-$r.md 2> $O/new-$r.err; echo "new-$r rc=$? $(date +%T)"
  DETCOLL_ROUTING_TABLE=$R/devrun/old-2gpu.json timeout 60 $FB --worlds 2 --hidden 4096,8192 --rows $ROWS > $O/old-$r.md 2> $O/old-$r.err; echo "old-$r rc=$? $(date +%T)"
done
grep -c "| yes | yes |" $O/*.md
timeout 330 ./run.sh --suite collective-factory-test-nvidia_fused_norm --suite collective-factory-test-nvidia_fused_norm_random \
  --suite collective-factory-test-nvidia_routes --suite cuda-ipc-test-gpu_norm --suite detcoll-layers-test-gpu_decoder > $O/suites.log 2>&1
echo "suites rc=$? $(date +%T)"
grep -E "test result|FAILED|panicked|TIMEOUT" $O/suites.log | head -12
kill %1
cd $OUT && tar -czf results.tgz r && rm -rf r
