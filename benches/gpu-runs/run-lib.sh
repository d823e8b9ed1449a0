# The common start of the device scripts that take a packed bundle (sourced by sweep.sh and
# fused-tables.sh): a time budget of LIMIT seconds (el: elapsed; left: what remains less a
# margin for packing; cap N: N bounded by it), results under /tmp/r packed into
# $OUT/results.tgz by `pack`, the bundle DIR/new.tar.xz unpacked into ./new, the environment
# every GPU run here uses (NVLS off), and SM clocks sampled into clock.csv; `run_suites` runs
# the bundle's suites named in SUITES, each bounded (SUITE_CAP seconds, default 300: the fused
# norm suite takes over 200 s on one H100 since it has 14 tests), while time is left.
# Build the prebuilt kernels before the bundle (`cargo xtask build --arch sm_90`; NVRTC from a
# pip `nvidia-cuda-nvrtc` wheel here): without them every test process compiles them with NVRTC
# on the device, and process suites (MPS) then take minutes (2026-12-06: gpu_decoder 8.5 s with
# the cubin, still compiling at 60 s without).
LIMIT=${LIMIT:-560}; DIR=${DIR:-devrun}
R=$(pwd); O=/tmp/r; mkdir -p $O
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( LIMIT - 15 - $(el) )); }
cap() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }
pack() { tar -czf $OUT/results.tgz -C /tmp r; }
mkdir -p new && (cd new && xz -dc $R/$DIR/new.tar.xz | tar -xf -)
export NCCL_NVLS_ENABLE=0 CUDA_MODULE_LOADING=EAGER LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# PREBUILT=1: the bundle's prebuilt kernels for the examples run directly too (run.sh sets this
# for the suites; an example finds no image beside itself, in examples/). Default 0: each bench
# process compiles its world's image with the device's NVRTC (about 30-40 s a world the first
# time, then the driver's cache), which is what a user's process runs — and on 1x H100 it ran
# some fused forms 4-10 % faster than the prebuilt image from the pip NVRTC 13.5 cubin
# (benches/results/h100-2026-12-06-two-tile-rows.md, call 4).
if [ "${PREBUILT:-0}" = 1 ] && [ -d "$R/new/gpu-bundle/kernels" ]; then
  export DETCOLL_KERNEL_DIR="$R/new/gpu-bundle/kernels"
fi
nvidia-smi -L > $O/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader -lms 1000 > $O/clock.csv 2>&1 &
echo "unpacked t=$(el)"
run_suites() {
  for s in ${SUITES:-}; do
    [ $(left) -gt 30 ] || { echo "$s skipped (time)"; continue; }
    (cd new/gpu-bundle && timeout $(cap ${SUITE_CAP:-300}) ./run.sh --suite $s > $O/$s.log 2>&1); echo "$s rc=$? t=$(el)"
    grep -E "test result|FAILED|panicked|TIMEOUT" $O/$s.log | head -6
    pack
  done
}
# The end of a bench script: how many bench rows of each results file gave the reference's bits
# (fused = unfused = one kernel, and = fixed_tree), the clock sampler stopped, results packed.
finish() {
  grep -c "| yes | yes |" $O/*.md
  kill %1
  pack
}
