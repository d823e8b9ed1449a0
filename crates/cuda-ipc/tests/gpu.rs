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
    let config = CudaIpcConfig::new(8 << 20)
        .with_rsag_threshold(64 << 10)
        .with_push_threshold(6 << 10)
        .with_bulk_threshold(512 << 10);
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
