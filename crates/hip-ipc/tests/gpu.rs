//! GPU behaviour beyond the conformance suite on the HIP IPC twin: the shared GPU suite
//! (`gpu_conformance::gpu_suite!`, the same cases as `cuda-ipc/tests/gpu.rs`: long randomized
//! back-to-back sequences, generations wrapping, fail-closed protocol errors — mismatched calls
//! and lane splits, a rank that never arrives, a call after the peer closed — and the fused
//! tree kernel, hardware and software arithmetic, against `fixed-tree`), and graph capture not
//! being claimed. All ranks are threads on HIP device 0.
//!
//! Not here: graph capture and replay (`HipIpcCollective` does not claim HIP graphs, see
//! `graph_capture_is_not_claimed`).
//!
//! Without a HIP device (or without libamdhip64) each test prints "skipped: no HIP device
//! (...)" and passes. Never executed on an AMD GPU (none was available): see docs/rocm.md.
mod common;

use collective_core::Collective;
use common::Hip;
use gpu_conformance::{gpu, gpu_lock};
use hip_ipc::{HipIpcCollective, HipIpcConfig};

gpu_conformance::gpu_suite!(Hip);

// ---------------------------------------------------------------------------------------------
// Graph capture.
// ---------------------------------------------------------------------------------------------

/// HIP graph capture was never exercised, so `HipIpcCollective` must not claim it (the CUDA
/// twin claims it and replays captured calls in its `tests/gpu.rs`); every rank of every world
/// reports the same capabilities.
#[test]
fn graph_capture_is_not_claimed() {
    let Some(device) = gpu::<Hip>() else { return };
    let _l = gpu_lock();
    let config = HipIpcConfig::new(1 << 20);
    for world in [1, 2] {
        let comms = HipIpcCollective::group_on(&device, world, &config).expect("group");
        for c in &comms {
            let caps = c.capabilities();
            assert!(!caps.supports_graph_capture, "world {world} rank {}: graph capture claimed", c.rank());
            assert!(caps.strict_fixed_order);
            assert_eq!(caps.capacity_bytes, 1 << 20);
        }
        for c in &comms {
            c.close().expect("close");
        }
    }
}
