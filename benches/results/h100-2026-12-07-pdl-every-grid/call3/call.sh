#!/bin/bash
# One device call on the landed bundle (every collective launch programmatic): the bench at the
# experiment's points (one round), the Python GPU checks on the wheel of this tree, then suites.
set -u
PREBUILT=1
. benches/gpu-runs/run-lib.sh
POINTS="2:4096:8,16,32,64,512 2:8192:4,8,16,32 4:4096:8,16,32,512 4:8192:8,16 8:4096:8,16,32,512 8:8192:8,16"
for pt in $POINTS; do
  IFS=: read -r w hid rows <<< "$pt"
  (cd new/gpu-bundle && timeout $(cap 60) ./examples/collective-factory-fused_norm_bench --worlds $w --hidden $hid --rows $rows >> $O/landed-1.md 2>> $O/landed-1.err); echo "landed $pt rc=$? t=$(el)"
done
pack
WHEEL=$(ls $R/devrun/detcoll-*.whl) && (STEPS=gpu WHEEL=$WHEEL OUT=$O/py timeout $(cap 170) python/tests/device/run.sh > $O/py.log 2>&1); echo "py rc=$? t=$(el)"; tail -22 $O/py/summary.txt 2>/dev/null; pack
SUITES="cuda-ipc-test-conformance collective-factory-test-nvidia_shared_gpu_processes collective-factory-test-nvidia_fused_norm_random cuda-ipc-test-gpu"
run_suites
finish
