#!/bin/bash
# The several-GPU run (issue 17) in one device call, from a bundle (`cargo xtask gpu-bundle
# --out gpu-bundle`, this script copied next to it or run from the repository root with the
# bundle in ./gpu-bundle). Results go to $OUT (default ./several-gpus-out) as one tarball, most
# important first, each step bounded so the whole call stays under 10 minutes:
#
#   1. every GPU suite (one process per GPU; thread ranks across GPUs where the suite has them)
#   2. compute-sanitizer memcheck / racecheck / synccheck on the randomized test (every route)
#      and on the across-GPU conformance suite
#   3. the bench, one process per GPU, every op, bf16, 4 KiB..256 MiB, default routing, eager and
#      CUDA graph, at every world 2/4/8 the host has (native NCCL default and Tree/Simple columns
#      come with every row)
#   4. every IPC route forced at the largest world, bf16, eager and graph
#   5. f16 and f32 at the largest world (default routing)
#   6. the end-to-end FFN and attention at TP/CP 1/2/4/8, ranks as threads of one process (the
#      e2e bench has no one-process-per-GPU mode and no native-NCCL layer yet: issue 17 asks
#      for both)
#   7. with WHEEL=<the detcoll Python wheel> and torch on the host: the Python benchmark
#      (python/benchmarks/benchmark_collectives.py under torchrun, one process per GPU) at every
#      world, NCCL default and Tree/Simple in one table (detcoll, NCCL, symmetric memory, vLLM)
#
# NCCL_NVLS_ENABLE=0 throughout (multicast objects are not to be created on shared hosts).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
if [ -x "$here/run.sh" ] && [ -d "$here/tests" ]; then B="$here"; else B="$here/../../gpu-bundle"; fi
cd "$B" || { echo "no bundle at $B"; exit 2; }
OUT="${OUT:-$PWD/several-gpus-out}"
R="$OUT/r"; mkdir -p "$R"
export NCCL_NVLS_ENABLE=0 DETCOLL_KERNEL_DIR="$PWD/kernels"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { [ $(( 560 - $(el) )) -gt "$1" ]; }   # enough of the 10-minute call left for a step of $1 s
G=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi -L > "$R/gpus.txt" 2>&1; nvidia-smi topo -m > "$R/topo.txt" 2>&1
echo "GPUs: $G"
WORLDS=""; for w in 2 4 8; do [ "$w" -le "$G" ] && WORLDS="$WORLDS $w"; done
TOP=$(echo $WORLDS | awk '{print $NF}')
[ -n "$TOP" ] || { echo "needs at least 2 GPUs"; exit 2; }

timeout 300 ./run.sh > "$R/suites.log" 2>&1; echo "suites rc=$? t=$(el)"
grep -E "^\| \*\*total|FAILED|panicked|TIMEOUT" "$R/suites.log" | head -12

SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  left 60 || break
  DETCOLL_TIMEOUT_MS=60000 CUDA_DEVICE_MAX_CONNECTIONS=32 DETCOLL_RANDOM_CALLS=100 timeout 50 $SAN --tool $tool --print-limit 6 \
    ./tests/cuda-ipc-test-gpu randomized_back_to_back_world2 --test-threads=1 > "$R/san-$tool.txt" 2>&1
  echo "san $tool rc=$? t=$(el)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$R/san-$tool.txt" | head -3
done
left 60 && { DETCOLL_TIMEOUT_MS=60000 timeout 50 $SAN --tool memcheck --print-limit 6 ./tests/cuda-ipc-test-conformance_gpus --test-threads=1 \
  > "$R/san-memcheck-gpus.txt" 2>&1; echo "san memcheck across GPUs rc=$? t=$(el)"; grep -E "ERROR SUMMARY|test result" "$R/san-memcheck-gpus.txt" | head -3; }

bench() { # tag timeout args...
  local t=$1 to=$2; shift 2
  left "$to" || { echo "$t skipped (time) t=$(el)"; return; }
  timeout "$to" ./bin/xtask bench --backend cuda --warmup 5 --iterations 30 --samples 5 "$@" \
    --output "$R/$t.json" > "$R/$t.md" 2> "$R/$t.err"; echo "$t rc=$? t=$(el)"; }
S="--size-bytes 4K,16K,64K,256K,1M,4M,16M,64M,256M"
for w in $WORLDS; do for g in "" "--graph --replays 4"; do
  bench "g$w-bf16${g:+-graph}" 60 --nproc $w $g $S
done; done
for r in ipc_one_shot ipc_rs_ag ipc_push_ll ipc_push; do for g in "" "--graph --replays 4"; do
  bench "g$TOP-$r${g:+-graph}" 45 --nproc $TOP --route $r $g --size-bytes 4K,64K,1M,16M,64M
done; done
for d in f16 f32; do bench "g$TOP-$d" 50 --nproc $TOP --dtype $d $S; done
for e in ffn attention; do
  bench "e2e-$e" 90 --e2e $e --tokens 1024,4096,16384 --warmup 2 --iterations 5 --graph
done
PYB="$here/../../python/benchmarks/benchmark_collectives.py"
if [ -n "${WHEEL:-}" ] && [ -f "$PYB" ] && python3 -c "import torch" 2>/dev/null; then
  PYSITE="$(mktemp -d)"; python3 -m pip install -q --no-deps --no-index --target "$PYSITE" "$WHEEL" > "$R/py-pip.txt" 2>&1
  for w in $WORLDS; do
    left 100 || { echo "py-bench g$w skipped (time) t=$(el)"; break; }
    PYA=(--dtype bf16 --size-bytes 4096 65536 1048576 16777216 67108864 --warmup 10 --iterations 50 --samples 5)
    PYTHONPATH="$PYSITE" timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node $w "$PYB" "${PYA[@]}" \
      --output "$R/py-g$w.json" > "$R/py-g$w.md" 2> "$R/py-g$w.err"; echo "py-bench g$w rc=$? t=$(el)"
    PYTHONPATH="$PYSITE" NCCL_ALGO=Tree NCCL_PROTO=Simple timeout 40 python3 -m torch.distributed.run --standalone \
      --nproc-per-node $w "$PYB" "${PYA[@]}" --backends nccl --label "nccl[Tree/Simple]" --merge "$R/py-g$w.json" \
      --output "$R/py-g$w-all.json" > "$R/py-g$w-all.md" 2> "$R/py-g$w-all.err"; echo "py-bench g$w Tree/Simple rc=$? t=$(el)"
  done
  rm -rf "$PYSITE"
else
  echo "py-bench skipped: set WHEEL to the detcoll wheel (and have torch) to run the Python benchmark"
fi
rm -f "$R"/*.svg
tar czf "$OUT/several-gpus.tgz" -C "$OUT" r && rm -rf "$R"
echo "done t=$(el): $OUT/several-gpus.tgz"
