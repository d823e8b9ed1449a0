#!/bin/bash
# Device-side runner of h200-2026-12-05-epilogue-rows (the parts it used): bash devrun/go.sh PART...
# call1: clk normsuites-HEADall shipped:rt suitesB-HEADall; call2: suitesA-HEADall;
# call3: clk form:HEADall; call4: clk rule:HEADall; call5 (bundle with the rule):
# normsuites-HEADall suitesB-HEADall (HEADall: devrun/kv/HEADall.cubin.xz)
set -u
export NCCL_NVLS_ENABLE=0 CUDA_MODULE_LOADING=EAGER
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=$(pwd)
B=/tmp/b/gpu-bundle
if [ ! -d $B ]; then mkdir -p /tmp/b && xz -dc $R/devrun/new/bundle.tar.xz | tar -C /tmp/b -xf -; fi
for f in $R/devrun/kv/*.cubin.xz; do
  [ -e "$f" ] || continue
  n=$(basename $f .cubin.xz); mkdir -p /tmp/kd/$n
  [ -e /tmp/kd/$n/detcoll_cuda.sm_90.cubin ] || xz -dc $f > /tmp/kd/$n/detcoll_cuda.sm_90.cubin
done
mkdir -p /tmp/kd/rt  # no image: the run-time (NVRTC) build, as shipped
FB=$B/examples/collective-factory-fused_norm_bench
CB=$B/examples/cuda-ipc-cuda_bench
log() { echo "=== $* ($(date +%T))"; }
for part in "$@"; do
case $part in
  clk)  # SM clock samples every 200 ms into $OUT/clk.txt while the later parts run
    (nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader -lms 200 > ${OUT:-/tmp}/clk.txt 2>&1 &) ;;
  shipped:*)  # shipped:rt: the fused shapes and latency --small as shipped (run-time build), one round
    log "cmp round 1 image rt"
    DETCOLL_KERNEL_DIR=/tmp/kd/rt timeout 200 $FB --worlds 2,4,8 --hidden 4096,8192 --rows 1,8,64
    log "latency round 1 image rt"
    DETCOLL_KERNEL_DIR=/tmp/kd/rt timeout 150 $CB latency --small ;;
  normsuites-*)  # normsuites-IMG: the fused norm's GPU suites on image IMG
    img=${part#normsuites-}
    log "norm suites on $img"
    (cd $B && DETCOLL_KERNEL_DIR=/tmp/kd/$img ./bin/xtask gpu-test --bundle . --suite collective-factory-test-nvidia_fused_norm --suite collective-factory-test-nvidia_fused_norm_random --suite cuda-ipc-test-gpu_norm --suite detcoll-layers-test-gpu_decoder 2>&1 | grep -v "^test .* ok$") ;;
  suitesA-*)  # suitesA-IMG: conformance (threads, processes), gpu, gpu_norm on image IMG
    img=${part#suitesA-}
    log "suites A on $img"
    (cd $B && DETCOLL_KERNEL_DIR=/tmp/kd/$img ./bin/xtask gpu-test --bundle . --suite cuda-ipc-test-conformance --suite cuda-ipc-test-conformance_processes --suite cuda-ipc-test-gpu --suite cuda-ipc-test-gpu_norm 2>&1 | grep -v "^test .* ok$") ;;
  suitesB-*)  # suitesB-IMG: the factory's GPU suites but the fused norm's, and the decoder
    img=${part#suitesB-}
    log "suites B on $img"
    (cd $B && DETCOLL_KERNEL_DIR=/tmp/kd/$img ./bin/xtask gpu-test --bundle . --suite collective-factory-test-nvidia_routes --suite collective-factory-test-nvidia_shared_gpu --suite collective-factory-test-nvidia_shared_gpu_processes --suite collective-factory-test-virtual_nodes_gpu_processes 2>&1 | grep -v "^test .* ok$") ;;
  form:*)  # form:IMG: the front door's form on RS+AG (default table, 16-64 rows, two rounds), then RS+AG and bulk push forced
    img=${part#form:}
    for round in 1 2; do
      log "form round $round default table image $img"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 150 $FB --worlds 4,8 --hidden 4096,8192 --rows 16,24,32,40,48,64
    done
    for t in rsag push; do
      log "form forced $t image $img"
      DETCOLL_ROUTING_TABLE=$R/devrun/$t.json DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 150 $FB --worlds 2,4,8 --hidden 4096,8192 --rows 1,4,8,16,32,64
    done ;;
  rule:*)  # rule:IMG: the front door's form by rows per block, default table, worlds 2/4/8, two rounds
    img=${part#rule:}
    for round in 1 2; do
      log "rule round $round default table image $img"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 200 $FB --worlds 2,4,8 --hidden 4096,8192 --rows 1,8,16,17,24,32,33,40,48,64
    done ;;
esac
done
