//! Causal CP attention on the CPU twin at CP = 1, 2, 4 and 8, ranks as threads through the
//! factory, as a user would write it; prints whether the bits agree.
//!
//! `cargo run -p detcoll-layers --example attention_cpu`
use collective_factory::half::bf16;
use collective_factory::{Collective, Config, cpu};
use detcoll_layers::attention::{self, AttentionInput, AttentionOutput, AttentionShape};
use detcoll_layers::data::SplitMix64;

struct Tokens {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    positions: Vec<u32>,
}

/// Output and log-sum-exp of all tokens at CP = `cp` (each rank's block, in rank order), as bits.
fn run(cp: usize, shape: AttentionShape, all: &Tokens) -> (Vec<u16>, Vec<u32>) {
    let ranks = cpu::thread_group(cp, &Config::new().with_capacity(1 << 20)).expect("a CPU thread group");
    let (n, row) = (shape.tokens / cp, shape.token_len());
    let per_rank: Vec<(Vec<bf16>, Vec<f32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    // Each rank holds a contiguous block of tokens.
                    let r = comm.rank();
                    let (e0, e1) = (r * n * row, (r + 1) * n * row);
                    let local = AttentionInput {
                        q: &all.q[e0..e1],
                        k: &all.k[e0..e1],
                        v: &all.v[e0..e1],
                        positions: &all.positions[r * n..(r + 1) * n],
                    };
                    let mut out = vec![bf16::ZERO; n * row];
                    let mut lse = vec![0f32; n * shape.heads];
                    attention::forward(comm, shape, local, AttentionOutput { out: &mut out, lse: &mut lse })?;
                    Ok::<_, detcoll_layers::Error>((out, lse))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked").expect("attention failed")).collect()
    });
    let out = per_rank.iter().flat_map(|(o, _)| o.iter().map(|x| x.to_bits())).collect();
    let lse = per_rank.iter().flat_map(|(_, l)| l.iter().map(|x| x.to_bits())).collect();
    (out, lse)
}

fn main() {
    let shape = AttentionShape { tokens: 64, heads: 2, head_dim: 16 };
    let e = shape.tokens * shape.token_len();
    let mut rng = SplitMix64::new(7);
    let all = Tokens {
        q: rng.values(e, 2.0),
        k: rng.values(e, 2.0),
        v: rng.values(e, 1.0),
        positions: (0..shape.tokens as u32).collect(),
    };
    let cp1 = run(1, shape, &all);
    println!("bf16 causal attention, {} tokens, {} heads of {}:", shape.tokens, shape.heads, shape.head_dim);
    let mut all_agree = true;
    for cp in [1, 2, 4, 8] {
        let got = run(cp, shape, &all);
        all_agree &= got == cp1;
        println!(
            "  CP={cp}: output {} CP=1, log-sum-exp {} CP=1",
            if got.0 == cp1.0 { "matches" } else { "DIFFERS FROM" },
            if got.1 == cp1.1 { "matches" } else { "DIFFERS FROM" },
        );
    }
    println!("{}", if all_agree { "bits agree across CP sizes" } else { "bits DIFFER across CP sizes" });
    std::process::exit(if all_agree { 0 } else { 1 });
}
