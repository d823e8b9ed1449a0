//! Ranks as threads sharing one GPU survive ordinary stream work between calls (issue 24): the
//! README's pattern (pageable uploads, allocation, the call, `synchronize`, download, frees) at
//! worlds 2, 4 and 8 on GPU 0, `DETCOLL_SHARED_GPU_CALLS` calls per world (default 10,000) over
//! every IPC route and chunked calls, with a fused all_reduce + residual + RMSNorm after every 7th,
//! no turn-taking of the test's own, every result bit-exact against fixed-tree, no error (a timeout
//! fails it). Skips, saying so, without a GPU.
#![cfg(feature = "cuda")]
mod shared_gpu;

use collective_factory::{Collective, Config, nvidia};
use std::sync::Mutex;
use std::time::Instant;

/// One world at a time: two groups sharing one GPU would contend for it (and its
/// multiprocessors: each group's kernels are sized for its own ranks only).
static ONE_WORLD: Mutex<()> = Mutex::new(());

fn world_on_one_gpu(world: usize) {
    if !shared_gpu::gpu_present() {
        return;
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

/// Issue 25 on the GPU: rank 0 driven by two threads, each with its own stream, rank 1 by one
/// thread; 1 MiB calls on a 256 KiB capacity (chunked). Every output must be one call's
/// constant `x0 + x1`, with `x0` the calling thread's input, and rank 1 must meet each of
/// rank 0's threads exactly `CALLS` times: whole calls are atomic per handle and run in the
/// order they were made, across streams.
#[test]
fn two_threads_with_their_own_streams_on_one_rank_are_atomic() {
    if !shared_gpu::gpu_present() {
        return;
    }
    let _one = ONE_WORLD.lock().unwrap_or_else(|e| e.into_inner());
    const CALLS: usize = 50;
    let n = (1 << 20) / 4;
    let config = Config::new().with_capacity(shared_gpu::CAPACITY).with_routing(shared_gpu::routing());
    let ranks = nvidia::thread_group(2, &config).expect("thread group");
    let call = |comm: &collective_factory::NvidiaCollective,
                stream: &std::sync::Arc<collective_factory::cudarc::driver::CudaStream>,
                x0: f32|
     -> f32 {
        let x = stream.clone_htod(&vec![x0; n]).unwrap();
        let mut y = stream.alloc_zeros::<f32>(n).unwrap();
        comm.all_reduce_into(&x, &mut y, stream).unwrap();
        comm.synchronize(stream).unwrap();
        let y = stream.clone_dtoh(&y).unwrap();
        assert!(y.iter().all(|v| v.to_bits() == y[0].to_bits()), "chunks of different calls mixed");
        y[0]
    };
    std::thread::scope(|s| {
        for t in 0..2usize {
            let comm = &ranks[0];
            s.spawn(move || {
                let stream = comm.context().new_stream().unwrap();
                for _ in 0..CALLS {
                    let x0 = 1.0 + t as f32;
                    let x1 = call(comm, &stream, x0) - x0;
                    assert!(x1 == 10.0 || x1 == 20.0, "thread {t}: x1 = {x1}");
                }
            });
        }
        let comm = &ranks[1];
        s.spawn(move || {
            let stream = comm.context().new_stream().unwrap();
            let mut met = [0usize; 2];
            for k in 0..2 * CALLS {
                let x1 = 10.0 * (1 + k % 2) as f32;
                let x0 = call(comm, &stream, x1) - x1;
                assert!(x0 == 1.0 || x0 == 2.0, "rank 1 call {k}: x0 = {x0}");
                met[x0 as usize - 1] += 1;
            }
            assert_eq!(met, [CALLS, CALLS]);
        });
    });
    println!("two threads on rank 0 with their own streams: {} calls each, atomic", CALLS);
}

/// 16 ranks as threads on one GPU: more than one IPC world holds, so the factory splits them
/// into two nodes of 8 (one CUDA IPC group each, the GPU's multiprocessors split among all 16)
/// joined by the host-staged transport; the README pattern, every result bit-exact, every call
/// by the hierarchical route.
#[test]
fn readme_pattern_world16_threads_on_one_gpu_by_the_hierarchical_route() {
    if !shared_gpu::gpu_present() {
        return;
    }
    let _one = ONE_WORLD.lock().unwrap_or_else(|e| e.into_inner());
    let config = Config::new().with_capacity(shared_gpu::CAPACITY);
    let ranks = nvidia::thread_group(16, &config).expect("thread group of 16");
    let n = ranks[0].nodes().expect("hierarchical backends");
    assert_eq!((n.layout().nodes, n.layout().local), (2, 8));
    assert!(n.cross().is_host_staged());
    let calls = (shared_gpu::calls() / 50).max(100);
    let t = Instant::now();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().map(|comm| s.spawn(move || shared_gpu::run_rank(comm, calls))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        let routes = res.unwrap_or_else(|e| panic!("world 16, rank {r}: {e}"));
        assert!(routes.keys().all(|k| ["hierarchical", "chunked", "fused"].contains(&k.as_str())), "{routes:?}");
    }
    println!("world 16 as threads on one GPU (2 nodes of 8): {calls} calls per rank in {:?}, 0 errors", t.elapsed());
}

/// A call one rank refuses while its peer makes it (see tests/refused_on_one_rank.rs, the CPU
/// twin's): on the GPU too, neither the peer's call nor the refusing rank's next one may
/// complete with a sum of two calls. Rank 1 refuses an all_reduce into an output one element
/// short (typed, before any work), then makes one of 1.0; rank 0 makes one of 100.0 then one of
/// 1.0. Every rank's `synchronize` after its calls must fail (`SignatureMismatch`, or
/// `Poisoned` carrying it); no output may hold 101. Written 2026-12-06; see docs/status.md for
/// whether it has run on a GPU.
#[test]
fn a_call_one_rank_refused_fails_on_both_ranks() {
    if !shared_gpu::gpu_present() {
        return;
    }
    let _one = ONE_WORLD.lock().unwrap_or_else(|e| e.into_inner());
    let n = 4096;
    let config = Config::new().with_capacity(shared_gpu::CAPACITY).with_timeout(std::time::Duration::from_secs(20));
    let ranks = nvidia::thread_group(2, &config).expect("thread group");
    std::thread::scope(|s| {
        for (r, comm) in ranks.iter().enumerate() {
            s.spawn(move || {
                let stream = comm.context().new_stream().unwrap();
                let mut outputs = Vec::new();
                let mut errors = Vec::new();
                for (k, v) in [(0, if r == 0 { 100.0f32 } else { 7.0 }), (1, 1.0)] {
                    let x = stream.clone_htod(&vec![v; n]).unwrap();
                    let short = r == 1 && k == 0;
                    let mut y = stream.alloc_zeros::<f32>(n - usize::from(short)).unwrap();
                    match comm.all_reduce_into(&x, &mut y, &stream) {
                        Ok(()) => outputs.push(y),
                        Err(e) if short => assert!(
                            matches!(e, collective_core::Error::LengthMismatch { .. }),
                            "rank 1's bad call: {e}"
                        ),
                        Err(e) => errors.push(e),
                    }
                }
                let synced = comm.synchronize(&stream);
                for y in &outputs {
                    let y = stream.clone_dtoh(y).unwrap();
                    assert!(!y.contains(&101.0), "rank {r}: a sum of two different calls");
                }
                let failed = synced.err().or_else(|| errors.pop());
                // (Rank 0's second call may also wait out the lockstep for a step rank 1 never
                // takes: PeerTimeout, after the mismatch was recorded.)
                use collective_core::Error::{PeerTimeout, Poisoned, SignatureMismatch};
                match failed {
                    Some(SignatureMismatch { .. } | Poisoned { .. } | PeerTimeout { .. }) => {}
                    other => panic!("rank {r}: expected SignatureMismatch, got {other:?}"),
                }
            });
        }
    });
    println!("a call refused on one rank: SignatureMismatch on both, no mixed sum");
}
