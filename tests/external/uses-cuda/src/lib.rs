//! What a downstream crate calls to get the NVIDIA collective (compiled against the linking
//! mode the application picked: detcoll's dynamic loading, or candle's dynamic linking).
#![forbid(unsafe_code)]

use collective_core::Error;
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_factory::{Config, NvidiaCollective};
use std::sync::Arc;

/// One rank on its own (world 1), with 1 MiB of staging.
pub fn single_rank() -> Result<NvidiaCollective, Error> {
    let boot: Arc<dyn Bootstrap> = Arc::new(LocalBootstrap::group(1).remove(0));
    collective_factory::nvidia::from_bootstrap(boot, &Config::new().with_capacity(1 << 20))
}

#[cfg(feature = "candle")]
/// cudarc's own API is usable next to detcoll in the same build (candle's features).
pub fn cudarc_version() -> u32 {
    cudarc::driver::sys::CUDA_VERSION
}
