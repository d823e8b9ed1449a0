//! The NVIDIA composition on a GPU host: world 1 through the factory (the CUDA IPC backend's
//! local route; no transport is built for one rank), every call of `common::plan` bit-exact
//! against fixed-tree. Skips, saying so, without a GPU. Several GPUs: `tests/nvidia_routes.rs`.
#![cfg(feature = "cuda")]
mod common;

#[test]
fn world1_through_the_factory_is_bit_exact() {
    common::world1::<common::nvidia::Nvidia>()
}
