//! The inputs of the fused-norm tests (CPU and GPU) and their reference: rank `r`'s `x` of a
//! call with seed `s` is `values(n, s * 100 + r)`, the residual `values(n, s * 7 + 1)`, the
//! weight `values(hidden, s * 7 + 2)`; `reference` evaluates `fixed_tree::residual_rmsnorm` on
//! them (the bits every backend must give).
#![allow(dead_code)]
use collective_core::fixed_tree::{Element, RmsNormShape, residual_rmsnorm};
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
    let n = rows * hidden;
    let xs: Vec<Vec<T>> = (0..world).map(|r| values(n, seed * 100 + r as u64)).collect();
    let refs: Vec<&[T]> = xs.iter().map(|v| v.as_slice()).collect();
    let (residual, weight): (Vec<T>, Vec<T>) = (values(n, seed * 7 + 1), values(hidden, seed * 7 + 2));
    let zero = T::from_f32_rounded(0.0);
    let (mut h, mut y) = (vec![zero; n], vec![zero; n]);
    residual_rmsnorm(&refs, &residual, &weight, 1e-6, RmsNormShape { rows, hidden }, &mut h, &mut y)
        .expect("reference");
    (h, y)
}

/// A table of `platform` sending every all_reduce to `route` (the other ops to the one-shot
/// route).
pub fn every_size_by(platform: &str, route: &str) -> Routing {
    let rule = |op: &str, route: &str| format!(r#"{{"op":"{op}","min_bytes":0,"max_bytes":null,"route":"{route}"}}"#);
    let rules = [
        rule("all_reduce", route),
        rule("all_gather", "ipc_one_shot"),
        rule("reduce_scatter", "ipc_one_shot"),
        rule("reduce_scatter_many", "ipc_one_shot"),
    ];
    let json = format!(r#"{{"platform":"{platform}","source":"test: one route","rules":[{}]}}"#, rules.join(","));
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
    /// `hiddens`, `x` and the residual each in place or not, and half the time every tensor
    /// 16-byte aligned (the kernels' vector, row and gathered forms need it), else each at its
    /// own element offset.
    pub fn shape(&mut self, rows: &[usize], hiddens: &[usize], max_elements: usize) -> Shape {
        let (mut r, hidden) = (self.pick(rows), self.pick(hiddens));
        while r * hidden > max_elements {
            r /= 2;
        }
        let in_place_x = self.pick(&[false, true]);
        let in_place_residual = self.pick(&[false, true]);
        let offsets = if self.pick(&[false, true]) { [0; 5] } else { [0; 5].map(|_| self.pick(&[0, 1, 3, 8])) };
        Shape { rows: r, hidden, in_place_x, in_place_residual, offsets }
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
}
