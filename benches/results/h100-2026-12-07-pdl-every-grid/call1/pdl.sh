#!/bin/bash
# EXPERIMENT: programmatic launches for larger grids. One bundle, variants by DETCOLL_X_PDL_GRID
# ("plain cap,fused cap"): V0 = main's (1,8), V1 = fused any grid (1,100000), V2 = every launch
# (100000,100000). fused_norm_bench (bf16, graphs) alternating, ROUNDS rounds.
set -u
PREBUILT=1
. benches/gpu-runs/run-lib.sh
POINTS=${POINTS:-"2:4096:8,16,32,64,512,4096 2:8192:4,8,16,32 4:4096:8,16,32,64,512,4096 4:8192:4,8,16 8:4096:8,16,32,64,512,4096 8:8192:4,8,16"}
declare -A CAP=([V0]="1,8" [V1]="1,100000" [V2]="100000,100000")
for r in $(seq 1 ${ROUNDS:-2}); do
  for v in ${VARIANTS:-V0 V1 V2}; do
    for pt in $POINTS; do
      IFS=: read -r w hid rows <<< "$pt"
      [ $(left) -gt ${RESERVE:-20} ] || { echo "bench $v-$r $pt skipped (time)"; continue; }
      (cd new/gpu-bundle && DETCOLL_X_PDL_GRID=${CAP[$v]} timeout $(cap 60) ./examples/collective-factory-fused_norm_bench --worlds $w --hidden $hid --rows $rows >> $O/$v-$r.md 2>> $O/$v-$r.err)
      echo "$v-$r $pt rc=$? t=$(el)"
    done
    pack
  done
done
for t in ${TESTS_ENV:-}; do
  IFS=: read -r v suite filter <<< "$t"
  (cd new/gpu-bundle && DETCOLL_X_PDL_GRID=${CAP[$v]} timeout $(cap ${TESTS_CAP:-120}) ./run.sh --suite $suite -- $filter > $O/$v-$suite.log 2>&1)
  echo "$v $suite rc=$? t=$(el)"; grep -E "test result|FAILED|panicked|TIMEOUT" $O/$v-$suite.log | head -5
done
finish
