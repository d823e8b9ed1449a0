#!/bin/bash
# Experiment: fused two-launch calls cut into row pieces (L2-resident sums), A/B in one call.
set -u
. benches/gpu-runs/run-lib.sh
B() { # name env... : bench large rows, worlds W
  local name=$1; shift
  [ $(left) -gt 40 ] || { echo "$name skipped (time)"; return; }
  (cd new/gpu-bundle && env "$@" timeout $(cap 200) ./examples/collective-factory-fused_norm_bench --worlds $W --hidden 4096,8192 --rows $ROWS > $O/$name.md 2> $O/$name.err); echo "$name rc=$? t=$(el)"
  pack
}
W=2 ROWS=${ROWS:-512,1024,2048,8192}
B w2-base X=1
B w2-p2m DETCOLL_EXP_PIECE=2097152
B w2-p4m DETCOLL_EXP_PIECE=4194304
B w2-p8m DETCOLL_EXP_PIECE=8388608
W=4
B w4-base X=1
B w4-ng-p4m DETCOLL_EXP_NO_GATHERED=256 DETCOLL_EXP_PIECE=4194304
B w4-ng-p2m DETCOLL_EXP_NO_GATHERED=256 DETCOLL_EXP_PIECE=2097152
W=8
B w8-base X=1
B w8-ng-p2m DETCOLL_EXP_NO_GATHERED=256 DETCOLL_EXP_PIECE=2097152
B w8-ng-p1m DETCOLL_EXP_NO_GATHERED=256 DETCOLL_EXP_PIECE=1048576
kill %1
pack
