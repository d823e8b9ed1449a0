#!/bin/bash
# Issue 29: the row loop for rows of two tiles (hidden 8192, f16/bf16; dc_norm_two_tile_row_loop,
# measured in call 2 of benches/results/h100-2026-12-06-two-tile-rows.md and not shipped: on main
# this script times the shipped forms at those rows)
# where the rows outnumber the one-shot grid, against what the front door made of those batches
# before: the all_reduce then the norm's own launch, which is fused_norm_bench's `unfused`
# column of the same run (the bench's `one kernel` and `fused` columns are the loop). Carry DIR
# (e.g. devrun/) holding new.tar.xz (`cargo xtask gpu-bundle --out gpu-bundle`, packed with
# `tar -cf - gpu-bundle | xz -T2`) and run
#   DIR=devrun LIMIT=560 bash benches/gpu-runs/two-tile-loop.sh
# Steps, each bounded, results packed into $OUT/results.tgz after every step:
#   1. the suites in SUITES (default collective-factory-test-nvidia_fused_norm);
#   2. fused_norm_bench (bf16, hidden 8192, graphs), ROUNDS rounds (default 3), at and above
#      each world's grid on 132 multiprocessors (66, 33, 16 blocks) up to the fused call's
#      one-shot rule (4 MiB a rank at world 2, 2 MiB at worlds 4/8) and one point beyond.
set -u
SUITES=${SUITES:-collective-factory-test-nvidia_fused_norm}; ROUNDS=${ROUNDS:-3}
. "$(dirname "$0")/run-lib.sh"
run_suites
for r in $(seq 1 $ROUNDS); do
  for wr in "2 64,66,67,96,128,192,256,257" "4 33,34,48,64,96,128,129" "8 16,17,24,32,64,128,129"; do
    set -- $wr
    [ $(left) -gt 30 ] || { echo "bench $r w$1 skipped (time) t=$(el)"; continue; }
    (cd new/gpu-bundle && DETCOLL_KERNEL_DIR=$R/new/gpu-bundle/kernels timeout $(cap 120) ./examples/collective-factory-fused_norm_bench --worlds $1 --hidden 8192 --rows $2 >> $O/loop-$r.md 2>> $O/loop-$r.err)
    echo "loop-$r w$1 rc=$? t=$(el)"
  done
  pack
done
finish
