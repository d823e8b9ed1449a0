#!/bin/bash
# The same kernel source two ways: the bundle's prebuilt sm_90 image (`cargo xtask build`, NVRTC
# from a pip wheel on the build machine) against the image each process compiles at run time
# with the device's own NVRTC for its one world (DETCOLL_KERNEL_DIR unset: an example finds no
# image beside itself). fused_norm_bench (bf16, graphs), worlds WORLDS, rows ROWS, hidden
# 4096/8192, ROUNDS rounds alternating. Carry DIR (e.g. devrun/) holding new.tar.xz and run
#   DIR=devrun LIMIT=560 bash benches/gpu-runs/prebuilt-vs-runtime.sh
set -u
ROUNDS=${ROUNDS:-2}; WORLDS=${WORLDS:-2 4}; ROWS=${ROWS:-16,128,512,2048}
. "$(dirname "$0")/run-lib.sh"
IMAGE=$R/new/gpu-bundle/kernels
for r in $(seq 1 $ROUNDS); do
  for w in $WORLDS; do
    for b in prebuilt runtime; do
      [ $(left) -gt 40 ] || { echo "$b-$r w$w skipped (time) t=$(el)"; continue; }
      if [ $b = prebuilt ]; then export DETCOLL_KERNEL_DIR=$IMAGE; else unset DETCOLL_KERNEL_DIR; fi
      (cd new/gpu-bundle && timeout $(cap 150) ./examples/collective-factory-fused_norm_bench --worlds $w --hidden 4096,8192 --rows $ROWS >> $O/$b-$r.md 2>> $O/$b-$r.err)
      echo "$b-$r w$w rc=$? t=$(el)"
    done
    pack
  done
done
kill %1
pack
