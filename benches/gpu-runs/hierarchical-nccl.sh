#!/bin/bash
# Issue 30 in one device call: the hierarchical route with NCCL across virtual nodes on a host
# with several GPUs, from a bundle (`cargo xtask gpu-bundle`; this script run from the
# repository root with the bundle in ./gpu-bundle, or copied next to it). Results go to $OUT
# (default ./hierarchical-out), each step bounded so the call stays under 10 minutes.
#
# Layouts (G = GPUs on the host, every rank on a GPU of its own: DETCOLL_BENCH_GPU=rank, so the
# ranks of one local rank are on different GPUs and NCCL carries the step across nodes, and the
# native NCCL columns — default and NCCL_ALGO=Tree NCCL_PROTO=Simple — come with every row):
#   2 x G/2 and G/2 x 2 virtual nodes (2 x 1 where G = 2 is the flat route: one rank per node)
# Per layout, bf16, every op, 4 KiB..256 MiB, eager:
#   1. the default routing (hierarchical where the layout allows), bits against fixed-tree in
#      every row ("= fixed tree" column) and repeat-bitwise;
#   2. the flat transport route forced (`--route transport`): NCCL's rank-ordered all_gather and
#      the local tree over the whole world — the same bits, the other cost;
# then one GPU per virtual node (DETCOLL_BENCH_GPU=node, the node's ranks sharing it under MPS):
#   3. 2 x 2 on 2 GPUs and 4 x 2 on 4 GPUs, as the host allows.
# DRY=1 runs the same invocations on one GPU at 4 KiB..64 KiB (every rank on GPU 0: the step
# across nodes is staged through the host, not NCCL) to check the script itself.
#
# NCCL_NVLS_ENABLE=0 throughout (multicast objects are not to be created on shared hosts).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/run.sh" ] && [ -d "$here/tests" ]; then B="$here"; else B="$here/../../gpu-bundle"; fi
[ -d "$B" ] || B="$PWD/gpu-bundle"
cd "$B" || { echo "no bundle at $B"; exit 2; }
OUT="${OUT:-$PWD/hierarchical-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { [ $(( 560 - $(el) )) -gt "$1" ]; }   # enough of the 10-minute call left for a step of $1 s
G=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi -L > "$OUT/gpus.txt" 2>&1; nvidia-smi topo -m >> "$OUT/gpus.txt" 2>&1
DRY=${DRY:-0}
S="--size-bytes 4K,64K,1M,16M,256M"; ITER="--warmup 5 --iterations 20 --samples 5"
if [ "$DRY" = 1 ]; then S="--size-bytes 4K,64K"; ITER="--warmup 1 --iterations 3 --samples 2"; fi
if [ "$G" -lt 2 ] && [ "$DRY" != 1 ]; then echo "needs at least 2 GPUs (DRY=1 checks the script on one)"; exit 2; fi
# MPS for the layouts whose ranks share a GPU (one GPU per node, and the dry run).
mps_on() { nvidia-cuda-mps-control -d 2>/dev/null; export CUDA_DEVICE_MAX_CONNECTIONS=2; }
mps_off() { echo quit | nvidia-cuda-mps-control 2>/dev/null; unset CUDA_DEVICE_MAX_CONNECTIONS; }
bench() { # tag timeout args...
  local tag=$1 to=$2; shift 2
  left "$to" || { echo "$tag skipped (time) t=$(el)"; return; }
  timeout "$to" ./bin/xtask bench --backend cuda --operations all_reduce,reduce_scatter,all_gather $ITER "$@" \
    --output "$OUT/$tag.json" > "$OUT/$tag.md" 2> "$OUT/$tag.err"
  echo "$tag rc=$? t=$(el)"
}
echo "GPUs: $G, dry run: $DRY"
if [ "$DRY" = 1 ]; then
  mps_on
  for nl in "2 2" "2 4" "4 2"; do set -- $nl; n=$1; l=$2
    DETCOLL_BENCH_GPU=node bench "dry-${n}x${l}" 60 --nproc $((n * l)) --virtual-nodes $n $S
  done
  DETCOLL_BENCH_GPU=node bench "dry-2x2-flat" 60 --nproc 4 --virtual-nodes 2 --route transport $S
  mps_off
else
  LAYOUTS="2 $((G / 2))"; [ $((G / 2)) -gt 2 ] && LAYOUTS="$LAYOUTS,$((G / 2)) 2"
  IFS=, ; for nl in $LAYOUTS; do unset IFS; set -- $nl; n=$1; l=$2
    DETCOLL_BENCH_GPU=rank bench "${n}x${l}" 120 --nproc $((n * l)) --virtual-nodes $n $S
    DETCOLL_BENCH_GPU=rank bench "${n}x${l}-flat" 90 --nproc $((n * l)) --virtual-nodes $n --route transport $S
  done; unset IFS
  mps_on
  for nl in "2 2" "4 2"; do set -- $nl; n=$1; l=$2
    [ "$n" -le "$G" ] || continue
    DETCOLL_BENCH_GPU=node bench "${n}x${l}-gpu-per-node" 90 --nproc $((n * l)) --virtual-nodes $n $S
  done
  mps_off
fi
# One table of what ran: the route and the bits of every row.
for f in "$OUT"/*.md; do echo "== $(basename "$f")"; grep -E "^\| [0-9]" "$f" | awk -F'|' '{print $2,$3,$4,$5,$(NF-2),$(NF-1)}'; done > "$OUT/summary.txt"
echo "done t=$(el)"; cat "$OUT/summary.txt"
