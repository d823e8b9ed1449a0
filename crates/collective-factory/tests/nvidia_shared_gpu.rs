//! Ranks as threads sharing one GPU survive ordinary stream work between calls (issue 24):
//! the README's pattern (pageable uploads, allocation, the call, `synchronize`, download,
//! frees) at worlds 2, 4 and 8 on GPU 0, `DETCOLL_SHARED_GPU_CALLS` calls per world (default
//! 10,000) over every IPC route and chunked calls, no turn-taking of the test's own, every
//! result bit-exact against fixed-tree, no error (a timeout fails it). Skips, saying so,
//! without a GPU.
#![cfg(feature = "cuda")]
mod shared_gpu;

use collective_factory::{Config, nvidia};
use std::sync::Mutex;
use std::time::Instant;

/// One world at a time: two groups sharing one GPU would contend for it (and its
/// multiprocessors: each group's kernels are sized for its own ranks only).
static ONE_WORLD: Mutex<()> = Mutex::new(());

fn world_on_one_gpu(world: usize) {
    match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => {}
        other => {
            println!("skipped: no CUDA device ({other:?})");
            return;
        }
    }
    let _one = ONE_WORLD.lock().unwrap_or_else(|e| e.into_inner());
    // Rank r on GPU r % count: on the one-GPU device machine every rank shares GPU 0; on a
    // host with more GPUs, world / count ranks share each.
    let config = Config::new().with_capacity(shared_gpu::CAPACITY).with_routing(shared_gpu::routing());
    let ranks = nvidia::thread_group(world, &config).expect("thread group");
    let calls = shared_gpu::calls();
    let t = Instant::now();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().map(|comm| s.spawn(move || shared_gpu::run_rank(comm, calls))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    });
    let mut routes = None;
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(m) => routes = Some(m),
            Err(e) => panic!("world {world}, rank {r}: {e}"),
        }
    }
    let routes = routes.unwrap();
    shared_gpu::check_routes(&routes).unwrap();
    println!(
        "world {world} as threads on one GPU: {calls} calls per rank in {:?}, 0 errors, routes {routes:?}",
        t.elapsed()
    );
}

#[test]
fn readme_pattern_world2_threads_on_one_gpu() {
    world_on_one_gpu(2);
}

#[test]
fn readme_pattern_world4_threads_on_one_gpu() {
    world_on_one_gpu(4);
}

#[test]
fn readme_pattern_world8_threads_on_one_gpu() {
    world_on_one_gpu(8);
}
