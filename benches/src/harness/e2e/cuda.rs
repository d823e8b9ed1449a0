//! The CUDA backend of `--e2e`: `detcoll_layers::cuda` (cuBLAS GEMMs, NVRTC kernels, the NVIDIA
//! collective) with the ranks of each TP/CP size as threads of this process,
//! `collective_factory::nvidia::thread_group` (rank r on GPU r % count: on a one-GPU host every
//! rank shares its SMs, which the report says).
//!
//! Per size, on every rank (its own host thread and stream): the shard or attention, its
//! workspace, cuBLAS handle, kernels, inputs, timing events and the cuBLAS warm-up are all
//! created before a barrier, so nothing is allocated while a peer may have a collective in
//! flight; then `warmup` untimed and `iterations` timed eager forwards with the hook
//! `(StageEvents, Lockstep)` (the lockstep keeps ranks sharing a context in call order), an event
//! pair on the rank's stream around each forward. With `--graph` each rank then captures one
//! forward (thread-local capture mode), instantiates and uploads it, waits for every rank at a
//! barrier, and times `iterations` replays with the same event pairs (whole layer only). Each
//! rank's code uses its own context and stream only, so it is what one process per GPU runs.
use super::cpu::{GroupRuns, Inputs, RankRun, bits, sweep, transpose};
use super::report::{INVARIANT, NAIVE};
use super::shapes::Plan;
use crate::harness::args::{BenchDtype, E2eLayer};
use anyhow::Context;
use collective_core::Collective;
use collective_factory::{Config, NvidiaCollective, nvidia};
use cuda_ipc::cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream, sys};
use detcoll_layers::cuda::{
    CudaAttention, CudaFfnShard, CudaGemm, CudaKernels, CudaScalar, Lockstep, Rendezvous, StageEvents, StageHook,
    thread_group_config,
};
use detcoll_layers::{Error, FfnShape};
use half::bf16;
use std::sync::Arc;
use std::time::Duration;

/// `backend` of CUDA reports.
pub const NAME: &str = "cuda-threads";
/// Staging bytes of each rank's collective; calls above it are chunked (a performance knob).
pub const CAPACITY: usize = 64 << 20;
/// `stage_method` of eager rows.
pub const EAGER_STAGES: &str = "CUDA events around every stage on the rank's stream (StageEvents), total over the \
timed calls / calls, slowest rank";
/// `stage_method` of graph rows.
pub const GRAPH_STAGES: &str = "none: a graph replay is timed as a whole (no per-stage events inside the graph)";

/// What ran the ranks: the GPU's name and how many ranks share it.
pub fn device() -> String {
    let count = crate::harness::cuda::device_count();
    let name = cuda_ipc::driver::open_device(0).ok().and_then(|c| c.name().ok()).unwrap_or_else(|| "CUDA GPU".into());
    format!("{count} x {name}")
}

/// Runs the whole plan on the GPU(s); returns the rows (naive not yet paired).
pub fn run(plan: &Plan) -> anyhow::Result<Vec<super::E2eRow>> {
    detcoll_layers::cuda::blas::ensure_cublas().context("--e2e on CUDA needs cuBLAS")?;
    match plan.dtype {
        BenchDtype::Bf16 => run_typed::<bf16>(plan),
        BenchDtype::F32 => run_typed::<f32>(plan),
        BenchDtype::F16 => anyhow::bail!("--e2e on CUDA runs bf16 or f32 (the layers' GPU kernels), not f16"),
    }
}

fn run_typed<T: CudaScalar>(plan: &Plan) -> anyhow::Result<Vec<super::E2eRow>> {
    sweep(plan, |tokens, tp, inputs: &Inputs<T>| {
        // Collective kernels capped at half the GPU when ranks share it: a rank waiting in a
        // collective must leave a peer still in its GEMMs the SMs to finish them.
        let config = thread_group_config(Config::new().with_capacity(CAPACITY), tp)?;
        let ranks =
            nvidia::thread_group(tp, &config).with_context(|| format!("building the NVIDIA thread group of {tp}"))?;
        for r in &ranks {
            // SAFETY: every buffer of a rank is used on that rank's one stream only, and graph
            // capture must not record cudarc's tracking events.
            unsafe { r.context().disable_event_tracking() };
        }
        // A rank that fails poisons it: its peers fail at their next wait instead of hanging.
        let barrier = Rendezvous::new(tp, Duration::from_secs(120));
        let per_rank: Vec<anyhow::Result<Vec<(Key, RankRun)>>> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .iter()
                .map(|comm| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let r = match plan.layer {
                            E2eLayer::Ffn => ffn_rank(plan, plan.ffn_shape(tokens), comm, barrier, inputs),
                            E2eLayer::Attention => attention_rank(plan, tokens, comm, barrier, inputs),
                        };
                        if r.is_err() {
                            barrier.poison("a rank failed");
                        }
                        let checked = comm.ipc().map_or(Ok(()), |i| i.check()).context("the collective's state");
                        let closed = comm.close().context("closing the NVIDIA collective");
                        let r = r?;
                        checked?;
                        closed.map(|()| r)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank thread panicked"))))
                .collect()
        });
        let per_rank: anyhow::Result<Vec<Vec<(Key, RankRun)>>> =
            per_rank.into_iter().enumerate().map(|(r, x)| x.with_context(|| format!("rank {r} of {tp}"))).collect();
        let runs: Vec<(Key, Vec<RankRun>)> = transpose(per_rank?)?;
        Ok(runs
            .into_iter()
            .map(|(key, ranks)| (key, ranks, if key.1 == "graph" { GRAPH_STAGES } else { EAGER_STAGES }))
            .collect::<GroupRuns>())
    })
}

/// (variant, mode).
type Key = (&'static str, &'static str);

/// One rank's clocks: an event pair per timed call and the per-stage events.
struct Clocks {
    starts: Vec<CudaEvent>,
    ends: Vec<CudaEvent>,
    stages: StageEvents,
}

impl Clocks {
    fn new(comm: &NvidiaCollective, calls: usize, stages_per_call: usize) -> anyhow::Result<Self> {
        let ctx = comm.context();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = || ctx.new_event(flags).context("cuEventCreate");
        Ok(Clocks {
            starts: (0..calls).map(|_| event()).collect::<anyhow::Result<_>>()?,
            ends: (0..calls).map(|_| event()).collect::<anyhow::Result<_>>()?,
            stages: StageEvents::new(ctx, calls * stages_per_call)?,
        })
    }

    /// The whole-layer ms of every timed call (synchronises).
    fn whole_ms(&self, calls: usize) -> anyhow::Result<Vec<f64>> {
        (0..calls)
            .map(|i| {
                self.ends[i].synchronize()?;
                Ok(f64::from(self.starts[i].elapsed_ms(&self.ends[i])?))
            })
            .collect()
    }
}

/// Times `forward` eagerly (warm-up, then `iterations` calls with the lockstep and the stage
/// events) and, with `--graph`, as replays of one captured call. `output` reads the rank's
/// output bits (out, lse) after a call (synchronises).
fn time_variant(
    plan: &Plan,
    variant: &'static str,
    stream: &Arc<CudaStream>,
    barrier: &Rendezvous,
    clocks: &mut Clocks,
    forward: &mut dyn FnMut(&mut dyn StageHook) -> Result<(), Error>,
    output: &mut dyn FnMut() -> anyhow::Result<(Vec<u32>, Vec<u32>)>,
) -> anyhow::Result<Vec<(Key, RankRun)>> {
    let sync = || stream.synchronize().context("cuStreamSynchronize");
    let mut lock = Lockstep { barrier };
    // At least one untimed call: its output is the one the timed calls must repeat.
    for _ in 0..plan.warmup.max(1) {
        forward(&mut lock)?;
    }
    let (warm_bits, warm_lse) = output()?;
    clocks.stages.reset();
    for i in 0..plan.iterations {
        clocks.starts[i].record(stream)?;
        // Events first: a stage's end event is enqueued right after its last enqueue, before
        // the lockstep's host barrier (which would otherwise land in the stage's time).
        forward(&mut (&mut clocks.stages, &mut lock))?;
        clocks.ends[i].record(stream)?;
    }
    sync()?;
    let mut eager = RankRun::new();
    eager.whole = clocks.whole_ms(plan.iterations)?;
    for (stage, ms) in clocks.stages.totals_ms()? {
        eager.add_stage(stage.name(), ms);
    }
    (eager.bits, eager.lse_bits) = output()?;
    eager.repeat_bitwise = (eager.bits == warm_bits) && (eager.lse_bits == warm_lse);
    let (eager_bits, eager_lse) = (eager.bits.clone(), eager.lse_bits.clone());
    let mut runs = vec![((variant, "eager"), eager)];
    if plan.graph {
        let graph = capture(stream, barrier, &mut || forward(&mut lock))?;
        // One untimed replay, then the timed ones; every rank has instantiated (barrier in
        // `capture`), and each replay starts with all ranks' previous launches enqueued.
        barrier.wait()?;
        graph.launch().context("cuGraphLaunch")?;
        for i in 0..plan.iterations {
            barrier.wait()?;
            clocks.starts[i].record(stream)?;
            graph.launch().context("cuGraphLaunch")?;
            clocks.ends[i].record(stream)?;
        }
        sync()?;
        let mut replayed = RankRun::new();
        replayed.whole = clocks.whole_ms(plan.iterations)?;
        (replayed.bits, replayed.lse_bits) = output()?;
        replayed.repeat_bitwise = replayed.bits == eager_bits && replayed.lse_bits == eager_lse;
        runs.push(((variant, "graph"), replayed));
        // The graph is dropped only once no rank replays it any more.
        barrier.wait()?;
        drop(graph);
    }
    Ok(runs)
}

/// One forward captured on `stream` into an instantiated, uploaded graph; returns after every
/// rank has done the same (nothing replays while a peer still instantiates).
fn capture(
    stream: &Arc<CudaStream>,
    barrier: &Rendezvous,
    enqueue: &mut dyn FnMut() -> Result<(), Error>,
) -> anyhow::Result<CudaGraph> {
    stream.synchronize().context("cuStreamSynchronize")?;
    barrier.wait()?;
    // Thread-local: ranks capturing at once on other threads do not break this capture.
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .context("cuStreamBeginCapture")?;
    let enqueued = enqueue();
    // Always ended (also after a failed enqueue), so the stream stays usable.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags_enum(0));
    enqueued.context("a forward during stream capture")?;
    let graph = graph.context("cuStreamEndCapture / cuGraphInstantiate")?.context("the capture recorded no work")?;
    graph.upload().context("cuGraphUpload")?;
    stream.synchronize().context("cuStreamSynchronize")?;
    barrier.wait()?;
    Ok(graph)
}

fn upload<T: cuda_ipc::cudarc::driver::DeviceRepr>(stream: &Arc<CudaStream>, v: &[T]) -> anyhow::Result<CudaSlice<T>> {
    stream.clone_htod(v).context("uploading inputs")
}

fn download_bits<T: CudaScalar>(stream: &Arc<CudaStream>, v: &CudaSlice<T>) -> anyhow::Result<Vec<u32>> {
    Ok(bits(&stream.clone_dtoh(v).context("downloading the output")?))
}

/// One FFN rank: the invariant then the naive layer.
fn ffn_rank<T: CudaScalar>(
    plan: &Plan,
    shape: FfnShape,
    comm: &NvidiaCollective,
    barrier: &Rendezvous,
    inputs: &Inputs<T>,
) -> anyhow::Result<Vec<(Key, RankRun)>> {
    let (tp, r) = (comm.world_size(), comm.rank());
    let stream = comm.context().new_stream().context("a rank stream")?;
    let s = &stream;
    let shard = if plan.gated {
        CudaFfnShard::from_full_gated(s, shape, &inputs.w1, &inputs.w3, &inputs.w2, tp, r)?
    } else {
        CudaFfnShard::from_full(s, shape, &inputs.w1, &inputs.w2, tp, r)?
    };
    let mut ws = shard.workspace(s)?;
    let gemm = CudaGemm::new(s)?;
    let kernels = CudaKernels::new(comm.context())?;
    let n = shard.local_len();
    let x = upload(s, &inputs.x[r * n..(r + 1) * n])?;
    let mut out = upload(s, &vec![T::from_f32(0.0); n])?;
    let mut clocks = Clocks::new(comm, plan.iterations, 6)?;
    shard.warm_up(&gemm, &kernels, &mut ws, s)?;
    barrier.wait()?;
    let mut runs = Vec::new();
    for (variant, naive) in [(INVARIANT, false), (NAIVE, true)] {
        let out_cell = std::cell::RefCell::new(&mut out);
        let mut forward = |hook: &mut dyn StageHook| {
            let mut out = out_cell.borrow_mut();
            if naive {
                shard.forward_naive(comm, &gemm, &kernels, &mut ws, &x, &mut out, s, hook)
            } else {
                shard.forward(comm, &gemm, &kernels, &mut ws, &x, &mut out, s, hook)
            }
        };
        let mut output = || Ok((download_bits(s, &out_cell.borrow())?, Vec::new()));
        runs.extend(time_variant(plan, variant, s, barrier, &mut clocks, &mut forward, &mut output)?);
    }
    // The cuBLAS handle's drop synchronises the device: only once every rank is past its
    // collectives.
    barrier.wait()?;
    Ok(runs)
}

/// One attention rank.
fn attention_rank<T: CudaScalar>(
    plan: &Plan,
    tokens: usize,
    comm: &NvidiaCollective,
    barrier: &Rendezvous,
    inputs: &Inputs<T>,
) -> anyhow::Result<Vec<(Key, RankRun)>> {
    let (cp, r) = (comm.world_size(), comm.rank());
    let shape = plan.attention_shape(tokens);
    let stream = comm.context().new_stream().context("a rank stream")?;
    let s = &stream;
    let n = tokens / cp;
    let e = n * shape.token_len();
    let mut att = CudaAttention::<T>::new(s, shape, cp, r)?;
    let kernels = CudaKernels::new(comm.context())?;
    let block = |v: &[T]| upload(s, &v[r * e..(r + 1) * e]);
    let (q, k, v) = (block(&inputs.q)?, block(&inputs.k)?, block(&inputs.v)?);
    let positions: Vec<i32> = (r * n..(r + 1) * n).map(|p| i32::try_from(p).unwrap_or(i32::MAX)).collect();
    let positions = upload(s, &positions)?;
    let mut out = upload(s, &vec![T::from_f32(0.0); e])?;
    let mut lse = upload(s, &vec![0f32; n * shape.heads])?;
    let mut clocks = Clocks::new(comm, plan.iterations, 4)?;
    s.synchronize().context("cuStreamSynchronize")?;
    barrier.wait()?;
    let cell = std::cell::RefCell::new((&mut out, &mut lse));
    let mut forward = |hook: &mut dyn StageHook| {
        let mut o = cell.borrow_mut();
        let (out, lse) = &mut *o;
        att.forward(comm, &kernels, &q, &k, &v, &positions, out, lse, s, hook)
    };
    let mut output = || {
        let o = cell.borrow();
        let lse_bits = s.clone_dtoh(&*o.1).context("downloading lse")?.iter().map(|x| x.to_bits()).collect();
        Ok((download_bits(s, &*o.0)?, lse_bits))
    };
    let runs = time_variant(plan, INVARIANT, s, barrier, &mut clocks, &mut forward, &mut output)?;
    // Nothing is freed while a peer still has a collective in flight.
    barrier.wait()?;
    Ok(runs)
}
