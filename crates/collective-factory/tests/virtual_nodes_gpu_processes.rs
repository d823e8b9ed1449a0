//! Virtual nodes on one GPU: MPS processes grouped into simulated hosts
//! (`LaunchSpec::virtual_nodes`: `DETCOLL_HOST_ID`, per-node `LOCAL_RANK`), the hierarchical
//! route composed as the factory composes it for the CPU — the CUDA IPC collective inside each
//! virtual node (`cuda_ipc::new` over the node's `split`), the host-staged transport across
//! nodes (`StagedTransport<CudaDevice>`: NCCL refuses two ranks on one GPU, so the cross-node
//! step copies to the host and runs the host transport over the bootstrap) — and every op's bits checked against `fixed-tree` at
//! sizes from 4 KiB to 4 MiB per rank. Prints each layout's time per call. Skips, saying so,
//! without a GPU.
#![cfg(all(feature = "cuda", feature = "cpu"))]

use collective_core::bootstrap::{Bootstrap, TcpBootstrap, split};
use collective_core::conformance::data::{finite_values, reference_reduce};
use collective_core::{Collective, DType, Error, Io, Op, RawMut, RawRef, Route};
use collective_factory::nodes::{NodeLayout, Nodes, Scratch};
use collective_factory::{Platform, Routed, Routing};
use cuda_ipc::cudarc::driver::{CudaContext, sys};
use cuda_ipc::{CudaDevice, CudaIpcCollective, CudaIpcConfig};
use detcoll_host_transport::StagedTransport;
use detcoll_launch::{LaunchSpec, launch_captured};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const CHILD: &str = "DETCOLL_VNODES_GPU_CHILD";

fn check(r: sys::CUresult, what: &str) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// Device memory of the test, freed on drop.
struct Dev {
    ctx: Arc<CudaContext>,
    ptr: u64,
    bytes: usize,
}

impl Dev {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Dev {
        ctx.bind_to_thread().expect("bind");
        let mut ptr = 0;
        // SAFETY: out-pointer to a local; the context is current.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(256)) }, "cuMemAlloc");
        Dev { ctx: ctx.clone(), ptr, bytes }
    }
    fn upload(ctx: &Arc<CudaContext>, data: &[u8]) -> Dev {
        let d = Dev::new(ctx, data.len());
        // SAFETY: `d` holds `data.len()` bytes; copy from host memory.
        check(unsafe { sys::cuMemcpyHtoD_v2(d.ptr, data.as_ptr().cast(), data.len()) }, "cuMemcpyHtoD");
        // A "synchronous" copy from pageable memory may return before its DMA lands; kernels on
        // a non-blocking stream would not wait for it.
        // SAFETY: plain call on the current context.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize");
        d
    }
    fn download(&self) -> Vec<u8> {
        self.ctx.bind_to_thread().expect("bind");
        let mut out = vec![0u8; self.bytes];
        // SAFETY: `out` holds `bytes` bytes; synchronous copy.
        check(unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr, self.bytes) }, "cuMemcpyDtoH");
        out
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemAlloc; every stream using it was synchronised.
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// The hierarchical route's scratch row in device memory.
#[derive(Debug)]
struct DevScratch {
    ctx: Arc<CudaContext>,
    row: Mutex<Option<(u64, usize)>>,
}

impl Scratch for DevScratch {
    fn region(&self, bytes: usize) -> Result<u64, Error> {
        let mut row = self.row.lock().expect("scratch");
        if let Some((ptr, have)) = *row
            && have >= bytes
        {
            return Ok(ptr);
        }
        self.ctx.bind_to_thread().expect("bind");
        if let Some((ptr, _)) = row.take() {
            // SAFETY: the previous row; the call that used it was synchronised (the staged transport waits for its copies).
            unsafe { sys::cuMemFree_v2(ptr) };
        }
        let mut ptr = 0;
        // SAFETY: out-pointer to a local; the context is current.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(256)) }, "scratch alloc");
        *row = Some((ptr, bytes));
        Ok(ptr)
    }
}

fn child() {
    let boot: Arc<dyn Bootstrap> = Arc::new(TcpBootstrap::from_env().expect("bootstrap"));
    let (rank, world, local) = (boot.rank(), boot.world_size(), boot.local_world_size());
    let layout = NodeLayout { nodes: world / local, local };
    let (node, lr) = (layout.node(rank), layout.local_rank(rank));
    let node_boot = split(&*boot, Some(node as u32), lr as u32).expect("split").expect("node group");
    let cross_boot = split(&*boot, Some((layout.nodes + lr) as u32), node as u32).expect("split").expect("cross");
    let ctx = CudaContext::new(0).expect("context");
    // The node's IPC collective as the factory configures it: the table is its route policy.
    let node_routing = Routing::default_for_world(Platform::Nvidia, local);
    // Every virtual node's IPC world shares this one GPU: the engine gives each rank of a world
    // 1/L of the SMs, which two worlds at once oversubscribe (the first 2x8 run: a ready-flag
    // timeout, typed, at 256 KiB). Split the SMs over all the ranks instead.
    let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).expect("SMs");
    let config = CudaIpcConfig::new(1 << 22)
        .with_routes(node_routing.route_table().clone())
        .with_ll_capacity(node_routing.ll_capacity(detcoll_protocol::DEFAULT_LL_CAPACITY))
        .with_max_blocks((sms as usize / world).max(1));
    let local_comm: CudaIpcCollective = cuda_ipc::new(Box::new(node_boot), &ctx, &config).expect("node collective");
    let device = CudaDevice::new(&ctx).expect("CUDA device");
    let cross = StagedTransport::new(device, Arc::new(cross_boot)).expect("host-staged transport");
    let routing = node_routing.across_nodes();
    let scratch = Box::new(DevScratch { ctx: ctx.clone(), row: Mutex::new(None) });
    let nodes = Nodes::new(layout, rank, local_comm, routing.route_table().clone(), cross, scratch).expect("nodes");
    let comm = Routed::new(rank, world, 1 << 22, routing, None, None).expect("routed").with_nodes(nodes);
    assert_eq!(comm.route(Op::AllReduce, 4096), Route::Hierarchical);
    let stream = ctx.new_stream().expect("stream");
    let mut wrong = Vec::new();
    for bytes in [4096usize, 256 << 10, 4 << 20] {
        for dtype in [DType::BF16, DType::F32] {
            let n = bytes / dtype.size();
            let seed = (bytes + dtype as usize) as u64;
            let ins: Vec<Vec<u8>> = (0..world).map(|q| finite_values(dtype, n, seed * 100 + q as u64)).collect();
            let want = reference_reduce(&ins, dtype);
            let k = n / world;
            let shard = |v: &[u8]| v[rank * k * dtype.size()..(rank + 1) * k * dtype.size()].to_vec();
            let t = Instant::now();
            // all_reduce, out of place.
            let x = Dev::upload(&ctx, &ins[rank]);
            let out = Dev::new(&ctx, bytes);
            // SAFETY: the test's device buffers, alive until synchronised below.
            let io = unsafe {
                Io::OutOfPlace { input: RawRef::from_raw(x.ptr, n, dtype), output: RawMut::from_raw(out.ptr, n, dtype) }
            };
            comm.all_reduce(io, &stream).expect("all_reduce");
            comm.synchronize(&stream).expect("sync");
            let ar_us = t.elapsed().as_secs_f64() * 1e6;
            if out.download() != want {
                wrong.push(format!("all_reduce {dtype} {bytes}"));
            }
            // reduce_scatter, out of place.
            let rs = Dev::new(&ctx, k * dtype.size());
            // SAFETY: as above.
            let io = unsafe {
                Io::OutOfPlace { input: RawRef::from_raw(x.ptr, n, dtype), output: RawMut::from_raw(rs.ptr, k, dtype) }
            };
            comm.reduce_scatter(io, &stream).expect("reduce_scatter");
            comm.synchronize(&stream).expect("sync");
            if rs.download() != shard(&want) {
                wrong.push(format!("reduce_scatter {dtype} {bytes}"));
            }
            // all_gather, out of place, of this rank's shard of its input.
            let g = Dev::new(&ctx, bytes);
            let mine = Dev::upload(&ctx, &shard(&ins[rank]));
            // SAFETY: as above.
            let io = unsafe {
                Io::OutOfPlace {
                    input: RawRef::from_raw(mine.ptr, k, dtype),
                    output: RawMut::from_raw(g.ptr, n, dtype),
                }
            };
            comm.all_gather(io, &stream).expect("all_gather");
            comm.synchronize(&stream).expect("sync");
            let gathered: Vec<u8> = ins
                .iter()
                .enumerate()
                .flat_map(|(q, v)| v[q * k * dtype.size()..(q + 1) * k * dtype.size()].to_vec())
                .collect();
            if g.download() != gathered {
                wrong.push(format!("all_gather {dtype} {bytes}"));
            }
            // Time per all_reduce once warm: 15 calls, each synchronised, median (rank 0's).
            let mut times: Vec<f64> = (0..15)
                .map(|_| {
                    let t = Instant::now();
                    // SAFETY: as above.
                    let io = unsafe {
                        Io::OutOfPlace {
                            input: RawRef::from_raw(x.ptr, n, dtype),
                            output: RawMut::from_raw(out.ptr, n, dtype),
                        }
                    };
                    comm.all_reduce(io, &stream).expect("all_reduce");
                    comm.synchronize(&stream).expect("sync");
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            times.sort_by(f64::total_cmp);
            if out.download() != want {
                wrong.push(format!("repeated all_reduce {dtype} {bytes}"));
            }
            if rank == 0 {
                println!(
                    "TIMING {}x{} {dtype} {bytes} B all_reduce: first call {ar_us:.0} us, then median {:.0} us (min {:.0})",
                    layout.nodes, local, times[7], times[0]
                );
            }
        }
    }
    println!("VNGPU {rank} {} END", if wrong.is_empty() { "OK".to_owned() } else { wrong.join(",") });
    comm.close().expect("close");
}

#[test]
fn virtual_nodes_of_mps_processes_give_fixed_tree_bits() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => {}
        other => {
            println!("skipped: no CUDA device ({other:?})");
            return;
        }
    }
    let exe = std::env::current_exe().expect("test binary");
    // 2x8: 16 ranks on one host (and one GPU), above the 8 of one IPC world.
    for (nodes, local) in [(2, 2), (2, 4), (4, 2), (2, 8)] {
        let mut spec = LaunchSpec::new(nodes * local, &exe)
            .args(["virtual_nodes_of_mps_processes_give_fixed_tree_bits", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("CUDA_VISIBLE_DEVICES", std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "0".into()));
        spec.virtual_nodes = Some(nodes);
        let t = Instant::now();
        let (outcome, outputs) = launch_captured(&spec).expect("launch");
        assert!(outcome.success(), "{nodes}x{local}: {outcome:?}: {outputs:#?}");
        let mut bad = Vec::new();
        for (rank, out) in outputs.iter().enumerate() {
            for l in out.lines().filter(|l| l.contains("TIMING")) {
                println!("{l}");
            }
            let line = out.lines().find_map(|l| l.split_once("VNGPU ").map(|(_, r)| r.to_owned()));
            let line = line.unwrap_or_else(|| panic!("{nodes}x{local} rank {rank} printed no result: {out}"));
            if !line.starts_with(&format!("{rank} OK")) {
                bad.push(format!("rank {rank}: {line}"));
            }
        }
        assert!(bad.is_empty(), "{nodes}x{local}: {bad:?}");
        println!(
            "{nodes}x{local}: every rank bit-exact (all_reduce, reduce_scatter, all_gather; bf16, f32; 4 KiB..4 MiB) in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
}
