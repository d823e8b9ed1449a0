//! The ROCm composition on an AMD GPU host: world 1 through the factory (the HIP IPC
//! backend's local route; no transport is built for one rank), every call of `common::plan`
//! (every op, f32/f16/bf16, in place and not, reduce_scatter_many) bit-exact against
//! fixed-tree. Skips, saying so, without a HIP device (no AMD GPU was available when this was
//! written: never executed). Several GPUs: `tests/rocm_routes.rs`.
#![cfg(feature = "rocm")]
mod common;

#[test]
fn world1_through_the_factory_is_bit_exact() {
    common::world1::<common::rocm::Rocm>()
}
