#!/bin/bash
# One bundle, one kernel image (the bundle's prebuilt sm_90 cubin), the host's one-shot wide-tile
# rule toggled by DETCOLL_WIDE_ONE_SHOT: A = unset (main's forms), B = small (rows of 8192 within
# the grid in the 16 KiB tile, the loop once a block). Alternating, ROUNDS rounds. Then suites.
set -u
POINTS=${POINTS:-"2:8192:1,2,4,8,16,32,64 4:8192:1,4,8,16,32 8:8192:1,4,8,16 2:4096:1,8"}
. benches/gpu-runs/run-lib.sh
export DETCOLL_KERNEL_DIR=$R/new/gpu-bundle/kernels
ls $DETCOLL_KERNEL_DIR
for r in $(seq 1 ${ROUNDS:-3}); do
  for b in A B; do
    if [ $b = B ]; then rule=small; else rule=; fi
    for pt in $POINTS; do
      IFS=: read -r w hid rows <<< "$pt"
      [ $(left) -gt 20 ] || { echo "bench $b-$r $pt skipped (time)"; continue; }
      (cd new/gpu-bundle && DETCOLL_WIDE_ONE_SHOT=$rule timeout $(cap 60) ./examples/collective-factory-fused_norm_bench --worlds $w --hidden $hid --rows $rows >> $O/$b-$r.md 2>> $O/$b-$r.err)
      echo "$b-$r $pt rc=$? t=$(el)"
    done
  done
  pack
done
if [ -n "${SUITES:-}" ]; then DETCOLL_WIDE_ONE_SHOT=small run_suites; fi
python3 benches/gpu-runs/fused-ab.py $O B A > $O/ab.md 2>&1; cat $O/ab.md
finish
