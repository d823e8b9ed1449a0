//! The NVIDIA composition on a GPU host: world 1 through the factory (the CUDA IPC backend's
//! local route; no transport is built for one rank), every call of `common::plan` bit-exact
//! against fixed-tree. Skips, saying so, without a GPU. Several GPUs: `tests/nvidia_routes.rs`.
#![cfg(feature = "cuda")]
mod common;

#[test]
fn world1_through_the_factory_is_bit_exact() {
    common::world1::<common::nvidia::Nvidia>()
}

/// The front door as a Rust engine uses it: `nvidia::thread_group` (ranks as threads on this
/// host's GPUs), cudarc buffers through the typed entry points (dtype from `T`, no `unsafe`,
/// cudarc's event ordering), and the raw entry on the same ranks — every result bit-exact
/// against fixed-tree, the reported route what the table says.
#[test]
fn thread_group_typed_and_raw_entry_points_are_bit_exact() {
    use collective_core::conformance::data::{finite_values, reference_reduce};
    use collective_core::{Collective, DType, Op};
    use collective_factory::{Config, nvidia};
    let count = match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => n,
        other => {
            println!("skipped: no CUDA device ({other:?})");
            return;
        }
    };
    let world = 2;
    let ranks = nvidia::thread_group(world, &Config::new().with_capacity(1 << 20)).expect("thread group");
    let n = 4096;
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| finite_values(DType::F32, n, r as u64 + 11)).collect();
    let want = reference_reduce(&inputs, DType::F32);
    let as_f32 =
        |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let want_bits: Vec<u32> = as_f32(&want).iter().map(|x| x.to_bits()).collect();
    println!("world {world} on {count} GPU(s): route {:?}", ranks[0].route(Op::AllReduce, n * 4));
    // Ranks that are threads sharing one CUDA context must enqueue in call order (docs of
    // `IpcCollective::group`): every rank enqueues call k before any enqueues call k + 1.
    let order = std::sync::Barrier::new(world);
    std::thread::scope(|s| {
        for comm in &ranks {
            let inputs = &inputs;
            let want_bits = &want_bits;
            let order = &order;
            s.spawn(move || {
                let r = comm.rank();
                // A failed call reports its typed error, not wrong bits (called after a download,
                // which synchronised this rank's stream: the kernels of the call have finished).
                let check = |what: &str| {
                    if let Some(Err(e)) = comm.ipc().map(|ipc| ipc.check()) {
                        panic!("rank {r}: {what}: {e}");
                    }
                };
                let stream = comm.context().new_stream().expect("stream");
                let x = stream.clone_htod(&as_f32(&inputs[r])).expect("upload");
                let mut y = stream.alloc_zeros::<f32>(n).expect("alloc");
                comm.all_reduce_into(&x, &mut y, &stream).expect("typed all_reduce");
                order.wait();
                let got: Vec<u32> = stream.clone_dtoh(&y).expect("download").iter().map(|v| v.to_bits()).collect();
                check("typed all_reduce");
                assert_eq!(&got, want_bits, "rank {r}: typed all_reduce");
                // In place, then the raw entry on the same buffers.
                let mut z = stream.clone_htod(&as_f32(&inputs[r])).expect("upload");
                comm.all_reduce_in_place(&mut z, &stream).expect("in place");
                order.wait();
                let got: Vec<u32> = stream.clone_dtoh(&z).expect("download").iter().map(|v| v.to_bits()).collect();
                check("in-place all_reduce");
                assert_eq!(&got, want_bits, "rank {r}: in-place all_reduce");
                let mut w = stream.alloc_zeros::<f32>(n).expect("alloc");
                {
                    use cuda_ipc::cudarc::driver::{DevicePtr, DevicePtrMut};
                    let (xi, _gx) = x.device_ptr(&stream);
                    let (wo, _gw) = w.device_ptr_mut(&stream);
                    // SAFETY: live device buffers of this context, untouched until the stream
                    // synchronises below; the stream is this rank's.
                    unsafe { comm.enqueue_raw(Op::AllReduce, xi, wo, n, DType::F32, stream.cu_stream().cast()) }
                        .expect("raw all_reduce");
                }
                order.wait();
                let got: Vec<u32> = stream.clone_dtoh(&w).expect("download").iter().map(|v| v.to_bits()).collect();
                check("raw all_reduce");
                assert_eq!(&got, want_bits, "rank {r}: raw all_reduce");
                // all_gather through the typed entry: rank-major.
                let mut g = stream.alloc_zeros::<f32>(n * world).expect("alloc");
                comm.all_gather_into(&x, &mut g, &stream).expect("typed all_gather");
                order.wait();
                let got: Vec<u32> = stream.clone_dtoh(&g).expect("download").iter().map(|v| v.to_bits()).collect();
                check("typed all_gather");
                let gathered: Vec<u32> = inputs.iter().flat_map(|b| as_f32(b)).map(|v| v.to_bits()).collect();
                assert_eq!(got, gathered, "rank {r}: typed all_gather");
                comm.close().expect("close");
            });
        }
    });
}

/// Groups inside a job, ranks as threads on the GPU: eight thread ranks split (collectively,
/// `bootstrap::split`) into TP=4 groups (color rank / 4) and DP=2 groups (color rank % 4); each
/// group gets its own NVIDIA collective (`nvidia::thread_group` of its size), and every rank
/// runs its TP and its DP all_reduce from two threads at once, so collectives of different
/// groups are in flight together on the GPU. Bits against fixed-tree per group.
#[test]
fn tp_and_dp_groups_of_thread_ranks_run_concurrently_bit_exact() {
    use collective_core::bootstrap::{Bootstrap, LocalBootstrap, split};
    use collective_core::conformance::data::{finite_values, reference_reduce};
    use collective_core::{Collective, DType};
    use collective_factory::{Config, NvidiaCollective, nvidia};
    match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => {}
        other => {
            println!("skipped: no CUDA device ({other:?})");
            return;
        }
    }
    let world = 8;
    let n = 2048;
    // Which groups exist and who is in them: the split, done by the eight ranks together.
    let boots = LocalBootstrap::group(world);
    let members: Vec<(Vec<usize>, Vec<usize>)> = std::thread::scope(|s| {
        let hs: Vec<_> = boots
            .iter()
            .map(|b| {
                s.spawn(move || {
                    let r = b.rank();
                    let tp = split(b, Some((r / 4) as u32), r as u32).expect("tp split").expect("member");
                    let dp = split(b, Some((r % 4) as u32), r as u32).expect("dp split").expect("member");
                    (tp.parent_ranks().to_vec(), dp.parent_ranks().to_vec())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("split thread")).collect()
    });
    let mut groups: Vec<Vec<usize>> = members.iter().flat_map(|(t, d)| [t.clone(), d.clone()]).collect();
    groups.sort();
    groups.dedup();
    assert_eq!(groups.len(), 2 + 4, "{groups:?}");
    // One collective per group (ranks as threads, peer pointers), its ranks in group order.
    let config = Config::new().with_capacity(1 << 20);
    let mut built: Vec<(Vec<usize>, Vec<NvidiaCollective>)> = Vec::new();
    for g in &groups {
        built.push((g.clone(), nvidia::thread_group(g.len(), &config).expect("group collective")));
    }
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| finite_values(DType::F32, n, 40 + r as u64)).collect();
    let as_f32 =
        |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    std::thread::scope(|s| {
        for (g, comms) in &built {
            let want = reference_reduce(&g.iter().map(|&r| inputs[r].clone()).collect::<Vec<_>>(), DType::F32);
            let want_bits: Vec<u32> = as_f32(&want).iter().map(|x| x.to_bits()).collect();
            for (k, comm) in comms.iter().enumerate() {
                let parent = g[k];
                let (input, want_bits) = (as_f32(&inputs[parent]), want_bits.clone());
                s.spawn(move || {
                    let stream = comm.context().new_stream().expect("stream");
                    let x = stream.clone_htod(&input).expect("upload");
                    let mut y = stream.alloc_zeros::<f32>(n).expect("alloc");
                    for _ in 0..20 {
                        comm.all_reduce_into(&x, &mut y, &stream).expect("all_reduce");
                        stream.synchronize().expect("sync");
                    }
                    let got: Vec<u32> = stream.clone_dtoh(&y).expect("download").iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want_bits, "parent rank {parent} in group {g:?}");
                    comm.close().expect("close");
                });
            }
        }
    });
}

/// Every rank of `world` threads calling `f` with its own `LocalBootstrap` (one process per
/// rank, as threads): the results in rank order, and how long the slowest took.
fn each_rank<T: Send>(
    world: usize,
    f: impl Fn(std::sync::Arc<dyn collective_core::bootstrap::Bootstrap>) -> T + Sync,
) -> (Vec<T>, std::time::Duration) {
    use collective_core::bootstrap::LocalBootstrap;
    let t = std::time::Instant::now();
    let boots = LocalBootstrap::group_with_timeout(world, std::time::Duration::from_secs(10));
    let got = std::thread::scope(|s| {
        let hs: Vec<_> = boots.into_iter().map(|b| s.spawn(|| f(std::sync::Arc::new(b)))).collect();
        hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    });
    (got, t.elapsed())
}

/// Without the CUDA driver every entry point is `LibraryMissing` (docs/running.md): the thread
/// group at once, and `from_bootstrap` on every rank, through the agreement (no rank waits for
/// one that dropped out), naming the ranks that lack it. (`from_context` takes a
/// `CudaContext`, which cannot exist without the driver.) Skips, saying so, with a driver.
#[test]
fn without_the_driver_every_entry_point_is_library_missing_on_every_rank() {
    use collective_core::Error;
    use collective_factory::{Config, DeviceSelect, nvidia};
    if cuda_ipc::driver::driver_present() {
        println!("skipped: the CUDA driver is present");
        return;
    }
    let missing = |r: Result<_, Error>, ranks: &str| match r {
        Err(Error::LibraryMissing { library, detail }) => {
            assert!(library.contains("libcuda"), "{library}");
            assert!(detail.starts_with(ranks), "{detail}");
        }
        Err(e) => panic!("expected LibraryMissing, got {e:?}"),
        Ok(_) => panic!("expected LibraryMissing, got a collective"),
    };
    missing(nvidia::thread_group(2, &Config::new()).map(drop), "");
    for config in [
        Config::new(),
        Config::new().with_device(DeviceSelect::Ordinal(0)),
        // A missing library outranks the invalid capacity: another platform may still do.
        Config::new().with_capacity(0),
    ] {
        for world in [1, 2] {
            let (got, took) = each_rank(world, |boot| nvidia::from_bootstrap(boot, &config).map(drop));
            assert!(took < std::time::Duration::from_secs(5), "failing took {took:?}");
            for r in got {
                missing(r, if world == 1 { "rank 0: " } else { "ranks 0-1: " });
            }
        }
    }
}

/// A world of 0 ranks and a capacity of 0 are `InvalidConfig` before anything is opened (with
/// or without a GPU).
#[test]
fn world_zero_and_capacity_zero_are_invalid_config() {
    use collective_core::Error;
    use collective_factory::{Config, nvidia};
    for (world, config) in [(0, Config::new()), (2, Config::new().with_capacity(0))] {
        match nvidia::thread_group(world, &config) {
            Err(Error::InvalidConfig { .. }) => {}
            Err(e) => panic!("world {world}: expected InvalidConfig, got {e:?}"),
            Ok(_) => panic!("world {world}: expected InvalidConfig, got a collective"),
        }
    }
}

/// A host slice (`Io::host`, a safe constructor) on a GPU handle is refused before any work
/// (`Error::HostMemory`): the kernel would dereference a host address after the borrow ended.
/// The handle stays usable (nothing was enqueued).
#[test]
fn host_slices_on_a_gpu_handle_are_host_memory_errors() {
    use collective_core::{Collective, Error, Io};
    use collective_factory::{Config, nvidia};
    match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => {}
        other => {
            println!("skipped: no CUDA device ({other:?})");
            return;
        }
    }
    let comm = nvidia::thread_group(1, &Config::new().with_capacity(1 << 20)).expect("world 1").remove(0);
    assert!(!comm.host_memory());
    let stream = comm.context().new_stream().expect("stream");
    let x = vec![1.0f32; 64];
    let mut y = vec![-7.0f32; 64];
    match comm.all_reduce(Io::host(&x, &mut y), &stream) {
        Err(Error::HostMemory { argument: "input", .. }) => {}
        other => panic!("expected HostMemory, got {other:?}"),
    }
    comm.synchronize(&stream).expect("nothing was enqueued; the handle is usable");
    assert!(y.iter().all(|v| *v == -7.0));
}
