#!/bin/bash
# Issue 29: rows of two tiles (hidden 8192, f16/bf16) in registers with more rows than half the
# one-shot grid (dc_norm_two_tile_rows: rows <= grid, was 2 * rows <= grid). One bundle, two
# kernel images: the bundle's own (new, kernels/) and DIR/old-kernels/ (main's prebuilt cubin),
# each chosen by DETCOLL_KERNEL_DIR (an example run directly finds no image beside it and would
# compile one with NVRTC), so the host code is the same binary in both. Carry DIR (e.g. devrun/)
# holding new.tar.xz (`cargo xtask gpu-bundle --out gpu-bundle`, packed with
# `tar -cf - gpu-bundle | xz -T2`) and old-kernels/detcoll_cuda.sm_90.cubin, and run
#   DIR=devrun LIMIT=560 bash benches/gpu-runs/two-tile-rows.sh
# Steps, each bounded, results packed into $OUT/results.tgz after every step:
#   1. the suites in SUITES (default collective-factory-test-nvidia_fused_norm) on the new image;
#   2. fused_norm_bench (bf16, hidden 8192, graphs) of both images alternating, three rounds, at
#      the rows around the two grids' halves: world 2 (grid 66 on 132 SMs) 33-66, world 4
#      (33) 16-33, world 8 (16) 8-16, and one row count above the grid each (W2ROWS, W4ROWS,
#      W8ROWS override the lists).
# Then `python3 benches/gpu-runs/fused-ab.py <results>` (new-*.md against old-*.md).
set -u
SUITES=${SUITES:-collective-factory-test-nvidia_fused_norm}
. "$(dirname "$0")/run-lib.sh"
run_suites
OLD_DIR=$R/$DIR/old-kernels
for r in 1 2 3; do
  for b in new old; do
    for wr in "2 ${W2ROWS:-33,40,48,56,64,66,67}" "4 ${W4ROWS:-16,17,24,32,33,34}" "8 ${W8ROWS:-8,9,12,16,17}"; do
      set -- $wr
      [ $(left) -gt 30 ] || { echo "bench $b-$r w$1 skipped (time) t=$(el)"; continue; }
      if [ $b = old ]; then kd=$OLD_DIR; else kd=$R/new/gpu-bundle/kernels; fi
      (cd new/gpu-bundle && DETCOLL_KERNEL_DIR=$kd timeout $(cap 90) ./examples/collective-factory-fused_norm_bench --worlds $1 --hidden 8192 --rows $2 >> $O/$b-$r.md 2>> $O/$b-$r.err)
      echo "$b-$r w$1 rc=$? t=$(el)"
    done
    pack
  done
done
finish
