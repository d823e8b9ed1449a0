//! The inputs of the fused-norm tests (CPU and GPU) and their reference: rank `r`'s `x` of a
//! call with seed `s` is `values(n, s * 100 + r)`, the residual `values(n, s * 7 + 1)`, the
//! weight `values(hidden, s * 7 + 2)`; `reference` evaluates `fixed_tree::residual_rmsnorm` on
//! them (the bits every backend must give).
#![allow(dead_code)]
use collective_core::fixed_tree::{Element, RmsNormShape, residual_rmsnorm, rmsnorm_row};
use collective_factory::Routing;

/// Deterministic values of every sign and a wide range of magnitudes (2^-4 .. 2^4). Row 0 of
/// `values(n, s)` is the same for every `n`: a row alone and the first row of a batch share it.
pub fn values<T: Element>(n: usize, seed: u64) -> Vec<T> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let m = ((s >> 11) % 2001) as f32 / 1000.0 - 1.0;
            T::from_f32_rounded(m * 2f32.powi(((s >> 40) % 9) as i32 - 4))
        })
        .collect()
}

/// Bit patterns, every NaN as one (NaN payloads are not part of the contract).
pub fn bits<T: Element>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits_u32() }).collect()
}

/// `(h, y)` of `world` ranks' inputs of seed `seed`, by the reference.
pub fn reference<T: Element>(world: usize, rows: usize, hidden: usize, seed: u64) -> (Vec<T>, Vec<T>) {
    reference_of(world, rows, hidden, seed, Values::Moderate, 1e-6)
}

/// `(h, y)` of `world` ranks' inputs `tensor(values, seed, ..)` with `eps`, by the reference.
pub fn reference_of<T: Element>(
    world: usize,
    rows: usize,
    hidden: usize,
    seed: u64,
    values: Values,
    eps: f32,
) -> (Vec<T>, Vec<T>) {
    let n = rows * hidden;
    let xs: Vec<Vec<T>> = (0..world).map(|r| tensor(values, seed, Tensor::X(r), rows, hidden)).collect();
    let refs: Vec<&[T]> = xs.iter().map(|v| v.as_slice()).collect();
    let residual: Vec<T> = tensor(values, seed, Tensor::Residual, rows, hidden);
    let weight: Vec<T> = tensor(values, seed, Tensor::Weight, rows, hidden);
    let zero = T::from_f32_rounded(0.0);
    let (mut h, mut y) = (vec![zero; n], vec![zero; n]);
    residual_rmsnorm(&refs, &residual, &weight, eps, RmsNormShape { rows, hidden }, &mut h, &mut y).expect("reference");
    (h, y)
}

/// Asserts that every rank's `(h, y)` in `got` has the bits of `want`.
pub fn assert_every_rank<T: Element>(got: Vec<(Vec<T>, Vec<T>)>, want: &(Vec<T>, Vec<T>), what: &str) {
    for (r, (gh, gy)) in got.into_iter().enumerate() {
        assert_eq!(bits(&gh), bits(&want.0), "{what} rank {r}: h");
        assert_eq!(bits(&gy), bits(&want.1), "{what} rank {r}: y");
    }
}

/// What a call's tensors hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// [`values`]: every sign, magnitudes 2^-4 .. 2^4, nothing special.
    Moderate,
    /// Rows of kinds chosen per row (the same kind in every tensor of the row): moderate;
    /// specials sprinkled in (NaN, ±∞, ±0, the largest finite, the smallest subnormal and
    /// normal); zeros in every rank's `x` and the residual (with `eps = 0`: NaN rows); huge
    /// values (sums overflowing f16/bf16, squares overflowing f32: `inv = +0`); tiny ones
    /// (subnormals, squares underflowing: with `eps = 0`, `inv = ∞`); ranks `2k` and `2k + 1`
    /// with opposite `x` (the tree's first adds exact zeros); magnitudes over 2^±30. A weight
    /// of moderate values with ±0, subnormal, huge, ±1 and (rarely) ∞ sprinkled in.
    Adversarial,
}

/// One tensor of a call.
#[derive(Debug, Clone, Copy)]
pub enum Tensor {
    /// Rank `r`'s input.
    X(usize),
    /// The residual (every rank's is the same).
    Residual,
    /// The weight, `hidden` elements.
    Weight,
}

/// The tensor `which` of the call of seed `seed`: `rows * hidden` elements (`hidden` for the
/// weight). `Values::Moderate` gives [`values`] with the seeds the older tests use.
pub fn tensor<T: Element>(kind: Values, seed: u64, which: Tensor, rows: usize, hidden: usize) -> Vec<T> {
    let n = rows * hidden;
    match (kind, which) {
        (Values::Moderate, Tensor::X(r)) => values(n, seed * 100 + r as u64),
        (Values::Moderate, Tensor::Residual) => values(n, seed * 7 + 1),
        (Values::Moderate, Tensor::Weight) => values(hidden, seed * 7 + 2),
        (Values::Adversarial, which) => adversarial(seed, which, rows, hidden),
    }
}

/// An xorshift64 step.
fn step(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// A value of `[-1, 1]` (in steps of 1/1000) from the bits of `r`, times `2^e`, rounded to `T`.
fn scaled<T: Element>(r: u64, e: i32) -> T {
    let m = ((r >> 11) % 2001) as f32 / 1000.0 - 1.0;
    // 2^e as f32 bits when e is a normal exponent; below, repeated halving keeps it exact.
    let mut p = 2f32.powi(e.max(-126));
    for _ in e..-126 {
        p *= 0.5;
    }
    T::from_f32_rounded(m * p)
}

/// The bits of `T`'s largest finite value, its smallest subnormal and its smallest normal, its
/// sign bit, and the binary exponents of its largest finite and smallest subnormal values.
fn limits<T: Element>() -> (u32, u32, u32, u32, i32, i32) {
    match T::NAME {
        "f32" => (0x7f7f_ffff, 1, 0x0080_0000, 0x8000_0000, 127, -149),
        "f16" => (0x7bff, 1, 0x0400, 0x8000, 15, -24),
        _ => (0x7f7f, 1, 0x0080, 0x8000, 127, -133),
    }
}

fn adversarial<T: Element>(seed: u64, which: Tensor, rows: usize, hidden: usize) -> Vec<T> {
    let (max, sub, normal, sign, top, low) = limits::<T>();
    let b = T::from_bits_u32;
    let specials = [
        T::from_f32_rounded(f32::NAN),
        T::from_f32_rounded(f32::INFINITY),
        T::from_f32_rounded(f32::NEG_INFINITY),
        b(0),
        b(sign),
        b(max),
        b(max | sign),
        b(sub),
        b(sub | sign),
        b(normal | sign),
        T::from_f32_rounded(1.0),
    ];
    let moderate = |r: u64| scaled::<T>(r, ((r >> 40) % 9) as i32 - 4);
    let mut own = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ 0xadd5_u64.wrapping_mul(match which {
            Tensor::X(r) => 3 + r as u64,
            Tensor::Residual => 1,
            Tensor::Weight => 2,
        });
    own |= 1;
    if let Tensor::Weight = which {
        let weight_specials = [b(0), b(sign), b(sub), b(max), T::from_f32_rounded(1.0), T::from_f32_rounded(-1.0)];
        return (0..hidden)
            .map(|_| {
                let r = step(&mut own);
                match r % 64 {
                    0 => T::from_f32_rounded(f32::INFINITY),
                    1..=4 => weight_specials[((r >> 20) % weight_specials.len() as u64) as usize],
                    _ => moderate(r),
                }
            })
            .collect();
    }
    // Ranks 2k and 2k + 1 draw their cancelling rows from one stream.
    let (mut pair, negate) = match which {
        Tensor::X(r) => ((seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ (r as u64 & !1)) | 1, r % 2 == 1),
        _ => (own ^ 0x5555, false),
    };
    let mut v = Vec::with_capacity(rows * hidden);
    for row in 0..rows {
        let mut k = (seed ^ (row as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
        step(&mut k);
        let kind = step(&mut k) % 8;
        for _ in 0..hidden {
            let r = step(&mut own);
            let p = step(&mut pair);
            v.push(match kind {
                1 if r.is_multiple_of(8) => specials[((r >> 20) % specials.len() as u64) as usize],
                2 => b(if r & 1 == 1 { sign } else { 0 }),
                3 => scaled(r, top - ((r >> 40) % 4) as i32),
                4 => scaled(r, low + ((r >> 40) % 12) as i32),
                5 if matches!(which, Tensor::X(_)) => {
                    let m: T = moderate(p);
                    if negate { b(m.to_bits_u32() ^ sign) } else { m }
                }
                6 => scaled(r, ((r >> 40) % 61) as i32 - 30),
                _ => moderate(r),
            });
        }
    }
    v
}

/// A table of `platform` sending every all_reduce to `route` (the other ops to the one-shot
/// route).
pub fn every_size_by(platform: &str, route: &str) -> Routing {
    one_rule_per_op(platform, "test: one route", &[("all_reduce", route)])
}

/// A table of `platform` whose all_reduce takes `all_reduce` and the fused call's all_reduce
/// `fused` (its `all_reduce_residual_rmsnorm` rules), at every size; the other ops one-shot.
pub fn fused_by(platform: &str, all_reduce: &str, fused: &str) -> Routing {
    one_rule_per_op(
        platform,
        "test: fused route",
        &[("all_reduce", all_reduce), ("all_reduce_residual_rmsnorm", fused)],
    )
}

/// A table of `platform` with one rule per op for every size: `routes` (op, route), the other
/// collectives one-shot.
fn one_rule_per_op(platform: &str, source: &str, routes: &[(&str, &str)]) -> Routing {
    let rule = |op: &str, route: &str| format!(r#"{{"op":"{op}","min_bytes":0,"max_bytes":null,"route":"{route}"}}"#);
    let others = ["all_gather", "reduce_scatter", "reduce_scatter_many"].map(|op| (op, "ipc_one_shot"));
    let rules: Vec<String> = routes.iter().chain(&others).map(|(op, route)| rule(op, route)).collect();
    let json = format!(r#"{{"platform":"{platform}","source":"{source}","rules":[{}]}}"#, rules.join(","));
    Routing::from_json(&json).expect("table")
}

/// A deterministic stream of choices (xorshift64), for the randomised tests.
pub struct Choices(pub u64);

impl Choices {
    /// One of `from`.
    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        from[(self.0 % from.len() as u64) as usize]
    }

    /// A call of one of `rows` (halved until it has at most `max_elements`) of one of
    /// `hiddens`, `x` and the residual each in place or not, half the time every tensor
    /// 16-byte aligned (the kernels' vector, row and gathered forms need it), else each at its
    /// own element offset; half the time moderate values, else adversarial ones; `eps` of
    /// 1e-6, 1e-5 or 0.
    pub fn shape(&mut self, rows: &[usize], hiddens: &[usize], max_elements: usize) -> Shape {
        let (mut r, hidden) = (self.pick(rows), self.pick(hiddens));
        while r * hidden > max_elements {
            r /= 2;
        }
        let in_place_x = self.pick(&[false, true]);
        let in_place_residual = self.pick(&[false, true]);
        let offsets = if self.pick(&[false, true]) { [0; 5] } else { [0; 5].map(|_| self.pick(&[0, 1, 3, 8])) };
        let values = self.pick(&[Values::Moderate, Values::Adversarial]);
        let eps = self.pick(&[1e-6, 1e-6, 1e-5, 0.0]);
        Shape { rows: r, hidden, in_place_x, in_place_residual, offsets, values, eps }
    }
}

/// One randomised call's shape and layout.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub rows: usize,
    pub hidden: usize,
    /// `y` over `x`.
    pub in_place_x: bool,
    /// `h` over the residual.
    pub in_place_residual: bool,
    /// Element offsets of x, y, the residual, h and the weight in their buffers.
    pub offsets: [usize; 5],
    /// What the tensors hold.
    pub values: Values,
    /// The norm's epsilon.
    pub eps: f32,
}

/// For the tests of several threads on one handle, whose calls' `x` and residual are each one
/// constant: asserts that `h` is one constant (else chunks of different calls mixed) and that
/// every row of `y` is `fixed_tree::rmsnorm_row` of its `h` row bit for bit (else the norm
/// read another call's sums); returns that constant.
pub fn one_call_of_constants(h: &[f32], y: &[f32], weight: &[f32], eps: f32, what: &str) -> f32 {
    let hidden = weight.len();
    assert!(h.iter().all(|v| v.to_bits() == h[0].to_bits()), "{what}: h is not one call's (chunks mixed)");
    let mut want = vec![0f32; hidden];
    rmsnorm_row(&h[..hidden], weight, eps, &mut want).expect("reference");
    for (row, got) in y.chunks(hidden).enumerate() {
        assert_eq!(bits(got), bits(&want), "{what}: y row {row} is not the norm of h");
    }
    h[0]
}
