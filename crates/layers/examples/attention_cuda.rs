//! The CP-invariant causal attention on the GPU at CP = 1, 2, 4 and 8, ranks as threads
//! through `collective_factory::nvidia::thread_group` (on a one-GPU host every rank shares
//! GPU 0), cudarc buffers, one stream per rank; prints whether the output and log-sum-exp bits
//! agree, and rank 0's kernel time. Prints a skip line and exits 0 without a GPU.
//!
//! `CUDA_DEVICE_MAX_CONNECTIONS=32 cargo run --release -p detcoll-layers --features cuda --example attention_cuda [tokens]`
use collective_core::Collective;
use collective_factory::{Config, NvidiaCollective, nvidia};
use detcoll_layers::AttentionShape;
use detcoll_layers::cuda::{CudaAttention, CudaKernels, Lockstep, Rendezvous, StageEvents, thread_group_config};
use detcoll_layers::data::SplitMix64;
use half::bf16;
use std::time::Duration;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One rank's output bits, lse bits and attention-kernel milliseconds.
type RankOut = (Vec<u16>, Vec<u32>, f64);

fn run(cp: usize, shape: AttentionShape, qkv: &[Vec<bf16>; 3]) -> Result<Vec<RankOut>> {
    let e = shape.tokens / cp * shape.token_len();
    let config = thread_group_config(Config::new().with_capacity((e * 2).max(1 << 20)), cp)?;
    let ranks = nvidia::thread_group(cp, &config)?;
    let barrier = Rendezvous::new(cp, Duration::from_secs(60));
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|comm| {
                let barrier = &barrier;
                s.spawn(move || {
                    let result = rank(comm, barrier, cp, shape, qkv);
                    if result.is_err() {
                        barrier.poison("a rank failed"); // its peers fail instead of waiting
                    }
                    result
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// One rank: every allocation and upload before the rendezvous, then the layer.
fn rank(
    comm: &NvidiaCollective,
    barrier: &Rendezvous,
    cp: usize,
    shape: AttentionShape,
    qkv: &[Vec<bf16>; 3],
) -> Result<RankOut> {
    let (r, n) = (comm.rank(), shape.tokens / cp);
    let e = n * shape.token_len();
    let stream = comm.context().new_stream()?;
    let mut att = CudaAttention::<bf16>::new(&stream, shape, cp, r)?;
    let kernels = CudaKernels::new(comm.context())?;
    let [q, k, v] = [0, 1, 2].map(|i| stream.clone_htod(&qkv[i][r * e..(r + 1) * e]));
    let (q, k, v) = (q?, k?, v?);
    let positions: Vec<i32> = (r * n..(r + 1) * n).map(|p| p as i32).collect();
    let positions = stream.clone_htod(&positions)?;
    let mut out = stream.alloc_zeros::<bf16>(e)?;
    let mut lse = stream.alloc_zeros::<f32>(n * shape.heads)?;
    let mut events = StageEvents::new(comm.context(), 4)?;
    stream.synchronize()?;
    barrier.wait()?;
    let hook = &mut (Lockstep { barrier }, &mut events);
    att.forward(comm, &kernels, &q, &k, &v, &positions, &mut out, &mut lse, &stream, hook)?;
    let out = stream.clone_dtoh(&out)?.iter().map(|x| x.to_bits()).collect();
    let lse = stream.clone_dtoh(&lse)?.iter().map(|x| x.to_bits()).collect();
    // A collective that failed after it was enqueued (a peer timed out) shows here.
    comm.ipc().map_or(Ok(()), |i| i.check())?;
    let ms = events.totals_ms()?.iter().filter(|(st, _)| st.name() == "attention").map(|t| t.1).sum();
    Ok((out, lse, ms))
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
    let tokens = std::env::args().nth(1).map(|t| t.parse()).transpose()?.unwrap_or(1024);
    let shape = AttentionShape { tokens, heads: 32, head_dim: 128 };
    let mut rng = SplitMix64::new(9);
    let qkv = [0, 1, 2].map(|_| rng.values::<bf16>(tokens * shape.token_len(), 1.0));
    println!("bf16 causal attention on the GPU, {tokens} tokens, 32 heads of 128:");
    let mut first: Option<(Vec<u16>, Vec<u32>)> = None;
    let mut all_agree = true;
    for cp in [1, 2, 4, 8] {
        let ranks = run(cp, shape, &qkv)?;
        let ms = ranks[0].2;
        let (out, lse): (Vec<_>, Vec<_>) = ranks.into_iter().map(|(o, l, _)| (o, l)).unzip();
        let got = (out.concat(), lse.concat());
        let same = first.as_ref().is_none_or(|f| *f == got);
        all_agree &= same;
        let verdict = if same { "out and lse bits match CP=1" } else { "bits DIFFER" };
        println!("  CP={cp}: {verdict} (rank 0 kernel {ms:.2} ms)");
        first.get_or_insert(got);
    }
    println!("{}", if all_agree { "bits agree across CP sizes" } else { "bits DIFFER across CP sizes" });
    std::process::exit(if all_agree { 0 } else { 1 });
}
