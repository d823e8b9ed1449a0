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
table w2-push nvidia-2gpu.json ipc_push
table w48-one-shot nvidia-default.json ipc_one_shot
table w48-rs-ag nvidia-default.json ipc_rs_ag
run() { # tag table-or-"" worlds rows
  [ $(left) -gt 30 ] || { echo "$1 skipped (time) t=$(el)"; return; }
  local envs=(); [ -n "$2" ] && envs=(DETCOLL_ROUTING_TABLE=$O/tables/$2.json)
  (cd new/gpu-bundle && env "${envs[@]}" timeout $(cap 150) ./examples/collective-factory-fused_norm_bench --worlds $3 --hidden 4096,8192 --rows $4 > $O/$1.md 2> $O/$1.err)
  echo "$1 rc=$? t=$(el) same-bits-and-reference: $(grep -c '| yes | yes |' $O/$1.md)"
  pack
}
W2ROWS=${W2ROWS:-64,128,256,512,2048,8192}; W48ROWS=${W48ROWS:-16,32,64,128,256,512}
# VARIANTS: which tables run, alternating in each round (`shipped` is the bundle's own). Since
# the rows forms (rows of 4096 and 8192 normalised inside bulk push and RS+AG, 2026-12-06) the
# question is again where bulk push (world 2) and RS+AG (worlds 4/8) overtake one-shot:
#   VARIANTS="w2-shipped w2-push w48-shipped w48-rs-ag" W2ROWS=32,64,128,256,512 W48ROWS=64,128,256
VARIANTS=${VARIANTS:-"w2-shipped w2-rs-ag w2-one-shot w48-shipped w48-one-shot"}
for r in $(seq 1 $ROUNDS); do
  for v in $VARIANTS; do
    case $v in w2-*) worlds=2 rows=$W2ROWS ;; *) worlds=4,8 rows=$W48ROWS ;; esac
    case $v in *-shipped) t="" ;; *) t=$v ;; esac
    run $v-$r "$t" $worlds $rows
  done
done
run_suites
kill %1
pack
