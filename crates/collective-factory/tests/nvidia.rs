//! The NVIDIA composition on a GPU host: world 1 through the factory (the CUDA IPC backend's
//! local route; no transport is built for one rank), every call of `common::plan` bit-exact
//! against fixed-tree. Skips, saying so, without a GPU. Several GPUs: `tests/nvidia_routes.rs`.
#![cfg(feature = "cuda")]
mod common;

use collective_core::Route;
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::conformance::skip;
use collective_factory::{NvidiaConfig, nvidia_collective};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn world1_through_the_factory_is_bit_exact() {
    if let Err(why) = common::cuda_devices() {
        return skip(&why);
    }
    let boot: Arc<dyn Bootstrap> = Arc::new(LocalBootstrap::group(1).remove(0));
    let comm = nvidia_collective(boot, &NvidiaConfig::new(common::CAPACITY)).expect("factory");
    let mut rank = common::Rank::new(comm, 0, Duration::from_secs(60)).expect("rank");
    let ran = rank.run(&|_| Route::Local);
    let closed = rank.close();
    if let Err(e) = ran.and(closed) {
        panic!("{e}");
    }
}
