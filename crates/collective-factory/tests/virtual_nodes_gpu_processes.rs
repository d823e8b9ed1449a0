//! Virtual nodes on one GPU: MPS processes grouped into simulated hosts
//! (`LaunchSpec::virtual_nodes`: `DETCOLL_HOST_ID`, per-node `LOCAL_RANK`), the hierarchical
//! route composed as the factory composes it for the CPU — the CUDA IPC collective inside each
//! virtual node (`cuda_ipc::new` over the node's `split`), a host-staged transport across nodes
//! (NCCL refuses two ranks on one GPU, so the cross-node step copies to the host and runs the
//! host transport over the bootstrap) — and every op's bits checked against `fixed-tree` at
//! sizes from 4 KiB to 4 MiB per rank. Prints each layout's time per call. Skips, saying so,
//! without a GPU.
#![cfg(all(feature = "cuda", feature = "cpu"))]

use collective_core::bootstrap::{Bootstrap, TcpBootstrap, split};
use collective_core::conformance::data::{finite_values, reference_reduce};
use collective_core::{Capabilities, Collective, DType, Error, Io, Op, RawMut, RawRef, Route, validate, validate_many};
use collective_factory::nodes::{NodeLayout, Nodes, Scratch};
use collective_factory::{Platform, Routed, Routing};
use cuda_ipc::cudarc::driver::{CudaContext, CudaStream, sys};
use cuda_ipc::{CudaIpcCollective, CudaIpcConfig};
use detcoll_host_transport::HostTransport;
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
            // SAFETY: the previous row; the call that used it was synchronised (Staged syncs).
            unsafe { sys::cuMemFree_v2(ptr) };
        }
        let mut ptr = 0;
        // SAFETY: out-pointer to a local; the context is current.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(256)) }, "scratch alloc");
        *row = Some((ptr, bytes));
        Ok(ptr)
    }
}

/// The cross-node step on one GPU: synchronise the stream, copy the call's device memory to
/// the host, run the host transport over the bootstrap, copy the output back.
#[derive(Debug)]
struct Staged {
    ctx: Arc<CudaContext>,
    host: HostTransport,
}

/// Host memory, 8-byte aligned, `len` elements of `dtype`.
fn host_buf(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8).max(1)]
}

/// Stream-ordered copies, waited for: a "synchronous" copy from pageable memory may return
/// before its DMA lands, and a later kernel on a non-blocking stream would read stale data (the
/// first run of this test caught exactly that: one all_reduce of 4 MiB wrong at 2x4).
fn ok(r: sys::CUresult, stream: &CudaStream) -> Result<(), Error> {
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::InvalidConfig { detail: format!("{r:?}") });
    }
    stream.synchronize().map_err(|e| Error::InvalidConfig { detail: e.to_string() })
}

impl Staged {
    fn d2h(&self, dst: &mut [u64], src: u64, bytes: usize, stream: &CudaStream) -> Result<(), Error> {
        // SAFETY: `dst` holds at least `bytes`; `src` is a validated device view of the call;
        // waited for before `dst` is read.
        let r = unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, bytes, stream.cu_stream()) };
        ok(r, stream)
    }
    fn h2d(&self, dst: u64, src: &[u64], bytes: usize, stream: &CudaStream) -> Result<(), Error> {
        // SAFETY: as above, the other way; `src` outlives the wait.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), bytes, stream.cu_stream()) };
        ok(r, stream)
    }
    /// One single-lane op through the host.
    fn staged(&self, op: Op, io: Io<'_>, stream: &CudaStream) -> Result<(), Error> {
        let (rank, world) = (self.host.rank(), self.host.world_size());
        let call = validate(op, &io, rank, world, usize::MAX)?;
        stream.synchronize().map_err(|e| Error::InvalidConfig { detail: e.to_string() })?;
        self.ctx.bind_to_thread().map_err(|e| Error::InvalidConfig { detail: e.to_string() })?;
        let (dtype, size) = (call.dtype, call.dtype.size());
        if call.in_place {
            // The whole buffer: all_gather's is its output, reduce_scatter's its input.
            let (start, len) = match op {
                Op::AllGather => (call.dst, call.count_out),
                Op::ReduceScatter | Op::ReduceScatterMany => (call.src, call.count_in),
                Op::AllReduce => (call.dst, call.count_in),
            };
            let mut buf = host_buf(len * size);
            self.d2h(&mut buf, start, len * size, stream)?;
            // SAFETY: `buf`, borrowed for the call.
            let view = unsafe { RawMut::from_raw(buf.as_mut_ptr() as u64, len, dtype) };
            self.host.call_op(op, Io::InPlace(view))?;
            self.h2d(start, &buf, len * size, stream)
        } else {
            let mut input = host_buf(call.bytes_in());
            self.d2h(&mut input, call.src, call.bytes_in(), stream)?;
            let mut out = host_buf(call.bytes_out());
            // SAFETY: the two host buffers, borrowed for the call.
            let io = unsafe {
                Io::OutOfPlace {
                    input: RawRef::from_raw(input.as_ptr() as u64, call.count_in, dtype),
                    output: RawMut::from_raw(out.as_mut_ptr() as u64, call.count_out, dtype),
                }
            };
            self.host.call_op(op, io)?;
            self.h2d(call.dst, &out, call.bytes_out(), stream)
        }
    }
}

trait CallOp {
    fn call_op(&self, op: Op, io: Io<'_>) -> Result<(), Error>;
}

impl CallOp for HostTransport {
    fn call_op(&self, op: Op, io: Io<'_>) -> Result<(), Error> {
        match op {
            Op::AllReduce => self.all_reduce(io, &()),
            Op::AllGather => self.all_gather(io, &()),
            Op::ReduceScatter => self.reduce_scatter(io, &()),
            Op::ReduceScatterMany => self.reduce_scatter_many(&[io], &()),
        }
    }
}

impl Collective for Staged {
    type Stream = CudaStream;
    fn rank(&self) -> usize {
        self.host.rank()
    }
    fn world_size(&self) -> usize {
        self.host.world_size()
    }
    fn capabilities(&self) -> Capabilities {
        self.host.capabilities()
    }
    fn route(&self, op: Op, bytes: usize) -> Route {
        self.host.route(op, bytes)
    }
    fn all_reduce(&self, io: Io<'_>, s: &CudaStream) -> Result<(), Error> {
        self.staged(Op::AllReduce, io, s)
    }
    fn all_gather(&self, io: Io<'_>, s: &CudaStream) -> Result<(), Error> {
        self.staged(Op::AllGather, io, s)
    }
    fn reduce_scatter(&self, io: Io<'_>, s: &CudaStream) -> Result<(), Error> {
        self.staged(Op::ReduceScatter, io, s)
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], s: &CudaStream) -> Result<(), Error> {
        let (calls, _) = validate_many(lanes, self.rank(), self.world_size(), usize::MAX)?;
        for c in calls.iter().map(|l| l.call) {
            // SAFETY: the validated lane's own views.
            let io = unsafe {
                Io::OutOfPlace {
                    input: RawRef::from_raw(c.src, c.count_in, c.dtype),
                    output: RawMut::from_raw(c.dst, c.count_out, c.dtype),
                }
            };
            self.staged(Op::ReduceScatter, io, s)?;
        }
        Ok(())
    }
    fn check(&self) -> Result<(), Error> {
        self.host.check()
    }
    fn synchronize(&self, s: &CudaStream) -> Result<(), Error> {
        s.synchronize().map_err(|e| Error::InvalidConfig { detail: e.to_string() })
    }
    fn close(&self) -> Result<(), Error> {
        self.host.close()
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
    let cross = Staged { ctx: ctx.clone(), host: HostTransport::new(Arc::new(cross_boot)).expect("host transport") };
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
