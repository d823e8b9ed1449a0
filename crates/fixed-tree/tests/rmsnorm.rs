//! The fused `all_reduce + residual + RMSNorm` reference against an independent evaluation of
//! its definition, and the properties the contract promises (batch and TP invariance), the
//! specials, and the errors. Every comparison is by bit pattern (any NaN equals any NaN), never
//! a tolerance.
use fixed_tree::{
    Element, Error, MAX_WORLD_SIZE, RMSNORM_LANES, RMSNORM_MAX_HIDDEN, RMSNORM_VECTOR, RmsNormShape,
    SUPPORTED_WORLD_SIZES, cross_tp_leaves, residual_rmsnorm, rmsnorm_row, sum_of_squares, tree_sum,
};
use half::{bf16, f16};

const HIDDENS: [usize; 10] = [1, 7, 8, 9, 255, 2048, 2049, 4096, 8192, 5120 + 3];

// ---------------------------------------------------------------------------------------------
// Helpers.

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32) * 2f32.powi(-23) - 1.0
    }
    /// `n` values of `T` spread over 2^-6 .. 2^6 so that the sum of squares rounds, and its
    /// order shows in the bits.
    fn values<T: Element>(&mut self, n: usize) -> Vec<T> {
        (0..n)
            .map(|_| {
                let k = (self.next() % 13) as i32 - 6;
                T::from_f32_rounded(self.unit() * 2f32.powi(k))
            })
            .collect()
    }
    /// `n` arbitrary bit patterns of `T` (specials included).
    fn patterns<T: Element>(&mut self, n: usize) -> Vec<T> {
        let mask = if T::SIZE == 4 { u32::MAX } else { 0xffff };
        (0..n).map(|_| T::from_bits_u32(self.next() as u32 & mask)).collect()
    }
}

fn same<T: Element>(a: T, b: T) -> bool {
    a.to_bits_u32() == b.to_bits_u32() || (a.is_nan() && b.is_nan())
}

#[track_caller]
fn assert_same<T: Element>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            same(*g, *w),
            "{} {what}[{j}]: got {g:?} ({:#x}), want {w:?} ({:#x})",
            T::NAME,
            g.to_bits_u32(),
            w.to_bits_u32()
        );
    }
}

fn f32s<T: Element>(v: f32) -> T {
    T::from_f32_rounded(v)
}

// ---------------------------------------------------------------------------------------------
// The independent evaluation of steps 3-5.
//
// Written from the GPU's point of view rather than the crate's: thread t walks the chunks of
// 2048 elements and takes its 8 contiguous ones from each; the partial vectors are built
// explicitly and halved recursively. Every operation is done in f64 and rounded to f32 with
// `as f32`: products of two f32 are exact in f64, and a sum, quotient or square root rounded
// first to f64 (53 bits) and then to f32 (24 bits) is the correctly rounded f32 result because
// 53 >= 2·24 + 2 (Figueroa, "When is double rounding innocuous?", 1995). So this does not share
// the crate's f32 operations either.

fn r32(x: f64) -> f32 {
    x as f32
}
fn add(a: f32, b: f32) -> f32 {
    r32(f64::from(a) + f64::from(b))
}
fn mul(a: f32, b: f32) -> f32 {
    r32(f64::from(a) * f64::from(b))
}

/// The 256 lane partials, built thread by thread.
fn lane_partials(h: &[f32]) -> Vec<f32> {
    (0..256)
        .map(|t| {
            let mut p = 0.0f32;
            let mut base = 8 * t;
            while base < h.len() {
                for &v in &h[base..(base + 8).min(h.len())] {
                    p = add(p, mul(v, v));
                }
                base += 2048;
            }
            p
        })
        .collect()
}

/// Recursive halving: the first half plus the second half, element-wise, until one is left.
fn halve(p: &[f32]) -> f32 {
    if p.len() == 1 {
        return p[0];
    }
    let (lo, hi) = p.split_at(p.len() / 2);
    let next: Vec<f32> = lo.iter().zip(hi).map(|(&a, &b)| add(a, b)).collect();
    halve(&next)
}

fn ref_sum_of_squares(h: &[f32]) -> f32 {
    halve(&lane_partials(h))
}

/// Steps 4-5 from a given `q`, in f64 rounded to f32 after every operation.
fn ref_norm_from_q<T: Element>(q: f32, h: &[T], w: &[T], eps: f32) -> Vec<T> {
    let hidden = h.len() as f64;
    let mean = r32(f64::from(q) / hidden);
    let r = add(mean, eps);
    let root = r32(f64::from(r).sqrt());
    let inv = r32(1.0 / f64::from(root));
    h.iter().zip(w).map(|(&hj, &wj)| T::from_f32_rounded(mul(mul(hj.to_f32_exact(), inv), wj.to_f32_exact()))).collect()
}

fn ref_norm_row<T: Element>(h: &[T], w: &[T], eps: f32) -> Vec<T> {
    let hf: Vec<f32> = h.iter().map(|v| v.to_f32_exact()).collect();
    ref_norm_from_q(ref_sum_of_squares(&hf), h, w, eps)
}

fn norm_row<T: Element>(h: &[T], w: &[T], eps: f32) -> Vec<T> {
    let mut y = vec![T::from_bits_u32(0); h.len()];
    rmsnorm_row(h, w, eps, &mut y).unwrap();
    y
}

/// The whole fused op through the crate; returns `(h, y)`.
fn fused<T: Element>(ranks: &[Vec<T>], residual: &[T], w: &[T], eps: f32, hidden: usize) -> (Vec<T>, Vec<T>) {
    let n = residual.len();
    let refs: Vec<&[T]> = ranks.iter().map(Vec::as_slice).collect();
    let (mut h, mut y) = (vec![T::from_bits_u32(0); n], vec![T::from_bits_u32(0); n]);
    residual_rmsnorm(&refs, residual, w, eps, RmsNormShape { rows: n / hidden, hidden }, &mut h, &mut y).unwrap();
    (h, y)
}

// ---------------------------------------------------------------------------------------------
// The independent evaluation agrees.

#[test]
fn the_reference_itself() {
    // Lane map: hidden 4096, lane t holds 8t..8t+7 and 2048+8t..2048+8t+7.
    let h: Vec<f32> = (0..4096).map(|j| j as f32).collect();
    let lanes = lane_partials(&h);
    for t in [0, 1, 100, 255] {
        // In element order, accumulated in f32 (the squares are exact: j² < 2^24).
        let want = (8 * t..8 * t + 8).chain(2048 + 8 * t..2048 + 8 * t + 8).fold(0.0f32, |a, j| a + (j * j) as f32);
        assert_eq!(lanes[t], want, "lane {t}");
    }
    assert_eq!(halve(&[1.0, 2.0, 4.0, 8.0]), 15.0);
    // Small exact cases: q = 25 for [3, 4] (both in lane 0).
    assert_eq!(ref_sum_of_squares(&[3.0, 4.0]), 25.0);
    assert_eq!(sum_of_squares(&[3.0f32, 4.0]), 25.0);
    assert_eq!(sum_of_squares::<f32>(&[]), 0.0);
    assert_eq!(sum_of_squares::<f32>(&[]).to_bits(), 0, "an empty sum is +0");
    assert_eq!((RMSNORM_LANES, RMSNORM_VECTOR, RMSNORM_MAX_HIDDEN), (256, 8, 1 << 24));
}

fn independent_evaluation<T: Element>(seed: u64) {
    let mut rng = SplitMix64(seed);
    for hidden in HIDDENS {
        for round in 0..4 {
            // Rounds 0-2: moderate values; round 3: arbitrary bit patterns (inf, NaN, huge).
            let (h, w): (Vec<T>, Vec<T>) = if round < 3 {
                (rng.values(hidden), rng.values(hidden))
            } else {
                (rng.patterns(hidden), rng.values(hidden))
            };
            let hf: Vec<f32> = h.iter().map(|v| v.to_f32_exact()).collect();
            let (got, want) = (sum_of_squares(&h), ref_sum_of_squares(&hf));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{} hidden {hidden} round {round}: sum_of_squares {got} ({:#x}), reference {want} ({:#x})",
                T::NAME,
                got.to_bits(),
                want.to_bits()
            );
            for eps in [1e-6f32, 1e-5, 0.0, 0.5] {
                assert_same(
                    &norm_row(&h, &w, eps),
                    &ref_norm_row(&h, &w, eps),
                    &format!("y, hidden {hidden}, eps {eps}"),
                );
            }
        }
    }
}

#[test]
fn independent_evaluation_f32() {
    independent_evaluation::<f32>(1);
}

#[test]
fn independent_evaluation_f16() {
    independent_evaluation::<f16>(2);
}

#[test]
fn independent_evaluation_bf16() {
    independent_evaluation::<bf16>(3);
}

// ---------------------------------------------------------------------------------------------
// Steps 1-2: h is the all_reduce's bits plus one add, and y is the norm of that h.

fn h_is_residual_plus_tree<T: Element>(seed: u64) {
    let mut rng = SplitMix64(seed);
    let (rows, hidden) = (3, 2049);
    let n = rows * hidden;
    for world in (1..=8).chain([12]) {
        let ranks: Vec<Vec<T>> = (0..world).map(|_| rng.values(n)).collect();
        let residual: Vec<T> = rng.values(n);
        let w: Vec<T> = rng.values(hidden);
        let (h, y) = fused(&ranks, &residual, &w, 1e-6, hidden);
        let want_h: Vec<T> = (0..n)
            .map(|i| {
                let column: Vec<T> = ranks.iter().map(|r| r[i]).collect();
                residual[i].add(tree_sum(&column).unwrap())
            })
            .collect();
        assert_same(&h, &want_h, &format!("h, world {world}"));
        for row in 0..rows {
            let hr = &h[row * hidden..(row + 1) * hidden];
            let yr = &y[row * hidden..(row + 1) * hidden];
            assert_same(yr, &norm_row(hr, &w, 1e-6), &format!("y, world {world}, row {row}"));
            assert_same(yr, &ref_norm_row(hr, &w, 1e-6), &format!("y vs reference, world {world}, row {row}"));
        }
    }
}

#[test]
fn h_is_residual_plus_tree_f32() {
    h_is_residual_plus_tree::<f32>(10);
}

#[test]
fn h_is_residual_plus_tree_f16() {
    h_is_residual_plus_tree::<f16>(11);
}

#[test]
fn h_is_residual_plus_tree_bf16() {
    h_is_residual_plus_tree::<bf16>(12);
}

// ---------------------------------------------------------------------------------------------
// Batch invariance: a row's bits do not depend on the rows around it or their number.

fn batch_invariance<T: Element>(seed: u64) {
    let mut rng = SplitMix64(seed);
    let (rows, hidden, world) = (64, 5120 + 3, 3);
    let n = rows * hidden;
    let ranks: Vec<Vec<T>> = (0..world).map(|_| rng.values(n)).collect();
    let residual: Vec<T> = rng.values(n);
    let w: Vec<T> = rng.values(hidden);
    let (h64, y64) = fused(&ranks, &residual, &w, 1e-5, hidden);
    let rows_of = |v: &[T], lo: usize, hi: usize| v[lo * hidden..hi * hidden].to_vec();
    for i in 0..rows {
        // Batch of 1, and batches of 3 with row i first, in the middle and last.
        let mut batches = vec![(i, i + 1)];
        for before in 0..3 {
            if i >= before && i - before + 3 <= rows {
                batches.push((i - before, i - before + 3));
            }
        }
        for (lo, hi) in batches {
            let sub: Vec<Vec<T>> = ranks.iter().map(|r| rows_of(r, lo, hi)).collect();
            let (h, y) = fused(&sub, &rows_of(&residual, lo, hi), &w, 1e-5, hidden);
            let k = i - lo;
            let what = format!("row {i} in batch {lo}..{hi}");
            assert_same(&rows_of(&h, k, k + 1), &rows_of(&h64, i, i + 1), &format!("h, {what}"));
            assert_same(&rows_of(&y, k, k + 1), &rows_of(&y64, i, i + 1), &format!("y, {what}"));
        }
    }
}

#[test]
fn batch_invariance_f32() {
    batch_invariance::<f32>(20);
}

#[test]
fn batch_invariance_f16() {
    batch_invariance::<f16>(21);
}

#[test]
fn batch_invariance_bf16() {
    batch_invariance::<bf16>(22);
}

// ---------------------------------------------------------------------------------------------
// TP invariance: with the TP-invariant layer (each TP=k rank holds the tree of its block of the
// eight TP=8 leaves), h and y are the same at TP = 1, 2, 4 and 8.

fn tp_invariance<T: Element>(seed: u64) {
    let mut rng = SplitMix64(seed);
    let (rows, hidden) = (4, 4096);
    let n = rows * hidden;
    let leaves: Vec<Vec<T>> = (0..8).map(|_| rng.values(n)).collect();
    let residual: Vec<T> = rng.values(n);
    let w: Vec<T> = rng.values(hidden);
    let (h8, y8) = fused(&leaves, &residual, &w, 1e-6, hidden);
    let leaf_refs: Vec<&[T]> = leaves.iter().map(Vec::as_slice).collect();
    for k in SUPPORTED_WORLD_SIZES {
        let ranks = cross_tp_leaves(&leaf_refs, k).unwrap();
        let (h, y) = fused(&ranks, &residual, &w, 1e-6, hidden);
        assert_same(&h, &h8, &format!("h, TP={k}"));
        assert_same(&y, &y8, &format!("y, TP={k}"));
    }
}

#[test]
fn tp_invariance_all_dtypes() {
    tp_invariance::<f32>(30);
    tp_invariance::<f16>(31);
    tp_invariance::<bf16>(32);
}

// ---------------------------------------------------------------------------------------------
// The order matters: other orders give other bits, so a kernel with a wrong order is caught.

fn sequential(h: &[f32]) -> f32 {
    h.iter().fold(0.0f32, |acc, &v| acc + v * v)
}

/// Lanes of one element each, strided by the lane count (`j % lanes`), then halving: the order
/// of a kernel whose thread t loads elements t, t + 256, ... (vLLM's loop, at 256 threads).
fn strided(h: &[f32]) -> f32 {
    let mut p = vec![0.0f32; 256];
    for (j, &v) in h.iter().enumerate() {
        p[j % 256] += v * v;
    }
    halve(&p)
}

/// Contiguous blocks per lane: lane t holds elements t·b .. (t+1)·b, b = ceil(hidden / 256).
fn blocked(h: &[f32]) -> f32 {
    let b = h.len().div_ceil(256);
    let mut p = vec![0.0f32; 256];
    for (j, &v) in h.iter().enumerate() {
        p[j / b] += v * v;
    }
    halve(&p)
}

/// A 4-element vector (8-byte loads) instead of 8.
fn vector4(h: &[f32]) -> f32 {
    let mut p = vec![0.0f32; 256];
    for (j, &v) in h.iter().enumerate() {
        p[(j / 4) % 256] += v * v;
    }
    halve(&p)
}

/// 128 lanes (a 128-thread block) instead of 256.
fn lanes128(h: &[f32]) -> f32 {
    let mut p = vec![0.0f32; 128];
    for (j, &v) in h.iter().enumerate() {
        p[(j / 8) % 128] += v * v;
    }
    halve(&p)
}

/// The lanes folded left to right instead of halved.
fn lanes_folded(h: &[f32]) -> f32 {
    lane_partials(h).iter().fold(0.0f32, |a, &b| a + b)
}

/// Squares fused into the accumulation (one rounding per element instead of two).
fn fused_multiply_add(h: &[f32]) -> f32 {
    let mut p = vec![0.0f32; 256];
    for (j, &v) in h.iter().enumerate() {
        let lane = &mut p[(j / 8) % 256];
        *lane = v.mul_add(v, *lane);
    }
    halve(&p)
}

fn crafted_row() -> Vec<f32> {
    // 4096² = 2^24: in order, each later 1 is lost (2^24 + 1 rounds to 2^24); by lanes, elements
    // 8..16 make lane 1 exactly 8, added at the end.
    let mut h = vec![1.0f32; 16];
    h[0] = 4096.0;
    h
}

#[test]
fn the_order_matters_on_a_crafted_row() {
    let h = crafted_row();
    assert_eq!(sequential(&h), 16_777_216.0);
    assert_eq!(sum_of_squares(&h), 16_777_224.0);
    assert_eq!(ref_sum_of_squares(&h), 16_777_224.0);
    // 4096 and 1 are exact in f16 and bf16 too: the same q from every dtype.
    let h16: Vec<f16> = h.iter().map(|&v| f32s(v)).collect();
    let hb16: Vec<bf16> = h.iter().map(|&v| f32s(v)).collect();
    assert_eq!(sum_of_squares(&h16), 16_777_224.0);
    assert_eq!(sum_of_squares(&hb16), 16_777_224.0);
    // And y sees it: the norm from the sequential q differs from the reference's.
    let w = vec![1.0f32; h.len()];
    let y = norm_row(&h, &w, 0.0);
    let y_sequential = ref_norm_from_q(sequential(&h), &h, &w, 0.0);
    assert_eq!(y, ref_norm_row(&h, &w, 0.0));
    assert!(y.iter().zip(&y_sequential).any(|(a, b)| a.to_bits() != b.to_bits()), "y does not see the order");
}

#[test]
fn every_other_order_differs_somewhere() {
    type Order = fn(&[f32]) -> f32;
    let orders: [(&str, Order); 7] = [
        ("sequential", sequential),
        ("strided j % 256", strided),
        ("contiguous blocks", blocked),
        ("vector of 4", vector4),
        ("128 lanes", lanes128),
        ("lanes folded", lanes_folded),
        ("fused multiply-add", fused_multiply_add),
    ];
    let mut rng = SplitMix64(40);
    let rows: Vec<Vec<f32>> = (0..32).map(|_| rng.values::<f32>(4096)).collect();
    for (name, order) in orders {
        let differs = rows.iter().any(|h| order(h).to_bits() != sum_of_squares(h).to_bits());
        assert!(differs, "the {name} order gives the same bits on every row: the test could not catch it");
    }
    // The reference agrees with the crate on all of them.
    for h in &rows {
        assert_eq!(ref_sum_of_squares(h).to_bits(), sum_of_squares(h).to_bits());
    }
}

// ---------------------------------------------------------------------------------------------
// Specials.

fn zeros<T: Element>() {
    let hidden = 2049;
    let zero = T::from_bits_u32(0);
    let ranks = vec![vec![zero; 2 * hidden]; 2];
    let residual = vec![zero; 2 * hidden];
    let w: Vec<T> = (0..hidden).map(|j| f32s(if j % 2 == 0 { 1.5 } else { -0.75 })).collect();
    // eps > 0: inv = 1/sqrt(eps) is finite, y = (+0 · inv) · w = +0 or -0 by w's sign.
    let (h, y) = fused(&ranks, &residual, &w, 1e-6, hidden);
    assert!(h.iter().all(|v| v.to_bits_u32() == 0));
    for (j, v) in y.iter().enumerate() {
        let want = if j % hidden % 2 == 0 { f32s::<T>(0.0) } else { f32s::<T>(-0.0) };
        assert_eq!(v.to_bits_u32(), want.to_bits_u32(), "{} y[{j}]", T::NAME);
    }
    // eps = 0: q = 0, r = 0, inv = 1/0 = inf, 0 · inf = NaN, for every element.
    let (_, y) = fused(&ranks, &residual, &w, 0.0, hidden);
    assert!(y.iter().all(|v| v.is_nan()), "{}: 0/0 must be NaN", T::NAME);
    assert_same(&y, &ref_norm_row(&h[..hidden], &w, 0.0).repeat(2), "y, eps 0");
    // -0.0 passes as eps and acts as +0.
    let (_, y) = fused(&ranks, &residual, &w, -0.0, hidden);
    assert!(y.iter().all(|v| v.is_nan()));
}

#[test]
fn zeros_all_dtypes() {
    zeros::<f32>();
    zeros::<f16>();
    zeros::<bf16>();
}

fn non_finite_inputs<T: Element>(seed: u64) {
    let mut rng = SplitMix64(seed);
    let (rows, hidden) = (3, 4096);
    let n = rows * hidden;
    let mut ranks: Vec<Vec<T>> = (0..4).map(|_| rng.values(n)).collect();
    let residual: Vec<T> = rng.values(n);
    let w: Vec<T> = rng.values(hidden);
    let (_, clean_y) = fused(&ranks, &residual, &w, 1e-6, hidden);
    // Row 0: a NaN in one rank. Row 1: +inf in one rank. Row 2 untouched.
    ranks[2][17] = f32s(f32::NAN);
    ranks[1][hidden + 3000] = f32s(f32::INFINITY);
    let (h, y) = fused(&ranks, &residual, &w, 1e-6, hidden);
    assert!(h[17].is_nan());
    assert!(y[..hidden].iter().all(|v| v.is_nan()), "{}: a NaN makes the whole row NaN", T::NAME);
    // inf: q = inf, inv = +0: y = NaN (inf · 0) at the inf, ±0 elsewhere.
    assert_eq!(h[hidden + 3000].to_f32_exact(), f32::INFINITY);
    for (j, v) in y[hidden..2 * hidden].iter().enumerate() {
        if j == 3000 {
            assert!(v.is_nan(), "{}: inf · 0 must be NaN", T::NAME);
        } else {
            assert_eq!(v.to_f32_exact(), 0.0, "{} y[1, {j}]", T::NAME);
            let sign = (h[hidden + j].to_f32_exact().is_sign_negative()) != w[j].to_f32_exact().is_sign_negative();
            assert_eq!(v.to_f32_exact().is_sign_negative(), sign, "{} y[1, {j}]: sign of the zero", T::NAME);
        }
    }
    assert_same(&y[hidden..2 * hidden], &ref_norm_row(&h[hidden..2 * hidden], &w, 1e-6), "y, row with inf");
    assert_same(&y[2 * hidden..], &clean_y[2 * hidden..], "y, clean row");
    // +inf and -inf in one element: their sum is NaN, so the row is NaN.
    ranks[0][2 * hidden + 5] = f32s(f32::INFINITY);
    ranks[3][2 * hidden + 5] = f32s(f32::NEG_INFINITY);
    let (h, y) = fused(&ranks, &residual, &w, 1e-6, hidden);
    assert!(h[2 * hidden + 5].is_nan());
    assert!(y[2 * hidden..].iter().all(|v| v.is_nan()));
}

#[test]
fn non_finite_inputs_all_dtypes() {
    non_finite_inputs::<f32>(50);
    non_finite_inputs::<f16>(51);
    non_finite_inputs::<bf16>(52);
}

#[test]
fn f16_overflow_in_h_is_inf() {
    let hidden = 9;
    let big: f16 = f32s(60000.0);
    let one: f16 = f32s(1.0);
    // Element 2: residual + s overflows (60000 + 60000); element 5: the tree itself does
    // (60000 + 60000 in the rank tree), and residual + inf stays inf.
    let mut x0 = vec![one; hidden];
    let mut x1 = vec![f32s::<f16>(0.0); hidden];
    let mut residual = vec![one; hidden];
    x0[2] = big;
    residual[2] = big;
    x0[5] = big;
    x1[5] = big;
    let w = vec![one; hidden];
    let (h, y) = fused(&[x0, x1], &residual, &w, 1e-6, hidden);
    assert_eq!(h[2], f16::INFINITY);
    assert_eq!(h[5], f16::INFINITY);
    for (j, v) in y.iter().enumerate() {
        if j == 2 || j == 5 {
            assert!(v.is_nan(), "y[{j}] = {v}");
        } else {
            assert_eq!(v.to_bits(), 0, "y[{j}] = {v}: 2 · 0 = +0");
        }
    }
    assert_same(&y, &ref_norm_row(&h, &w, 1e-6), "y");
}

fn squares_overflow_f32<T: Element>() {
    // 2^64 is finite in f32 and bf16, and its square 2^128 overflows f32: q = inf, inv = +0,
    // so y = (h · 0) · w = ±0 for every finite h, the large ones included.
    let hidden = 4096;
    let mut h: Vec<T> = (0..hidden).map(|j| f32s(if j % 3 == 0 { -1.0 } else { 1.0 })).collect();
    h[100] = f32s(2f32.powi(64));
    h[2500] = f32s(-(2f32.powi(64)));
    let w: Vec<T> = (0..hidden).map(|j| f32s(if j % 5 == 0 { -2.0 } else { 0.5 })).collect();
    assert_eq!(sum_of_squares(&h), f32::INFINITY);
    let y = norm_row(&h, &w, 1e-6);
    for j in 0..hidden {
        let want = f32s::<T>(h[j].to_f32_exact() * 0.0 * w[j].to_f32_exact());
        assert_eq!(y[j].to_bits_u32(), want.to_bits_u32(), "{} y[{j}]", T::NAME);
    }
    assert_same(&y, &ref_norm_row(&h, &w, 1e-6), "y");
    // Finite squares whose sum overflows: eight of 2^63 (square 2^126) in one lane.
    let mut h2 = vec![f32s::<T>(1.0); hidden];
    for v in &mut h2[..8] {
        *v = f32s(2f32.powi(63));
    }
    assert_eq!(sum_of_squares(&h2), f32::INFINITY);
    assert!(norm_row(&h2, &w, 0.0).iter().all(|v| v.to_f32_exact() == 0.0));
    // An infinite weight times the zero is NaN, as the formula says.
    let mut w_inf = w.clone();
    w_inf[7] = f32s(f32::INFINITY);
    let y = norm_row(&h, &w_inf, 1e-6);
    assert!(y[7].is_nan());
    assert_same(&y, &ref_norm_row(&h, &w_inf, 1e-6), "y, infinite weight");
}

#[test]
fn squares_overflowing_f32_give_zero() {
    squares_overflow_f32::<f32>();
    squares_overflow_f32::<bf16>();
}

fn subnormals<T: Element>(smallest: f32, seed: u64) {
    let mut rng = SplitMix64(seed);
    let hidden = 2049;
    // Multiples of the smallest subnormal, some up to 1000 of them, both signs.
    let h: Vec<T> = (0..hidden).map(|_| f32s(smallest * ((rng.next() % 2001) as f32 - 1000.0))).collect();
    assert!(h.iter().filter(|v| v.to_f32_exact() != 0.0).count() > hidden / 2);
    let w: Vec<T> = rng.values(hidden);
    for eps in [1e-6f32, 1e-30, 0.0] {
        assert_same(&norm_row(&h, &w, eps), &ref_norm_row(&h, &w, eps), &format!("y, eps {eps}"));
    }
    // Subnormal h next to normal values: kept, not flushed.
    let mut mixed: Vec<T> = rng.values(hidden);
    mixed[3] = f32s(smallest);
    mixed[2048] = f32s(-smallest);
    let y = norm_row(&mixed, &w, 1e-6);
    assert_same(&y, &ref_norm_row(&mixed, &w, 1e-6), "y, mixed");
}

#[test]
fn subnormals_all_dtypes() {
    subnormals::<f32>(f32::from_bits(1), 60);
    subnormals::<f16>(2f32.powi(-24), 61);
    subnormals::<bf16>(f32::from_bits(0x0001_0000), 62); // 2^-133
}

#[test]
fn f32_subnormal_squares_underflow_to_zero() {
    // Every square of a f32 subnormal underflows to +0, so q = 0. With eps = 0, inv = inf and
    // y = h · inf · w: ±inf for nonzero h, NaN for zero h. With eps > 0 y is tiny and finite.
    let h = [f32::from_bits(1), -f32::from_bits(1000), 0.0, f32::from_bits(0x007f_ffff)];
    let w = [1.0f32, 1.0, 1.0, -1.0];
    assert_eq!(sum_of_squares(&h).to_bits(), 0);
    let y = norm_row(&h, &w, 0.0);
    assert_eq!(y[0], f32::INFINITY);
    assert_eq!(y[1], f32::NEG_INFINITY);
    assert!(y[2].is_nan());
    assert_eq!(y[3], f32::NEG_INFINITY);
    let y = norm_row(&h, &w, 1e-6);
    assert_same(&y, &ref_norm_row(&h, &w, 1e-6), "y, eps 1e-6");
    assert!(y.iter().all(|v| v.is_finite()));
}

// ---------------------------------------------------------------------------------------------
// Errors: every variant, checked before anything is written.

/// Calls `residual_rmsnorm` with outputs of `hn` and `yn` sentinels, expects an error, and
/// checks that no output was written.
fn fails(ranks: &[&[f32]], residual: &[f32], w: &[f32], eps: f32, shape: RmsNormShape, hn: usize, yn: usize) -> Error {
    const SENTINEL: f32 = 7.0;
    let (mut h, mut y) = (vec![SENTINEL; hn], vec![SENTINEL; yn]);
    let err = residual_rmsnorm(ranks, residual, w, eps, shape, &mut h, &mut y).unwrap_err();
    assert!(h.iter().chain(&y).all(|v| v.to_bits() == SENTINEL.to_bits()), "{err:?}: an output was written");
    assert!(!err.to_string().is_empty());
    err
}

#[test]
fn errors_leave_outputs_untouched() {
    let (rows, hidden) = (2, 8);
    let n = rows * hidden;
    let (xv, residual_v, wv) = (vec![1.0f32; n], vec![0.5f32; n], vec![1.0f32; hidden]);
    let (x, residual, w): (&[f32], &[f32], &[f32]) = (&xv, &residual_v, &wv);
    let short = &x[..n - 1];
    let shape = RmsNormShape { rows, hidden };
    let lm = |argument, expected, got| Error::LengthMismatch { argument, expected, got };
    // No ranks, too many ranks.
    assert_eq!(fails(&[], residual, w, 1e-6, shape, n, n), Error::UnsupportedWorldSize { world: 0 });
    let many = vec![x; MAX_WORLD_SIZE + 1];
    assert_eq!(fails(&many, residual, w, 1e-6, shape, n, n), Error::UnsupportedWorldSize { world: MAX_WORLD_SIZE + 1 });
    // Ranks of different lengths, or not rows * hidden.
    assert_eq!(fails(&[x, short], residual, w, 1e-6, shape, n, n), lm("ranks[r]", n, n - 1));
    assert_eq!(fails(&[short, short], residual, w, 1e-6, shape, n, n), lm("ranks[r]", n, n - 1));
    let wrong_rows = RmsNormShape { rows: 3, hidden };
    assert_eq!(fails(&[x], residual, w, 1e-6, wrong_rows, n, n), lm("ranks[r]", 3 * hidden, n));
    // residual, weight, h, y.
    assert_eq!(fails(&[x], short, w, 1e-6, shape, n, n), lm("residual", n, n - 1));
    assert_eq!(fails(&[x], residual, &w[..7], 1e-6, shape, n, n), lm("weight", hidden, 7));
    assert_eq!(fails(&[x], residual, x, 1e-6, shape, n, n), lm("weight", hidden, n));
    assert_eq!(fails(&[x], residual, w, 1e-6, shape, n + 1, n), lm("h", n, n + 1));
    assert_eq!(fails(&[x], residual, w, 1e-6, shape, n, n - 1), lm("y", n, n - 1));
    // hidden 0 and above 2^24 (the shape is checked first, with rows = 0 too).
    for bad in [0, RMSNORM_MAX_HIDDEN + 1] {
        for r in [0, rows] {
            let s = RmsNormShape { rows: r, hidden: bad };
            assert_eq!(fails(&[x], residual, w, 1e-6, s, n, n), Error::UnsupportedHidden { hidden: bad });
        }
    }
    // rows * hidden overflows usize.
    let huge = RmsNormShape { rows: usize::MAX / 2, hidden: 4 };
    assert_eq!(fails(&[x], residual, w, 1e-6, huge, n, n), Error::ShapeOverflow { rows: usize::MAX / 2, hidden: 4 });
    // eps NaN, infinite, negative.
    for eps in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1e-6, -f32::from_bits(1)] {
        assert_eq!(fails(&[x], residual, w, eps, shape, n, n), Error::InvalidEps { bits: eps.to_bits() });
    }
}

#[test]
fn rmsnorm_row_errors_leave_y_untouched() {
    let h = vec![1.0f32; 8];
    let w = vec![1.0f32; 8];
    let call = |h: &[f32], w: &[f32], eps: f32, yn: usize| {
        let mut y = vec![7.0f32; yn];
        let err = rmsnorm_row(h, w, eps, &mut y).unwrap_err();
        assert!(y.iter().all(|&v| v == 7.0), "{err:?}: y was written");
        err
    };
    assert_eq!(call(&[], &[], 1e-6, 0), Error::UnsupportedHidden { hidden: 0 });
    assert_eq!(call(&h, &w[..7], 1e-6, 8), Error::LengthMismatch { argument: "weight", expected: 8, got: 7 });
    assert_eq!(call(&h, &w, 1e-6, 9), Error::LengthMismatch { argument: "y", expected: 8, got: 9 });
    assert_eq!(call(&h, &w, f32::NAN, 8), Error::InvalidEps { bits: f32::NAN.to_bits() });
    assert_eq!(call(&h, &w, -1.0, 8), Error::InvalidEps { bits: (-1.0f32).to_bits() });
    // Too long a row (64 MiB of zeros); the length of h is checked first.
    let long = vec![0.0f32; RMSNORM_MAX_HIDDEN + 1];
    assert_eq!(call(&long, &w, 1e-6, 8), Error::UnsupportedHidden { hidden: RMSNORM_MAX_HIDDEN + 1 });
}

#[test]
fn zero_rows_is_ok_and_writes_nothing() {
    let empty: &[f32] = &[];
    let w = vec![1.0f32; 4];
    for hidden in [4, RMSNORM_MAX_HIDDEN] {
        let w = if hidden == 4 { w.clone() } else { vec![1.0f32; hidden] };
        let (mut h, mut y) = (Vec::<f32>::new(), Vec::<f32>::new());
        residual_rmsnorm(&[empty, empty], empty, &w, 1e-6, RmsNormShape { rows: 0, hidden }, &mut h, &mut y).unwrap();
    }
    assert_eq!(RmsNormShape { rows: 0, hidden: 4 }.elements(), Ok(0));
    assert_eq!(RmsNormShape { rows: 3, hidden: 4 }.elements(), Ok(12));
}
