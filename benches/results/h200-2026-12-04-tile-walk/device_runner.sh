#!/bin/bash
# Device-side runner: bash devrun/go.sh PART...  (logs under $OUT)
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
  rowform)  # A/B vs base at the row form's shapes, alternating, two rounds
    for round in 1 2; do for img in base A B; do
      log "rowform round $round image $img"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 120 $FB --worlds 2,4,8 --hidden 4096 --rows 1,8,64
    done; done ;;
  cmp:*)  # cmp:IMG1,IMG2,...: the row shapes at hidden 4096/8192, alternating, two rounds
    imgs=${part#cmp:}
    for round in 1 2; do for img in ${imgs//,/ }; do
      log "cmp round $round image $img"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 150 $FB --worlds 2,4,8 --hidden 4096,8192 --rows 1,8,64
    done; done ;;
  rsag:*)  # rsag:IMG1,IMG2: RS+AG fused shapes (worlds 4/8, 40-64 rows of 4096), alternating, two rounds
    imgs=${part#rsag:}
    for round in 1 2; do for img in ${imgs//,/ }; do
      log "cmp round $round image $img"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 150 $FB --worlds 4,8 --hidden 4096 --rows 40,48,64
    done; done ;;
  lat:*)  # lat:IMG1,IMG2: plain all_reduce latency (--small), alternating, two rounds
    imgs=${part#lat:}
    for round in 1 2; do for img in ${imgs//,/ }; do
      log "latency round $round image $img"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 150 $CB latency --small
    done; done ;;
  latfull:*)  # latfull:IMG1,IMG2: every size, one round
    imgs=${part#latfull:}
    for img in ${imgs//,/ }; do
      log "latency round 1 image $img"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 200 $CB latency
    done ;;
  res:*)  # res:IMG1,IMG2: registers and stack of the collective kernels
    imgs=${part#res:}
    for img in ${imgs//,/ }; do
      log "res-usage $img"
      /usr/local/cuda/bin/cuobjdump -res-usage /tmp/kd/$img/detcoll_cuda.sm_90.cubin 2>&1 | grep -A1 "Function detcoll_collective\|Function _Z18dc_collective_mode" | grep -v "^--" | paste - - | sed 's/  */ /g' | cut -c1-220
    done ;;
  midrows)  # the one-kernel form at 64-512 rows (shipped kernels, prebuilt base image)
    log "midrows base"
    DETCOLL_KERNEL_DIR=/tmp/kd/base timeout 300 $FB --worlds 2,4,8 --hidden 4096,8192 --rows 64,128,256,512 ;;
  midrows2)
    log "midrows base round 2"
    DETCOLL_KERNEL_DIR=/tmp/kd/base timeout 300 $FB --worlds 2,4,8 --hidden 4096,8192 --rows 96,128,192,256,384 ;;
  suites-*)  # suites-IMG: bits of image IMG
    img=${part#suites-}
    log "suites on $img"
    (cd $B && DETCOLL_KERNEL_DIR=/tmp/kd/$img ./bin/xtask gpu-test --bundle . --suite cuda-ipc-test-conformance --suite cuda-ipc-test-gpu --suite nvidia_fused_norm --suite gpu_decoder 2>&1 | grep -v "^test .* ok$") ;;
  shipped-*)  # shipped-SUITE: a suite as shipped (NVRTC at run time)
    s=${part#shipped-}
    log "shipped $s"
    (cd $B && ./bin/xtask gpu-test --bundle . --suite $s 2>&1 | grep -v "^test .* ok$") ;;
  w2:*)  # w2:IMG1,IMG2: world 2 fused shapes, table route and one-shot forced, alternating, two rounds
    imgs=${part#w2:}
    for round in 1 2; do for img in ${imgs//,/ }; do
      log "w2 round $round image $img table"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 100 $FB --worlds 2 --hidden 4096,8192 --rows 1,8,64
      log "w2 round $round image $img oneshot"
      DETCOLL_ROUTING_TABLE=$R/devrun/w2-oneshot.json DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 100 $FB --worlds 2 --hidden 4096,8192 --rows 1,8,64
    done; done ;;
  lat2:*)  # lat2:IMG: world 2 plain all_reduce, every route, 4 KiB - 1 MiB
    img=${part#lat2:}
    log "latency world 2 image $img"
    DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 200 $CB latency --worlds 2 --sizes 4096,16384,65536,262144,524288,1048576 ;;
  build:*)  # build:NAME1,NAME2[@MASK]: compile devrun/ksrc/NAME with the device's NVRTC (as the run-time build does), in parallel
    spec=${part#build:}; mask=0x6u
    case $spec in *@*) mask=${spec#*@}; spec=${spec%@*};; esac
    for n in ${spec//,/ }; do
      mkdir -p /tmp/kd/$n /tmp/kb/$n
      def=-DDC_WORLDS=$mask; [ $mask = all ] && def=
      (cd /tmp/kb/$n && python3 $R/benches/results/h200-2026-12-03-fused-norm-plan/nvrtc_build.py $R/devrun/ksrc/$n /tmp/kd/$n/detcoll_cuda.sm_90.cubin $def) &
    done; wait ;;
  suitesall-*)  # suitesall-IMG: the protocol's GPU suites on image IMG
    img=${part#suitesall-}
    log "all suites on $img"
    (cd $B && DETCOLL_KERNEL_DIR=/tmp/kd/$img ./bin/xtask gpu-test --bundle . --suite cuda-ipc-test-conformance --suite cuda-ipc-test-conformance_processes --suite cuda-ipc-test-gpu --suite cuda-ipc-test-gpu_norm --suite collective-factory-test-nvidia_routes --suite collective-factory-test-nvidia_fused_norm --suite collective-factory-test-nvidia_shared_gpu --suite collective-factory-test-nvidia_shared_gpu_processes --suite collective-factory-test-virtual_nodes_gpu_processes --suite detcoll-layers-test-gpu_decoder 2>&1 | grep -v "^test .* ok$") ;;
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
    (cd $B && DETCOLL_KERNEL_DIR=/tmp/kd/$img ./bin/xtask gpu-test --bundle . --suite collective-factory-test-nvidia_fused_norm --suite cuda-ipc-test-gpu_norm --suite detcoll-layers-test-gpu_decoder 2>&1 | grep -v "^test .* ok$") ;;
  ws:*)  # ws:IMG1,IMG2,...: worlds 4/8 fused at hidden 8192 (1, 8 rows) and 4096 (1 row), alternating, two rounds
    imgs=${part#ws:}
    for round in 1 2; do for img in ${imgs//,/ }; do
      log "cmp round $round image $img"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 100 $FB --worlds 8 --hidden 4096,8192 --rows 1,8
    done; done ;;
  lsuites-*)  # lsuites-IMG: conformance (threads) and the norm suite on image IMG
    img=${part#lsuites-}
    log "conformance and gpu_norm on $img"
    (cd $B && DETCOLL_KERNEL_DIR=/tmp/kd/$img ./bin/xtask gpu-test --bundle . --suite cuda-ipc-test-conformance --suite cuda-ipc-test-gpu_norm 2>&1 | grep -v "^test .* ok$") ;;
  w2t:*)  # w2t:IMG1,IMG2: world 2 fused shapes on the table's route only, alternating, two rounds
    imgs=${part#w2t:}
    for round in 1 2; do for img in ${imgs//,/ }; do
      log "w2 round $round image $img table"
      DETCOLL_KERNEL_DIR=/tmp/kd/$img timeout 100 $FB --worlds 2 --hidden 4096,8192 --rows 1,8,64
    done; done ;;
  sh:*) eval "${part#sh:}" ;;
esac
done
