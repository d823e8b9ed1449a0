//! The README's GPU pattern with one process per rank, 4 processes sharing one GPU (under MPS,
//! which `cargo xtask gpu-test` starts for suites named `*process*`): `nvidia::from_bootstrap`
//! as a torchrun-started rank builds it, then `DETCOLL_SHARED_GPU_CALLS` calls (default 10,000)
//! of pageable uploads, allocation, the call, `synchronize`, download and frees, over every IPC
//! route and chunked calls, every result bit-exact against fixed-tree, no error. Skips, saying
//! so, without a GPU.
#![cfg(feature = "cuda")]
mod shared_gpu;

use collective_core::bootstrap::TcpBootstrap;
use collective_factory::{Config, nvidia};
use detcoll_launch::{LaunchSpec, launch_captured};
use std::sync::Arc;
use std::time::Instant;

const CHILD: &str = "DETCOLL_TEST_SHARED_GPU_CHILD";

#[test]
fn readme_pattern_world4_processes_on_one_gpu() {
    if std::env::var_os(CHILD).is_some() {
        let boot = Arc::new(TcpBootstrap::from_env().expect("bootstrap"));
        let config = Config::new().with_capacity(shared_gpu::CAPACITY).with_routing(shared_gpu::routing());
        let comm = nvidia::from_bootstrap(boot, &config).expect("nvidia::from_bootstrap");
        let routes = shared_gpu::run_rank(&comm, shared_gpu::calls()).unwrap_or_else(|e| panic!("{e}"));
        shared_gpu::check_routes(&routes).unwrap();
        println!("VERDICT routes {routes:?}");
        return;
    }
    if !shared_gpu::gpu_present() {
        return;
    }
    let world = 4;
    let exe = std::env::current_exe().unwrap();
    let spec = LaunchSpec::new(world, exe)
        .args(["readme_pattern_world4_processes_on_one_gpu", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        // Every process on GPU 0 (from_bootstrap takes LOCAL_RANK % count): the test is about
        // processes sharing one GPU.
        .env("CUDA_VISIBLE_DEVICES", std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "0".into()));
    let t = Instant::now();
    let (outcome, outputs) = launch_captured(&spec).expect("launch");
    for (r, (s, out)) in outcome.statuses.iter().zip(&outputs).enumerate() {
        assert!(s.success() && out.contains("VERDICT"), "rank {r} failed:\n{out}");
    }
    let calls = shared_gpu::calls();
    let routes = outputs[0].lines().find(|l| l.contains("VERDICT")).unwrap_or_default().to_string();
    println!("world {world} as processes on one GPU: {calls} calls per rank in {:?}, 0 errors, {routes}", t.elapsed());
}
