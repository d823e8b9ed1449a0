#!/bin/bash
# One device call: the layers' GPU suites (gated FFN), the gated e2e bench, then sweep rounds.
set -u
ROUNDS=${ROUNDS:-2}; WORLDS=${WORLDS:-2 4 8}
ROWS=${ROWS:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192}
. benches/gpu-runs/run-lib.sh
run_suites
if [ "${E2E:-1}" = 1 ] && [ $(left) -gt 200 ]; then
  (cd new/gpu-bundle && timeout $(cap 220) ./bin/xtask bench --backend cuda --e2e ffn --gated --tokens 1024,4096,16384 --warmup 2 --iterations 10 --graph --output $O/e2e-ffn-gated.json > $O/e2e-ffn-gated.md 2> $O/e2e-ffn-gated.err); echo "e2e rc=$? t=$(el)"
  tail -3 $O/e2e-ffn-gated.err; pack
fi
for r in $(seq 1 $ROUNDS); do
  for w in $WORLDS; do
    [ $(left) -gt 60 ] || { echo "sweep w$w-$r skipped (time) t=$(el)"; continue; }
    (cd new/gpu-bundle && timeout $(cap 200) ./examples/collective-factory-fused_norm_bench --worlds $w --hidden 4096,8192 --rows $ROWS > $O/sweep-$w-$r.md 2> $O/sweep-$w-$r.err); echo "sweep w$w-$r rc=$? t=$(el)"
    pack
  done
done
finish
