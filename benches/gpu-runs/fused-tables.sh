#!/bin/bash
# Issue 29: which route the fused all_reduce + residual + RMSNorm should take, measured by
# routing tables alone (no kernel change): fused_norm_bench (bf16, ranks as threads on one GPU,
# hidden 4096/8192) under the shipped tables and under tables that send the fused call to
# another route (its `all_reduce_residual_rmsnorm` rules; the all_reduce keeps its own), the
# variants alternating. Carry a directory (DIR, default devrun/) holding new.tar.xz (a
# `cargo xtask gpu-bundle --out gpu-bundle` packed with `tar -cf - gpu-bundle | xz`); results
# (one table per variant and round) packed into $OUT/results.tgz after every step. SUITES (names
# `./run.sh --suite` takes) run after the bench, each bounded, while time is left before LIMIT.
set -u
ROUNDS=${ROUNDS:-1}
. "$(dirname "$0")/run-lib.sh"
T=new/gpu-bundle/tables; mkdir -p $O/tables
# table <name> <base table> <fused route>: the base's all_reduce/all_gather/reduce_scatter rules,
# the fused call on <fused route> at every size.
table() {
  python3 - "$T/$2" "$3" "$O/tables/$1.json" <<'PY'
import json, sys
base, route, out = sys.argv[1:]
t = json.load(open(base))
t["rules"] = [r for r in t["rules"] if r["op"] != "all_reduce_residual_rmsnorm"]
t["rules"].append({"op": "all_reduce_residual_rmsnorm", "min_bytes": 0, "max_bytes": None, "route": route})
t["source"] = f"diagnostic (benches/gpu-runs/fused-tables.sh): {base.split('/')[-1]}, the fused call on {route}"
json.dump(t, open(out, "w"), indent=1)
PY
}
[ -d $T ] || { T=$R/crates/collective-factory/tables; }
table w2-rs-ag nvidia-2gpu.json ipc_rs_ag
table w2-one-shot nvidia-2gpu.json ipc_one_shot
table w48-one-shot nvidia-default.json ipc_one_shot
run() { # tag table-or-"" worlds rows
  [ $(left) -gt 30 ] || { echo "$1 skipped (time) t=$(el)"; return; }
  local envs=(); [ -n "$2" ] && envs=(DETCOLL_ROUTING_TABLE=$O/tables/$2.json)
  (cd new/gpu-bundle && env "${envs[@]}" timeout $(cap 150) ./examples/collective-factory-fused_norm_bench --worlds $3 --hidden 4096,8192 --rows $4 > $O/$1.md 2> $O/$1.err)
  echo "$1 rc=$? t=$(el) same-bits-and-reference: $(grep -c '| yes | yes |' $O/$1.md)"
  pack
}
W2ROWS=${W2ROWS:-64,128,256,512,2048,8192}; W48ROWS=${W48ROWS:-16,32,64,128,256,512}
for r in $(seq 1 $ROUNDS); do
  run w2-shipped-$r "" 2 $W2ROWS
  run w2-rs-ag-$r w2-rs-ag 2 $W2ROWS
  run w2-one-shot-$r w2-one-shot 2 $W2ROWS
  run w48-shipped-$r "" 4,8 $W48ROWS
  run w48-one-shot-$r w48-one-shot 4,8 $W48ROWS
done
run_suites
kill %1
pack
