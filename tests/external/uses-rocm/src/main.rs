//! Without ROCm, building the ROCm collective must be a typed error, never a panic.
#![forbid(unsafe_code)]

use collective_factory::bootstrap::{Bootstrap, LocalBootstrap};
use std::sync::Arc;

fn main() {
    let boot: Arc<dyn Bootstrap> = Arc::new(LocalBootstrap::group(1).remove(0));
    match collective_factory::rocm::from_bootstrap(boot, &collective_factory::Config::new().with_capacity(1 << 20)) {
        Ok(_) => println!("uses-rocm: ROCm collective built (an AMD GPU is present)"),
        Err(e) => println!("uses-rocm: no AMD GPU here, typed error: {e}"),
    }
}
