#!/bin/bash
# Issue 29's whole matrix in one device call, plus the GPU suites named in SUITES first.
# Carry a directory (e.g. devrun/, git-ignored) holding new.tar.xz, a whole
# `cargo xtask gpu-bundle --out gpu-bundle` packed with `tar -cf - gpu-bundle | xz -T2`, and run
#   DIR=devrun LIMIT=560 SUITES="detcoll-layers-test-gpu_attention ..." bash benches/gpu-runs/sweep.sh
# Steps, each bounded so the call ends by LIMIT seconds, results packed into $OUT/results.tgz
# after every step (a call cut short still returns what it had):
#   1. the suites in SUITES;
#   2. fused_norm_bench (bf16, worlds WORLDS, hidden 4096/8192, rows ROWS), ROUNDS rounds, one
#      table per world and round (sweep-<world>-<round>.md), so a cut run keeps whole tables.
set -u
ROUNDS=${ROUNDS:-2}; WORLDS=${WORLDS:-2 4 8}
ROWS=${ROWS:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192}
. "$(dirname "$0")/run-lib.sh"
run_suites
for r in $(seq 1 $ROUNDS); do
  for w in $WORLDS; do
    [ $(left) -gt 40 ] || { echo "sweep w$w-$r skipped (time) t=$(el)"; continue; }
    (cd new/gpu-bundle && timeout $(cap 200) ./examples/collective-factory-fused_norm_bench --worlds $w --hidden 4096,8192 --rows $ROWS > $O/sweep-$w-$r.md 2> $O/sweep-$w-$r.err); echo "sweep w$w-$r rc=$? t=$(el)"
    pack
  done
done
finish
