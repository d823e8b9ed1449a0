//! The TP-invariant FFN on the GPU at TP = 1, 2, 4 and 8, ranks as threads through
//! `collective_factory::nvidia::thread_group` (on a one-GPU host every rank shares GPU 0),
//! cudarc buffers, one stream per rank; prints whether the bits agree, and the stage times of
//! rank 0. Prints a skip line and exits 0 without a GPU.
//!
//! `CUDA_DEVICE_MAX_CONNECTIONS=32 cargo run --release -p detcoll-layers --features cuda --example ffn_cuda`
use collective_core::Collective;
use collective_factory::{Config, NvidiaCollective, nvidia};
use detcoll_layers::FfnShape;
use detcoll_layers::cuda::{
    CudaFfnShard, CudaGemm, CudaKernels, Lockstep, Rendezvous, StageEvents, thread_group_config,
};
use detcoll_layers::data::SplitMix64;
use half::bf16;
use std::time::Duration;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The output over all tokens at TP = `tp` (each rank's block, in rank order), and rank 0's
/// stage times.
fn run(tp: usize, shape: FfnShape, x: &[bf16], w1: &[bf16], w2: &[bf16]) -> Result<(Vec<bf16>, String)> {
    // Collective kernels capped at half the GPU when the ranks share it (thread_group_config).
    let config = thread_group_config(Config::new().with_capacity(shape.tokens * shape.hidden * 2), tp)?;
    let ranks = nvidia::thread_group(tp, &config)?;
    let barrier = Rendezvous::new(tp, Duration::from_secs(60));
    let outs = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|comm| {
                let barrier = &barrier;
                s.spawn(move || {
                    let result = rank(comm, barrier, tp, shape, [x, w1, w2]);
                    if result.is_err() {
                        barrier.poison("a rank failed"); // its peers fail instead of waiting
                    }
                    result
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect::<Result<Vec<_>>>()
    })?;
    let times = outs[0].1.clone();
    Ok((outs.into_iter().flat_map(|(o, _)| o).collect(), times))
}

/// One rank: everything that allocates or loads before any rank's first collective, then the
/// layer; its output block and its stage times.
fn rank(
    comm: &NvidiaCollective,
    barrier: &Rendezvous,
    tp: usize,
    shape: FfnShape,
    [x, w1, w2]: [&[bf16]; 3],
) -> Result<(Vec<bf16>, String)> {
    let (r, n) = (comm.rank(), shape.local_len(tp));
    let stream = comm.context().new_stream()?;
    let shard = CudaFfnShard::from_full(&stream, shape, w1, w2, tp, r)?;
    let mut ws = shard.workspace(&stream)?;
    let gemm = CudaGemm::new(&stream)?;
    let kernels = CudaKernels::new(comm.context())?;
    let x_local = stream.clone_htod(&x[r * n..(r + 1) * n])?;
    let mut out = stream.alloc_zeros::<bf16>(n)?;
    let mut events = StageEvents::new(comm.context(), 8)?;
    shard.warm_up(&gemm, &kernels, &mut ws, &stream)?;
    barrier.wait()?;
    let hook = &mut (Lockstep { barrier }, &mut events);
    shard.forward(comm, &gemm, &kernels, &mut ws, &x_local, &mut out, &stream, hook)?;
    let host = stream.clone_dtoh(&out)?;
    // A collective that failed after it was enqueued (a peer timed out) shows here.
    comm.ipc().map_or(Ok(()), |i| i.check())?;
    let times = events.totals_ms()?.into_iter().map(|(st, ms)| format!("{} {ms:.3}", st.name()));
    Ok((host, times.collect::<Vec<_>>().join(", ")))
}

fn main() -> Result<()> {
    if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        // SAFETY: the first statement of main, before any other thread exists.
        unsafe { std::env::set_var("CUDA_MODULE_LOADING", "EAGER") };
    }
    if let Err(e) = detcoll_layers::cuda::require_device() {
        println!("skipped: no CUDA device ({e}: {:?})", std::error::Error::source(&e));
        return Ok(());
    }
    let shape = FfnShape { tokens: 256, hidden: 512, ffn: 1024 };
    let mut rng = SplitMix64::new(42);
    let x: Vec<bf16> = rng.values(shape.tokens * shape.hidden, 1.0);
    let w1: Vec<bf16> = rng.values(shape.hidden * shape.ffn, 1.0 / (shape.hidden as f32).sqrt());
    let w2: Vec<bf16> = rng.values(shape.ffn * shape.hidden, 1.0 / (shape.ffn as f32).sqrt());
    println!("bf16 FFN on the GPU, {} tokens, hidden {}, ffn {}:", shape.tokens, shape.hidden, shape.ffn);
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut first: Option<Vec<u16>> = None;
    let mut all_agree = true;
    for tp in [1, 2, 4, 8] {
        let (out, times) = run(tp, shape, &x, &w1, &w2)?;
        let b = bits(&out);
        let same = first.as_ref().is_none_or(|f| *f == b);
        all_agree &= same;
        println!("  TP={tp}: {} (rank 0 stages, ms: {times})", if same { "bits match TP=1" } else { "bits DIFFER" });
        first.get_or_insert(b);
    }
    println!("{}", if all_agree { "bits agree across TP sizes" } else { "bits DIFFER across TP sizes" });
    std::process::exit(if all_agree { 0 } else { 1 });
}
