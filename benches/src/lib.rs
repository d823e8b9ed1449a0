//! Benchmarks of detcoll; the GPU/CPU-twin harness lives in xtask.
