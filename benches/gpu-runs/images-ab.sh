#!/bin/bash
# Several kernel images of one source tree, one host binary: fused_norm_bench run on each image
# in turn (chosen by DETCOLL_KERNEL_DIR), alternating, ROUNDS rounds, so their times compare
# within one warm machine; the image `old` is another bundle's binary with its own kernels. Carry DIR (e.g. devrun/) holding new.tar.xz (`cargo xtask gpu-bundle
# --out gpu-bundle`, packed with `tar -cf - gpu-bundle | xz -T2`) and, per image NAME in IMAGES,
# DIR/NAME/detcoll_cuda.sm_90.cubin (`cargo xtask build --arch sm_90` of that variant); the
# image `bundle` is the bundle's own. Run
#   DIR=devrun IMAGES="bundle A B" LIMIT=560 bash benches/gpu-runs/images-ab.sh
# Steps, each bounded, results packed into $OUT/results.tgz after every step:
#   1. the suites in SUITES (default collective-factory-test-nvidia_fused_norm; `all`: every
#      suite but the no-GPU ones in one gpu-test run, bounded by ALL_CAP seconds) on the
#      bundle's image;
#   2. TESTS_ON (optional): `image:suite:filter` entries separated by spaces, each a bundle test
#      binary run with its filter on that image, each bounded by TESTS_CAP seconds (default 120) (e.g. a fix's test on the image before it);
#   3. fused_norm_bench (bf16, graphs) on every image, ROUNDS (default 3) rounds, at the points
#      of POINTS: `world:hidden:rows,rows,...` separated by spaces.
# Then `python3 benches/gpu-runs/fused-ab.py <results> NAME BASE` for each pair.
set -u
SUITES=${SUITES:-collective-factory-test-nvidia_fused_norm}
POINTS=${POINTS:-"2:4096:1,8,16,32,64 2:8192:1,8,16,32 4:8192:8,16 8:8192:8,16"}
. "$(dirname "$0")/run-lib.sh"
# The image `old`: a second bundle, DIR/old.tar.xz (an earlier commit's `gpu-bundle`, its host
# binary and its own kernels), for a change of the host and the kernels together.
if [ -e $R/$DIR/old.tar.xz ]; then mkdir -p old && (cd old && xz -dc $R/$DIR/old.tar.xz | tar -xf -); fi
# Images may come xz-packed (DIR/NAME/detcoll_cuda.sm_90.cubin.xz): the carry is at most 64 MiB.
for f in $R/$DIR/*/*.cubin.xz; do [ -e "$f" ] && xz -dk "$f"; done
if [ "$SUITES" = all ]; then
  # Every GPU suite of the bundle in one gpu-test run (MPS around the process suites), less
  # the no-GPU suites: cuda-ipc's compiles every target with NVRTC, which ran past 430 s on
  # the device (2026-12-06) and is CI's job.
  args=""
  for t in new/gpu-bundle/tests/*; do
    n=$(basename "$t"); case $n in *no_gpu*) ;; *) args="$args --suite $n" ;; esac
  done
  (cd new/gpu-bundle && timeout $(cap ${ALL_CAP:-450}) ./run.sh $args > $O/all-suites.log 2>&1); echo "all suites rc=$? t=$(el)"
  grep -E "^\[gpu\] (summary|total)|FAILED|TIMEOUT|panicked" $O/all-suites.log | head -20
  pack
else
  run_suites
fi
for t in ${TESTS_ON:-}; do
  IFS=: read -r b suite filter <<< "$t"
  if [ $b = bundle ]; then kd=$R/new/gpu-bundle/kernels; else kd=$R/$DIR/$b; fi
  (cd new/gpu-bundle && DETCOLL_KERNEL_DIR=$kd timeout $(cap ${TESTS_CAP:-120}) ./tests/$suite $filter --nocapture > $O/$b-$suite.log 2>&1)
  echo "$b $suite $filter rc=$? t=$(el)"
  grep -E "test result|panicked" $O/$b-$suite.log | head -4
done
pack
for r in $(seq 1 ${ROUNDS:-3}); do
  for b in $IMAGES; do
    if [ $b = bundle ]; then kd=$R/new/gpu-bundle/kernels; else kd=$R/$DIR/$b; fi
    bd=new
    if [ $b = old ]; then kd=$R/old/gpu-bundle/kernels; bd=old; fi
    for pt in $POINTS; do
      IFS=: read -r w hid rows <<< "$pt"
      [ $(left) -gt 20 ] || { echo "bench $b-$r $pt skipped (time)"; continue; }
      (cd $bd/gpu-bundle && DETCOLL_KERNEL_DIR=$kd timeout $(cap 60) ./examples/collective-factory-fused_norm_bench --worlds $w --hidden $hid --rows $rows >> $O/$b-$r.md 2>> $O/$b-$r.err)
      echo "$b-$r $pt rc=$? t=$(el)"
    done
  done
  pack
done
finish
