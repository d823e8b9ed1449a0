//! The TP-invariant sequence-parallel FFN on the CPU twin at TP = 1, 2, 4 and 8, ranks as
//! threads through the factory, as a user would write it; prints whether the bits agree.
//!
//! `cargo run -p detcoll-layers --example ffn_cpu`
use collective_factory::half::bf16;
use collective_factory::{Collective, Config, cpu};
use detcoll_layers::data::SplitMix64;
use detcoll_layers::{FfnShape, FfnShard, ReferenceGemm};

/// The output over all tokens at TP = `tp` (each rank's token block, in rank order), from the
/// naive layer when `naive`.
fn run(tp: usize, shape: FfnShape, x: &[bf16], w1: &[bf16], w2: &[bf16], naive: bool) -> Vec<bf16> {
    let ranks = cpu::thread_group(tp, &Config::new().with_capacity(1 << 20)).expect("a CPU thread group");
    let n = shape.local_len(tp);
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let r = comm.rank();
                    // Each rank holds its token block of x and its shard of the weights.
                    let shard = FfnShard::from_full(shape, w1, w2, tp, r)?;
                    let mut out = vec![bf16::ZERO; n];
                    let x_local = &x[r * n..(r + 1) * n];
                    if naive {
                        shard.forward_naive(comm, &ReferenceGemm, x_local, &mut out)?;
                    } else {
                        shard.forward(comm, &ReferenceGemm, x_local, &mut out)?;
                    }
                    Ok::<_, detcoll_layers::Error>(out)
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().expect("a rank panicked").expect("the FFN failed")).collect()
    })
}

fn main() {
    let shape = FfnShape { tokens: 64, hidden: 64, ffn: 256 };
    let mut rng = SplitMix64::new(42);
    let x: Vec<bf16> = rng.values(shape.tokens * shape.hidden, 1.0);
    let w1: Vec<bf16> = rng.values(shape.hidden * shape.ffn, 1.0 / (shape.hidden as f32).sqrt());
    let w2: Vec<bf16> = rng.values(shape.ffn * shape.hidden, 1.0 / (shape.ffn as f32).sqrt());

    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let tree1 = bits(&run(1, shape, &x, &w1, &w2, false));
    let naive1 = bits(&run(1, shape, &x, &w1, &w2, true));
    println!("bf16 FFN, {} tokens, hidden {}, ffn {}:", shape.tokens, shape.hidden, shape.ffn);
    let mut all_agree = true;
    for tp in [1, 2, 4, 8] {
        let tree = bits(&run(tp, shape, &x, &w1, &w2, false));
        let naive = bits(&run(tp, shape, &x, &w1, &w2, true));
        let differ = |a: &[u16], b: &[u16]| a.iter().zip(b).filter(|(p, q)| p != q).count();
        all_agree &= tree == tree1;
        println!(
            "  TP={tp}: TP-invariant layer {} TP=1 ({} of {} elements differ); naive layer: {} differ",
            if tree == tree1 { "matches" } else { "DIFFERS FROM" },
            differ(&tree, &tree1),
            tree.len(),
            differ(&naive, &naive1),
        );
    }
    println!("{}", if all_agree { "bits agree across TP sizes" } else { "bits DIFFER across TP sizes" });
    std::process::exit(if all_agree { 0 } else { 1 });
}
