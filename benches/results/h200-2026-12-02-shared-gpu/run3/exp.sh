#!/bin/sh
# Experiment: above_capacity worlds with old (be10d60, per-call lockstep) and new (per-launch lockstep) bundles
export NCCL_NVLS_ENABLE=0
mkdir -p $OUT old new
tar -C old -xJf devrun/bundle-be10d60.tar.xz; tar -C new -xJf devrun/bundle.tar.xz
t() { # label bundle env...
  label=$1; b=$2; shift 2
  s=$(date +%s)
  env "$@" timeout 100 $b/gpu-bundle/tests/cuda-ipc-test-conformance above_capacity::world --test-threads=1 > $OUT/$label.txt 2>&1
  echo "$label rc=$? $(( $(date +%s) - s ))s $(grep -E '^test above' $OUT/$label.txt | tr '\n' ' ')"
}
t old-conn1 old CUDA_DEVICE_MAX_CONNECTIONS=1
t new-conn1 new CUDA_DEVICE_MAX_CONNECTIONS=1
t new-default new X=1
t old-conn32 old CUDA_DEVICE_MAX_CONNECTIONS=32
t new-default2 new X=1
t old-default old X=1
