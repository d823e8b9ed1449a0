//! GPU behaviour beyond the conformance suite on the CUDA IPC twin: the shared GPU suite
//! (`gpu_conformance::gpu_suite!`: long randomized back-to-back sequences, generations
//! wrapping, fail-closed protocol errors — mismatched calls and lane splits, a rank that never
//! arrives, a call after the peer closed — and the fused tree kernel, hardware and software
//! arithmetic, against `fixed-tree`), and what only CUDA claims: graph capture and replay.
//! Without a GPU each test prints "skipped: no CUDA device".
mod common;

use collective_core::conformance::data::{compare, finite_values, reference_reduce};
use collective_core::conformance::sequence::{out_len, seed, shard_of};
use collective_core::{Collective, DType, Error, Io, Op};
use common::{Cuda, CudaRank};
use cuda_ipc::cudarc::driver::sys;
use cuda_ipc::{CudaIpcConfig, IpcCollective};
use gpu_conformance::cases::{in_view, out_view};
use gpu_conformance::{DevBuf, TestGpu, gpu, gpu_lock, run_ranks};

gpu_conformance::gpu_suite!(Cuda);

// ---------------------------------------------------------------------------------------------
// CUDA graph capture.
// ---------------------------------------------------------------------------------------------

/// One step of the captured sequence: op, dtype, lane sizes (elements per rank).
struct Step {
    op: Op,
    dtype: DType,
    lanes: Vec<usize>,
}

fn graph_steps(world: usize) -> Vec<Step> {
    vec![
        Step { op: Op::AllReduce, dtype: DType::BF16, lanes: vec![4096] }, // one-shot (8 KiB)
        Step { op: Op::AllReduce, dtype: DType::F32, lanes: vec![65536 + 3] }, // RS+AG (> 64 KiB)
        Step { op: Op::AllGather, dtype: DType::F16, lanes: vec![1001] },  // LL push (<= 6 KiB)
        Step { op: Op::ReduceScatter, dtype: DType::F32, lanes: vec![1024 * world] }, // one-shot
        Step { op: Op::ReduceScatterMany, dtype: DType::BF16, lanes: vec![16 * world, 300 * world, world] }, // push
        Step { op: Op::AllReduce, dtype: DType::F16, lanes: vec![7] },     // LL push
        Step { op: Op::AllReduce, dtype: DType::BF16, lanes: vec![300_001] }, // bulk push (>= 512 KiB)
        Step { op: Op::AllGather, dtype: DType::F32, lanes: vec![150_000] }, // bulk push (600 KB)
    ]
}

/// Expected output of `rank` for lane `l` of step `i`.
fn graph_expected(steps: &[Step], world: usize, rank: usize, i: usize, l: usize) -> Vec<u8> {
    let s = &steps[i];
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| finite_values(s.dtype, s.lanes[l], seed(i * 16 + l, r))).collect();
    match s.op {
        Op::AllReduce => reference_reduce(&inputs, s.dtype),
        Op::AllGather => inputs.concat(),
        _ => shard_of(&reference_reduce(&inputs, s.dtype), world, rank),
    }
}

struct StepBufs {
    inputs: Vec<DevBuf>,
    outputs: Vec<DevBuf>,
}

fn enqueue_steps(rank: &CudaRank, steps: &[Step], bufs: &[StepBufs]) -> Result<(), Error> {
    let (c, s) = (&rank.comm, &*rank.stream);
    let world = c.world_size();
    for (step, b) in steps.iter().zip(bufs) {
        let ios: Vec<Io<'_>> = step
            .lanes
            .iter()
            .enumerate()
            .map(|(l, &n)| Io::OutOfPlace {
                input: in_view(&b.inputs[l], 0, n, step.dtype),
                output: out_view(&b.outputs[l], 0, out_len(step.op, n, world), step.dtype),
            })
            .collect();
        match step.op {
            Op::ReduceScatterMany => c.reduce_scatter_many(&ios, s)?,
            op => {
                let io = ios.into_iter().next().ok_or(Error::Closed)?;
                match op {
                    Op::AllReduce => c.all_reduce(io, s)?,
                    Op::AllGather => c.all_gather(io, s)?,
                    _ => c.reduce_scatter(io, s)?,
                }
            }
        }
    }
    Ok(())
}

fn check_steps(rank: &CudaRank, steps: &[Step], bufs: &[StepBufs], what: &str) -> Result<(), String> {
    let c = &rank.comm;
    for (i, (step, b)) in steps.iter().zip(bufs).enumerate() {
        for l in 0..step.lanes.len() {
            let want = graph_expected(steps, c.world_size(), c.rank(), i, l);
            let got = rank.download(b.outputs[l].ptr, b.outputs[l].len);
            compare(&got[..want.len()], &want, step.dtype)
                .map_err(|e| format!("{what}: step {i} lane {l} ({:?}): {e}", step.op))?;
        }
    }
    Ok(())
}

/// CUDA claims graph capture (`IpcDevice::GRAPH_CAPTURE`): eight ranks capture a mixed
/// sequence (the LL and bulk push routes and both all_reduce pull routes, all_gather,
/// reduce_scatter, reduce_scatter_many) and
/// replay it 100 times, outputs cleared before each replay and bit-exact after it, with eager
/// calls before and after (the generations continue on the device through the replays).
#[test]
fn graph_capture_of_mixed_ops_replays_bitwise() {
    let Some(device) = gpu::<Cuda>() else { return };
    let _l = gpu_lock();
    let world = 8;
    let routes =
        collective_core::SizeRoutes { ll_up_to: Some(6 << 10), bulk_from: Some(512 << 10), rsag_from: Some(64 << 10) };
    let config = CudaIpcConfig::new(8 << 20).with_routes(collective_core::RouteTable::by_size(routes));
    let comms = IpcCollective::group_on(&device, world, &config).expect("group");
    let steps = graph_steps(world);
    let r = run_ranks::<Cuda, _>(comms, Cuda::REGION_BYTES, |rank: &mut CudaRank| {
        let me = rank.comm.rank();
        let s = rank.stream.clone();
        let mut bufs = Vec::new();
        for (i, st) in steps.iter().enumerate() {
            let inputs = st
                .lanes
                .iter()
                .enumerate()
                .map(|(l, &n)| rank.put(&finite_values(st.dtype, n, seed(i * 16 + l, me))))
                .collect();
            let outputs =
                st.lanes.iter().map(|&n| rank.alloc_dev(out_len(st.op, n, world) * st.dtype.size())).collect();
            bufs.push(StepBufs { inputs, outputs });
        }
        rank.barrier()?;
        // Eager first, so the device generation counter is not at its initial value.
        enqueue_steps(rank, &steps, &bufs).map_err(|e| e.to_string())?;
        check_steps(rank, &steps, &bufs, "eager")?;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(|e| e.to_string())?;
        let enq = enqueue_steps(rank, &steps, &bufs);
        let graph = s.end_capture(sys::CUgraphInstantiate_flags_enum(0)).map_err(|e| e.to_string())?;
        enq.map_err(|e| e.to_string())?;
        let graph = graph.ok_or("empty graph")?;
        graph.upload().map_err(|e| e.to_string())?;
        // Instantiation and upload may synchronise the device: nobody replays before every
        // rank has finished them.
        s.synchronize().map_err(|e| e.to_string())?;
        rank.barrier()?;
        for replay in 0..100 {
            // Memsets only on a drained stream (see `GpuRank::upload`).
            s.synchronize().map_err(|e| e.to_string())?;
            for b in &bufs {
                for o in &b.outputs {
                    // Outputs are cleared so a replay that did nothing cannot pass.
                    // SAFETY: clearing a whole live test buffer on its stream.
                    let r = unsafe { sys::cuMemsetD8Async(o.ptr, 0, o.len, s.cu_stream()) };
                    r.result().map_err(|e| e.to_string())?;
                }
            }
            graph.launch().map_err(|e| e.to_string())?;
            check_steps(rank, &steps, &bufs, &format!("replay {replay}"))?;
        }
        // Eager again: the generation continued on the device through the replays.
        enqueue_steps(rank, &steps, &bufs).map_err(|e| e.to_string())?;
        check_steps(rank, &steps, &bufs, "eager after replays")?;
        s.synchronize().map_err(|e| e.to_string())?;
        rank.comm.check().map_err(|e| e.to_string())
    });
    r.expect("graph capture");
}

// ---------------------------------------------------------------------------------------------
// Programmatic dependent launch.
// ---------------------------------------------------------------------------------------------

/// A producer that lets its dependents start at once (`griddepcontrol.launch_dependents`), then
/// waits `delay_ns` and only then writes the next call's input: a collective launched
/// programmatically that read its input before `griddepcontrol.wait` would reduce stale data.
const LATE_WRITER: &str = r#"
extern "C" __global__ void late_writer(unsigned int* dst, const unsigned int* src, unsigned int words,
                                       unsigned long long delay_ns) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < delay_ns);
    for (unsigned int i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}
"#;

/// One-block collectives are launched programmatically on sm_90+ (crate::programmatic): each
/// rank's input is written by a kernel just before the call that triggers its dependents before
/// writing (and 50 us late); every output must still be the tree over the written inputs, eager
/// and in a replayed graph, 20 times over with fresh values.
#[test]
fn a_programmatic_launch_waits_for_the_kernel_writing_its_input() {
    use cuda_ipc::cudarc::driver::{LaunchConfig, PushKernelArg};
    use cuda_ipc::cudarc::nvrtc::{CompileOptions, Ptx};
    let Some(device) = gpu::<Cuda>() else { return };
    let _l = gpu_lock();
    let ctx = device.context().clone();
    let (major, minor) = ctx.compute_capability().expect("compute capability");
    if major < 9 {
        println!("skipped: programmatic dependent launch needs sm_90 or newer (this GPU is sm_{major}{minor})");
        return;
    }
    cuda_ipc::kernels::ensure_nvrtc().expect("NVRTC (to build the producer kernel)");
    let opts = CompileOptions { arch: Some("sm_90"), ..Default::default() };
    let ptx = cuda_ipc::cudarc::nvrtc::compile_ptx_with_opts(LATE_WRITER, opts).expect("NVRTC compile");
    // Loaded before any collective is in flight (loading a module may synchronise the device).
    let module = ctx.load_module(Ptx::from_src(ptx.to_src())).expect("load producer");
    let writer = module.load_function("late_writer").expect("late_writer");
    let (world, n, rounds) = (2usize, 2048usize, 20usize);
    let comms = IpcCollective::group_on(&device, world, &CudaIpcConfig::new(1 << 20)).expect("group");
    let r = run_ranks::<Cuda, _>(comms, Cuda::REGION_BYTES, |rank: &mut CudaRank| {
        let me = rank.comm.rank();
        let s = rank.stream.clone();
        let dt = DType::BF16;
        let input = rank.put(&vec![0u8; n * dt.size()]);
        let output = rank.alloc_dev(n * dt.size());
        let sources: Vec<DevBuf> = (0..rounds).map(|k| rank.put(&finite_values(dt, n, seed(700 + k, me)))).collect();
        let words = (n * dt.size() / 4) as u32;
        let delay_ns = 50_000u64;
        let enqueue = |rank: &CudaRank, k: usize| -> Result<(), String> {
            let mut b = s.launch_builder(&writer);
            b.arg(&input.ptr).arg(&sources[k].ptr).arg(&words).arg(&delay_ns);
            let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the kernel's four parameters, in order; both buffers hold `words` words.
            unsafe { b.launch(cfg) }.map_err(|e| e.to_string())?;
            let io = Io::OutOfPlace { input: in_view(&input, 0, n, dt), output: out_view(&output, 0, n, dt) };
            rank.comm.all_reduce(io, &s).map_err(|e| e.to_string())
        };
        let want = |k: usize| {
            let inputs: Vec<Vec<u8>> = (0..world).map(|r| finite_values(dt, n, seed(700 + k, r))).collect();
            reference_reduce(&inputs, dt)
        };
        rank.barrier()?;
        for k in 0..rounds / 2 {
            enqueue(rank, k)?;
            compare(&rank.download(output.ptr, n * dt.size()), &want(k), dt).map_err(|e| format!("eager {k}: {e}"))?;
        }
        // The same in a graph: the producer -> collective edge is captured as programmatic.
        let k = rounds / 2;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(|e| e.to_string())?;
        let enq = enqueue(rank, k);
        let graph = s.end_capture(sys::CUgraphInstantiate_flags_enum(0)).map_err(|e| e.to_string())?;
        enq?;
        let graph = graph.ok_or("empty graph")?;
        graph.upload().map_err(|e| e.to_string())?;
        s.synchronize().map_err(|e| e.to_string())?;
        rank.barrier()?;
        for replay in 0..5 {
            s.synchronize().map_err(|e| e.to_string())?;
            // SAFETY: clearing live test buffers on their drained stream.
            let r = unsafe { sys::cuMemsetD8Async(input.ptr, 0, input.len, s.cu_stream()) };
            r.result().map_err(|e| e.to_string())?;
            // SAFETY: as above.
            let r = unsafe { sys::cuMemsetD8Async(output.ptr, 0, output.len, s.cu_stream()) };
            r.result().map_err(|e| e.to_string())?;
            graph.launch().map_err(|e| e.to_string())?;
            compare(&rank.download(output.ptr, n * dt.size()), &want(k), dt)
                .map_err(|e| format!("replay {replay}: {e}"))?;
        }
        for k in rounds / 2 + 1..rounds {
            enqueue(rank, k)?;
            compare(&rank.download(output.ptr, n * dt.size()), &want(k), dt).map_err(|e| format!("eager {k}: {e}"))?;
        }
        rank.comm.check().map_err(|e| e.to_string())
    });
    r.expect("programmatic launch");
}

/// A prebuilt image built for some worlds only (`-DDC_WORLDS`; here worlds 1 and 2, as
/// `kernels::compile_worlds` builds them) in `DETCOLL_KERNEL_DIR` serves those worlds and never
/// another, whose launches would trap in it and poison the context: on one device a world-2
/// group loads it, a world-4 group falls back to NVRTC (its ABI table names the image's worlds),
/// and both all_reduces give the tree's bits.
#[test]
fn a_prebuilt_image_of_some_worlds_serves_only_those() {
    use cuda_ipc::kernels::{ImageKind, Variant, Worlds, compile_worlds};
    use detcoll_protocol::Device;
    let Some(device) = gpu::<Cuda>() else { return };
    let _l = gpu_lock();
    let (major, minor) = device.context().compute_capability().expect("compute capability");
    let arch = format!("sm_{major}{minor}");
    let two = Worlds::for_world(2).expect("world 2");
    let image = compile_worlds(&arch, ImageKind::Cubin, Variant::Main, two).expect("NVRTC: worlds 1 and 2");
    let dir = std::env::temp_dir().join(format!("detcoll-worlds-1-2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join(format!("detcoll_cuda.{arch}.cubin")), &image).expect("write the image");
    let before = std::env::var_os("DETCOLL_KERNEL_DIR");
    // SAFETY: gpu-test runs this binary's tests one at a time; a test of it running alongside
    // would at worst load this image for worlds 1 and 2, which it has (what this test checks).
    unsafe { std::env::set_var("DETCOLL_KERNEL_DIR", &dir) };
    let runs: Vec<Result<(), String>> = [2usize, 4]
        .into_iter()
        .map(|world| {
            let comms =
                IpcCollective::group_on(&device, world, &CudaIpcConfig::new(1 << 20)).map_err(|e| e.to_string())?;
            run_ranks::<Cuda, _>(comms, 64 << 20, |rank: &mut CudaRank| {
                let (me, dt, n) = (rank.comm.rank(), DType::BF16, 4096usize);
                let input = rank.put(&finite_values(dt, n, seed(900 + world, me)));
                let output = rank.alloc_dev(n * dt.size());
                let io = Io::OutOfPlace { input: in_view(&input, 0, n, dt), output: out_view(&output, 0, n, dt) };
                rank.comm.all_reduce(io, &rank.stream.clone()).map_err(|e| e.to_string())?;
                let inputs: Vec<Vec<u8>> = (0..world).map(|r| finite_values(dt, n, seed(900 + world, r))).collect();
                compare(&rank.download(output.ptr, n * dt.size()), &reference_reduce(&inputs, dt), dt)
                    .map_err(|e| format!("world {world} rank {me}: {e}"))
            })
        })
        .collect();
    // SAFETY: as above.
    unsafe {
        match before {
            Some(v) => std::env::set_var("DETCOLL_KERNEL_DIR", v),
            None => std::env::remove_var("DETCOLL_KERNEL_DIR"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    for r in runs {
        r.expect("all_reduce");
    }
    let kernels = device.describe();
    let image = dir.join(format!("detcoll_cuda.{arch}.cubin")).display().to_string();
    assert!(kernels.contains(&format!("kernels: {image}")), "world 2 uses the prebuilt image: {kernels}");
    let fallback = format!("NVRTC {arch}, worlds 0x12 (prebuilt {image} refused: ");
    assert!(kernels.contains(&fallback), "world 4 falls back to NVRTC: {kernels}");
    assert!(kernels.contains("kernel image built for worlds 0x6, without some of 0x12"), "why: {kernels}");
    println!("{kernels}");
}
