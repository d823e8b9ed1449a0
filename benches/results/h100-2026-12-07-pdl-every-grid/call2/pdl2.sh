#!/bin/bash
# EXPERIMENT, second call: the shared-GPU README pattern at world 8 with programmatic launches
# of every grid (V2) against main's rule (V0), timed; then the suites under V2.
set -u
PREBUILT=1
. benches/gpu-runs/run-lib.sh
declare -A CAP=([V0]="1,8" [V1]="1,100000" [V2]="100000,100000")
t() { # t VARIANT SUITE CAPS FILTER...
  local v=$1 s=$2 c=$3; shift 3
  [ $(left) -gt 25 ] || { echo "$v $s skipped (time)"; return; }
  local t0=$(date +%s%N)
  (cd new/gpu-bundle && DETCOLL_X_PDL_GRID=${CAP[$v]} timeout $(cap $c) ./run.sh --suite $s -- "$@" > $O/$v-$s-$(echo "$*" | tr -c 'a-z0-9' _).log 2>&1)
  echo "$v $s $* rc=$? $(( ($(date +%s%N) - t0) / 1000000 )) ms t=$(el)"
  grep -h -E "^\| collective|^\| cuda|panicked|FAILED" $O/$v-$s-*.log | tail -2
  pack
}
export DETCOLL_SHARED_GPU_CALLS=2000
t V0 collective-factory-test-nvidia_shared_gpu 100 readme_pattern_world8 --nocapture
t V2 collective-factory-test-nvidia_shared_gpu 130 readme_pattern_world8 --nocapture
t V0 collective-factory-test-nvidia_shared_gpu 100 readme_pattern_world8 --nocapture
t V2 collective-factory-test-nvidia_shared_gpu 130 readme_pattern_world8 --nocapture
t V2 collective-factory-test-nvidia_shared_gpu 60 two_threads_with_their_own_streams
t V2 collective-factory-test-nvidia_fused_norm 90 fused_norm_equals_the_reference an_empty_batch more_rows_than_blocks raw_fused
t V2 collective-factory-test-conformance_routes 120
finish
