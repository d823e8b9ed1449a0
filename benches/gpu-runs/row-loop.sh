#!/bin/bash
# The row loop (issue 29; branch row-loop): correctness on a GPU, then its A/B against main, in
# one device call. Carry a directory (e.g. devrun/, git-ignored) holding two bundle subsets:
#   new.tar.xz: this branch's `cargo xtask gpu-bundle --out gpu-bundle`, as
#     gpu-bundle/{run.sh,manifest.json,bin/xtask,examples/collective-factory-fused_norm_bench,
#     tests/collective-factory-test-nvidia_fused_norm, tests/collective-factory-test-nvidia,
#     tests/cuda-ipc-test-gpu, ...} (tar -cf - ... | xz -T2)
#   old.tar.xz: main's gpu-bundle/examples/collective-factory-fused_norm_bench
# and run `DIR=devrun LIMIT=560 bash benches/gpu-runs/row-loop.sh`. Steps, each bounded so the
# call ends by LIMIT seconds, results packed into $OUT/results.tgz after every step (a call cut
# short still returns what it had):
#   1. nvidia_fused_norm's more_rows_than_blocks_on_one_shot_in_one_kernel (grids of 1-6 blocks,
#      worlds 2/3/4/8, rows to 200 of 4096 and 70 of 8192: every rank's h and y = the reference);
#   2. fused_norm_bench of both bundles alternating (bf16, hidden 4096/8192, worlds 2/4/8, rows
#      1..256), up to three rounds: the fused call (one kernel in the row loop where the rows
#      outnumber the blocks) against main's (the norm's own launch there), and the one-kernel
#      column (the loop against main's epilogue);
#   3. the suites named in SUITES (default: collective-factory nvidia and cuda-ipc gpu) while
#      time is left.
# Then: python3 of the A/B (medians per point) as in benches/results/h100-2026-12-05-fused-route.md.
set -u
LIMIT=${LIMIT:-560}; DIR=${DIR:-devrun}
R=$(pwd); O=/tmp/r; mkdir -p $O
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( LIMIT - 15 - $(el) )); }
pack() { tar -czf $OUT/results.tgz -C /tmp r; }
for b in old new; do mkdir -p $b; (cd $b && xz -dc $R/$DIR/$b.tar.xz | tar -xf -); done
export NCCL_NVLS_ENABLE=0 CUDA_MODULE_LOADING=EAGER LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi -L > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader -lms 500 > $O/clock.csv 2>&1 &
echo "unpacked t=$(el)"
(cd new/gpu-bundle && timeout $(( $(left) < 200 ? $(left) : 200 )) ./run.sh --suite collective-factory-test-nvidia_fused_norm -- more_rows_than_blocks > $O/loop.log 2>&1)
echo "loop rc=$? t=$(el)"; grep -E "test result|FAILED|panicked|TIMEOUT|world" $O/loop.log | head -12
pack
ROWS=1,16,17,33,64,67,128,256
for r in 1 2 3; do
  for b in new old; do
    [ $(left) -gt 60 ] || { echo "bench $b-$r skipped (time) t=$(el)"; continue; }
    (cd $b/gpu-bundle && timeout $(( $(left) < 90 ? $(left) : 90 )) ./examples/collective-factory-fused_norm_bench --worlds 2,4,8 --hidden 4096,8192 --rows $ROWS > $O/$b-$r.md 2> $O/$b-$r.err); echo "$b-$r rc=$? t=$(el)"
    pack
  done
done
grep -c "| yes | yes |" $O/*.md
for s in ${SUITES:-collective-factory-test-nvidia cuda-ipc-test-gpu}; do
  [ $(left) -gt 30 ] || { echo "$s skipped (time)"; continue; }
  (cd new/gpu-bundle && timeout $(left) ./run.sh --suite $s > $O/$s.log 2>&1); echo "$s rc=$? t=$(el)"
  grep -E "test result|FAILED|panicked|TIMEOUT" $O/$s.log | head -6
  pack
done
kill %1
pack
