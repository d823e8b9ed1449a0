//! What an `--e2e` run times: the layer, its shapes per token count, the TP/CP sizes, and the
//! checks that refuse flags the end-to-end bench has no use for.
use crate::harness::args::{BackendChoice, BenchArgs, BenchDtype, BenchOp, DEFAULT_NPROC, DEFAULT_SAMPLES, E2eLayer};
use detcoll_layers::{AttentionShape, FfnShape, LEAVES};

/// Default TP/CP sizes: every size the layers take.
pub const DEFAULT_TPS: [usize; 4] = [1, 2, 4, 8];

/// Shapes an `--e2e` run uses when no flag says otherwise: small on the CPU (the reference
/// GEMM and attention are plain Rust, so the default run takes seconds), model-sized on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    pub ffn_tokens: &'static [usize],
    pub hidden: usize,
    pub ffn: usize,
    pub attention_tokens: &'static [usize],
    pub heads: usize,
    pub head_dim: usize,
}

/// CPU defaults (tokens 64..256, hidden 128, ffn 512; attention 256 tokens of 4 x 64): the
/// default run (10 warm-up and 50 timed calls of each layer, the staged re-run, 4 sizes) stays
/// under half a minute on two cores.
pub const CPU_DEFAULTS: Defaults =
    Defaults { ffn_tokens: &[64, 128, 256], hidden: 128, ffn: 512, attention_tokens: &[256], heads: 4, head_dim: 64 };

/// GPU defaults (a Llama-3-8B-like FFN, 4096 x 14336; attention 32 heads of 128).
pub const GPU_DEFAULTS: Defaults = Defaults {
    ffn_tokens: &[1024, 4096, 16384],
    hidden: 4096,
    ffn: 14336,
    attention_tokens: &[1024, 4096, 16384],
    heads: 32,
    head_dim: 128,
};

/// One resolved `--e2e` run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub layer: E2eLayer,
    pub dtype: BenchDtype,
    pub tokens: Vec<usize>,
    /// TP (FFN) or CP (attention) sizes, in run order; the first is the bitwise reference.
    pub tps: Vec<usize>,
    pub hidden: usize,
    pub ffn: usize,
    /// The gated FFN (SwiGLU, `--gated`).
    pub gated: bool,
    pub heads: usize,
    pub head_dim: usize,
    pub warmup: usize,
    pub iterations: usize,
    pub graph: bool,
    pub seed: u64,
}

impl Plan {
    /// The run `args` ask for, with the `gpu` or CPU defaults; checks every shape against every
    /// TP/CP size before anything runs.
    pub fn new(args: &BenchArgs, gpu: bool) -> anyhow::Result<Plan> {
        let layer = args.e2e.ok_or_else(|| anyhow::anyhow!("not an --e2e run"))?;
        let d = if gpu { GPU_DEFAULTS } else { CPU_DEFAULTS };
        let default_tokens = match layer {
            E2eLayer::Ffn => d.ffn_tokens,
            E2eLayer::Attention => d.attention_tokens,
        };
        let mut tps = if args.tp.is_empty() { DEFAULT_TPS.to_vec() } else { args.tp.clone() };
        // The smallest size first: it is the reference the others are compared with.
        tps.sort_unstable();
        tps.dedup();
        let plan = Plan {
            layer,
            dtype: args.dtype,
            tokens: if args.tokens.is_empty() { default_tokens.to_vec() } else { args.tokens.clone() },
            tps,
            hidden: args.hidden.unwrap_or(d.hidden),
            ffn: args.ffn.unwrap_or(d.ffn),
            gated: args.gated,
            heads: args.heads.unwrap_or(d.heads),
            head_dim: args.head_dim.unwrap_or(d.head_dim),
            warmup: args.warmup,
            iterations: args.iterations,
            graph: args.graph,
            seed: args.seed,
        };
        plan.check()?;
        Ok(plan)
    }

    fn check(&self) -> anyhow::Result<()> {
        let what = self.parallel_name();
        if self.layer == E2eLayer::Ffn {
            anyhow::ensure!(
                self.ffn.is_multiple_of(LEAVES),
                "--ffn {}: the FFN width must be a multiple of the {LEAVES} leaves",
                self.ffn
            );
        }
        for &t in &self.tokens {
            for &tp in &self.tps {
                anyhow::ensure!(t % tp == 0, "--tokens {t}: does not split over {what} {tp} ranks");
            }
        }
        // A run whose tensors cannot fit this host is refused here, not aborted by a failed
        // allocation halfway (`--tokens 100000000` aborted the process, exit 134). The
        // estimate: the gathered tensor, the ranks' shards, the output and the reference,
        // each of the largest message.
        if let Some(available) = available_memory() {
            let needed = self.largest_message_bytes().saturating_mul(4);
            anyhow::ensure!(
                needed <= available,
                "--tokens {}: about {} MiB of tensors, more than the {} MiB this host has available",
                self.tokens.iter().copied().max().unwrap_or(0),
                needed >> 20,
                available >> 20
            );
        }
        Ok(())
    }

    /// The layer's name in reports and file names: `ffn`, `ffn-gated` or `attention`.
    pub fn layer_name(&self) -> &'static str {
        if self.gated { "ffn-gated" } else { self.layer.name() }
    }

    /// `tp` for the FFN, `cp` for attention.
    pub fn parallel_name(&self) -> &'static str {
        match self.layer {
            E2eLayer::Ffn => "tp",
            E2eLayer::Attention => "cp",
        }
    }

    pub fn ffn_shape(&self, tokens: usize) -> FfnShape {
        FfnShape { tokens, hidden: self.hidden, ffn: self.ffn }
    }

    pub fn attention_shape(&self, tokens: usize) -> AttentionShape {
        AttentionShape { tokens, heads: self.heads, head_dim: self.head_dim }
    }

    /// Element size of the dtype, bytes.
    pub fn element_bytes(&self) -> usize {
        self.dtype.dtype().size()
    }

    /// The largest message of any collective of the run, bytes (all ranks' tokens of one
    /// gathered tensor: the FFN's gathered `x` and its reduce_scatter input, attention's
    /// gathered `k`/`v`).
    pub fn largest_message_bytes(&self) -> usize {
        let t = self.tokens.iter().copied().max().unwrap_or(0);
        let width = match self.layer {
            E2eLayer::Ffn => self.hidden,
            E2eLayer::Attention => self.heads * self.head_dim,
        };
        t.saturating_mul(width).saturating_mul(self.element_bytes())
    }
}

/// Refuses the collective bench's flags that mean nothing with `--e2e` (and the e2e flags
/// without it), with a message that says what to use instead.
pub fn check_flags(args: &BenchArgs) -> anyhow::Result<()> {
    let Some(layer) = args.e2e else {
        let e2e_only = [
            ("--tokens", !args.tokens.is_empty()),
            ("--tp", !args.tp.is_empty()),
            ("--hidden", args.hidden.is_some()),
            ("--ffn", args.ffn.is_some()),
            ("--gated", args.gated),
            ("--heads", args.heads.is_some()),
            ("--head-dim", args.head_dim.is_some()),
        ];
        if let Some((flag, _)) = e2e_only.iter().find(|(_, given)| *given) {
            anyhow::bail!("{flag} applies to the end-to-end layer bench only: add --e2e ffn or --e2e attention");
        }
        return Ok(());
    };
    let refused = [
        ("--size-bytes", !args.size_bytes.is_empty(), "the layer's sizes come from --tokens and the shape flags"),
        ("--operations", args.operations != BenchOp::ALL, "the layer's stages are fixed"),
        ("--route", args.route.is_some(), "the layers call the collectives through the built-in routing"),
        ("--nproc", args.nproc != DEFAULT_NPROC, "--e2e sweeps TP/CP sizes: use --tp 1,2,4,8"),
        ("--samples", args.samples != DEFAULT_SAMPLES, "--e2e times every call: use --iterations"),
        ("--capacity", args.capacity_bytes.is_some(), "the layers size their collectives' staging themselves"),
        ("--replays", args.replays != 1, "--e2e replays each layer's graph once per iteration"),
    ];
    if let Some((flag, _, why)) = refused.iter().find(|(_, given, _)| *given) {
        anyhow::bail!("{flag} does not apply to --e2e {}: {why}", layer.name());
    }
    let (attention_only, ffn_only) = (
        [("--heads", args.heads.is_some()), ("--head-dim", args.head_dim.is_some())],
        [("--hidden", args.hidden.is_some()), ("--ffn", args.ffn.is_some()), ("--gated", args.gated)],
    );
    let wrong = match layer {
        E2eLayer::Ffn => attention_only.iter().find(|(_, g)| *g),
        E2eLayer::Attention => ffn_only.iter().find(|(_, g)| *g),
    };
    if let Some((flag, _)) = wrong {
        anyhow::bail!("{flag} is not a shape of --e2e {}", layer.name());
    }
    match args.backend {
        BackendChoice::Hip | BackendChoice::Memory => {
            anyhow::bail!(
                "--e2e runs on the CPU (--backend cpu) or an NVIDIA GPU (--backend cuda), not --backend hip/memory"
            )
        }
        BackendChoice::Cpu if args.graph => {
            anyhow::bail!("--graph captures CUDA graphs and needs --backend cuda (or auto on a GPU host)")
        }
        _ => Ok(()),
    }
}

/// `MemAvailable` of `/proc/meminfo`, bytes (`None` where it cannot be read).
fn available_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::args::tests::parse;

    #[test]
    fn e2e_flags_parse_and_round_trip() {
        let a = parse(&["--e2e", "ffn", "--tokens", "64,128", "--tp", "1,2", "--hidden", "32", "--ffn", "64"]).unwrap();
        assert_eq!(a.e2e, Some(E2eLayer::Ffn));
        assert_eq!((a.tokens.clone(), a.tp.clone(), a.hidden, a.ffn), (vec![64, 128], vec![1, 2], Some(32), Some(64)));
        check_flags(&a).unwrap();
        let args = a.to_cli_args();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(parse(&refs).unwrap(), a);
        let b =
            parse(&["--e2e", "attention", "--heads", "2", "--head-dim", "8", "--graph", "--backend", "cuda"]).unwrap();
        assert_eq!((b.e2e, b.heads, b.head_dim), (Some(E2eLayer::Attention), Some(2), Some(8)));
        check_flags(&b).unwrap();
        let args = b.to_cli_args();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(parse(&refs).unwrap(), b);
        // The gated FFN: its own flag, layer name and report file.
        let g = parse(&["--e2e", "ffn", "--gated"]).unwrap();
        check_flags(&g).unwrap();
        let args = g.to_cli_args();
        assert!(args.iter().any(|a| a == "--gated"));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(parse(&refs).unwrap(), g);
        let plan = Plan::new(&g, false).unwrap();
        assert!(plan.gated && plan.layer_name() == "ffn-gated");
        assert_eq!(Plan::new(&a, false).unwrap().layer_name(), "ffn");
        // The collective bench's report keeps its args: no e2e field appears there.
        let v = serde_json::to_value(parse(&[]).unwrap()).unwrap();
        for k in ["e2e", "tokens", "tp", "hidden", "ffn", "gated", "heads", "head_dim"] {
            assert!(v.get(k).is_none(), "{k} in the collective bench's args");
        }
    }

    #[test]
    fn bad_e2e_values_and_combinations_are_refused() {
        for bad in [
            &["--e2e", "mlp"][..],
            &["--e2e"],
            &["--e2e", "ffn", "--tp", "3"],
            &["--e2e", "ffn", "--tokens", "0"],
            &["--e2e", "ffn", "--hidden", "x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        let refused = |a: &[&str], want: &str| {
            let e = check_flags(&parse(a).unwrap()).unwrap_err().to_string();
            assert!(e.contains(want), "{a:?}: {e}");
        };
        refused(&["--e2e", "ffn", "--size-bytes", "4K"], "--size-bytes");
        refused(&["--e2e", "ffn", "--operations", "all_reduce"], "--operations");
        refused(&["--e2e", "ffn", "--route", "ipc_push_ll"], "--route");
        refused(&["--e2e", "ffn", "--nproc", "8"], "--tp");
        refused(&["--e2e", "ffn", "--samples", "3"], "--iterations");
        refused(&["--e2e", "ffn", "--heads", "8"], "--heads");
        refused(&["--e2e", "attention", "--ffn", "64"], "--ffn");
        refused(&["--e2e", "attention", "--gated"], "--gated");
        refused(&["--gated"], "--e2e");
        refused(&["--e2e", "ffn", "--backend", "hip"], "hip");
        refused(&["--e2e", "ffn", "--backend", "cpu", "--graph"], "--graph");
        refused(&["--tokens", "64"], "--e2e");
        refused(&["--tp", "2"], "--e2e");
        check_flags(&parse(&[]).unwrap()).unwrap();
    }

    #[test]
    fn plans_take_the_backend_defaults_and_check_shapes() {
        let a = parse(&["--e2e", "ffn"]).unwrap();
        let cpu = Plan::new(&a, false).unwrap();
        assert_eq!(
            (cpu.tokens.clone(), cpu.hidden, cpu.ffn, cpu.tps.clone()),
            (vec![64, 128, 256], 128, 512, vec![1, 2, 4, 8])
        );
        let gpu = Plan::new(&a, true).unwrap();
        assert_eq!((gpu.tokens.clone(), gpu.hidden, gpu.ffn), (vec![1024, 4096, 16384], 4096, 14336));
        assert_eq!(gpu.largest_message_bytes(), 16384 * 4096 * 2);
        let att = Plan::new(&parse(&["--e2e", "attention"]).unwrap(), true).unwrap();
        assert_eq!((att.heads, att.head_dim, att.parallel_name()), (32, 128, "cp"));
        // The reference size comes first whatever the order given.
        assert_eq!(Plan::new(&parse(&["--e2e", "ffn", "--tp", "4,1,4"]).unwrap(), false).unwrap().tps, [1, 4]);
        let e = Plan::new(&parse(&["--e2e", "ffn", "--tokens", "12"]).unwrap(), false).unwrap_err().to_string();
        assert!(e.contains("12") && e.contains("8"), "{e}");
        let e = Plan::new(&parse(&["--e2e", "ffn", "--ffn", "100"]).unwrap(), false).unwrap_err().to_string();
        assert!(e.contains("multiple of the 8 leaves"), "{e}");
    }
}
