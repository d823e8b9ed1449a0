//! The hierarchical route on one GPU through the factory, as a user builds it
//! (`nvidia::from_context`): MPS processes grouped into simulated hosts
//! (`LaunchSpec::virtual_nodes`: `DETCOLL_HOST_ID`, per-node `LOCAL_RANK`), and 16 or 12
//! processes on this one host, more than one IPC world holds. The agreement finds the layout,
//! the factory builds the CUDA IPC collective of each node, the host-staged transport across
//! nodes (NCCL refuses two ranks on one GPU) and the device scratch row; every op's bits are
//! checked against `fixed-tree` at sizes from 4 KiB to 4 MiB per rank, reduce_scatter on a
//! second stream (the scratch row reused across streams). Prints each layout's time per call.
//! Skips, saying so, without a GPU.
#![cfg(all(feature = "cuda", feature = "cpu"))]

use collective_core::bootstrap::{Bootstrap, TcpBootstrap};
use collective_core::conformance::data::{finite_values, reference_reduce};
use collective_core::{Collective, DType, Io, Op, RawMut, RawRef, Route};
use collective_factory::nodes::NodeLayout;
use collective_factory::{Config, nvidia};
use cuda_ipc::cudarc::driver::{CudaContext, sys};
use detcoll_launch::{LaunchSpec, launch_captured};
use std::sync::Arc;
use std::time::Instant;

const CHILD: &str = "DETCOLL_VNODES_GPU_CHILD";
/// The layout the child expects, `nodes x local` (the factory must find it).
const LAYOUT: &str = "DETCOLL_VNODES_GPU_LAYOUT";

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

fn child() {
    let boot: Arc<dyn Bootstrap> = Arc::new(TcpBootstrap::from_env().expect("bootstrap"));
    let (rank, world) = (boot.rank(), boot.world_size());
    let (nodes, local) = std::env::var(LAYOUT)
        .ok()
        .and_then(|v| v.split_once('x').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())))
        .expect("layout");
    let ctx = CudaContext::new(0).expect("context");
    // What a user writes: the factory agrees on the layout (host identities), builds the node's
    // CUDA IPC collective, the transport across nodes (host-staged: every rank is on this one
    // GPU) and the device scratch row.
    let comm = nvidia::from_context(boot, &ctx, &Config::new().with_capacity(1 << 22)).expect("nvidia");
    assert_eq!(comm.route(Op::AllReduce, 4096), Route::Hierarchical);
    let n = comm.nodes().expect("the hierarchical route's backends");
    assert_eq!(n.layout(), NodeLayout { nodes, local });
    assert!(n.cross().is_host_staged(), "one GPU: the step across nodes is staged through the host");
    let layout = n.layout();
    let stream = ctx.new_stream().expect("stream");
    // reduce_scatter on a second stream: the scratch row is reused across streams.
    let other = ctx.new_stream().expect("stream");
    let mut wrong = Vec::new();
    for bytes in [4096usize, 256 << 10, 4 << 20] {
        for dtype in [DType::BF16, DType::F32] {
            // A whole number of elements per rank (12 ranks do not divide 4 KiB of bf16).
            let n = bytes / dtype.size() / world * world;
            let seed = (bytes + dtype as usize) as u64;
            let ins: Vec<Vec<u8>> = (0..world).map(|q| finite_values(dtype, n, seed * 100 + q as u64)).collect();
            let want = reference_reduce(&ins, dtype);
            let k = n / world;
            let shard = |v: &[u8]| v[rank * k * dtype.size()..(rank + 1) * k * dtype.size()].to_vec();
            let t = Instant::now();
            // all_reduce, out of place.
            let x = Dev::upload(&ctx, &ins[rank]);
            let out = Dev::new(&ctx, n * dtype.size());
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
            comm.reduce_scatter(io, &other).expect("reduce_scatter");
            comm.synchronize(&other).expect("sync");
            if rs.download() != shard(&want) {
                wrong.push(format!("reduce_scatter {dtype} {bytes}"));
            }
            // all_gather, out of place, of this rank's shard of its input.
            let g = Dev::new(&ctx, n * dtype.size());
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
    // (nodes, ranks per node, simulated hosts): virtual nodes of 2x2, 2x4, 4x2, 2x8; then 16
    // and 12 processes on this one host (no override), which the factory splits into nodes of
    // 8 and 4 because one IPC world holds at most 8 ranks.
    for (nodes, local, virtual_nodes) in
        [(2, 2, true), (2, 4, true), (4, 2, true), (2, 8, true), (2, 8, false), (3, 4, false)]
    {
        let mut spec = LaunchSpec::new(nodes * local, &exe)
            .args(["virtual_nodes_of_mps_processes_give_fixed_tree_bits", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env(LAYOUT, format!("{nodes}x{local}"))
            .env("CUDA_VISIBLE_DEVICES", std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "0".into()));
        spec.virtual_nodes = virtual_nodes.then_some(nodes);
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
