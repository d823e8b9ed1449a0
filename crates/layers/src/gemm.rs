//! The GEMM the layers call, behind a trait, and its reference implementation in plain Rust.
//!
//! A layer is only as deterministic as its GEMM: the TP-invariance argument of [`crate::ffn`]
//! needs each leaf's product to be the same bits at every TP size, which holds when an output
//! element is a function of its row of `a` and column of `b` alone, evaluated in an order that
//! does not depend on `m` or `n`. [`ReferenceGemm`] is that; a GPU backend implementing
//! [`Gemm`] must give the same promise (a fixed split of the contraction, no split-k chosen
//! from the shape, no atomics) for the layers to stay invariant on it.
use crate::Scalar;
use crate::error::{Error, product, require};

/// `out = a · b`, all row-major: `a` is `m × k`, `b` is `k × n`, `out` is `m × n`.
///
/// Implementations must evaluate each output element in an order fixed by `k` alone (so that
/// the same row and column give the same bits whatever `m` and `n` are), and return a shape
/// error, with `out` untouched, when a slice's length is not what `m`, `k`, `n` say.
pub trait Gemm<T> {
    /// `out[i*n + j] = Σ_p a[i*k + p] · b[p*n + j]`, in the implementation's fixed order.
    fn gemm(&self, a: &[T], b: &[T], m: usize, k: usize, n: usize, out: &mut [T]) -> Result<(), Error>;
}

/// The reference GEMM: each output element is accumulated in f32 from `+0.0`, left to right over
/// the contraction index `p = 0, 1, …, k-1` (`acc = acc + a·b`, a separate f32 multiply and add:
/// Rust never fuses them into an FMA), and rounded once to `T` (nearest, ties to even).
///
/// For bf16 and f16 inputs each product is exact in f32 (8 + 8 and 11 + 11 significand bits fit
/// in 24), so the only roundings are the f32 adds, in that order, and the final one. The loop
/// runs `i, p, j` (a row of f32 accumulators, so the inner loop vectorises) but every element
/// still sees its adds in the order of `p`: vectorising across `j` does not reorder them.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceGemm;

impl<T: Scalar> Gemm<T> for ReferenceGemm {
    fn gemm(&self, a: &[T], b: &[T], m: usize, k: usize, n: usize, out: &mut [T]) -> Result<(), Error> {
        check_shapes(a.len(), b.len(), out.len(), m, k, n)?;
        if m == 0 || n == 0 {
            // Nothing to write. (With m = 0 the shapes allow any n, and the accumulator row
            // below is n wide: it is allocated only when `out` has at least that many elements.)
            return Ok(());
        }
        let mut acc = vec![0f32; n];
        for (row, out_row) in out.chunks_exact_mut(n).enumerate() {
            acc.fill(0.0);
            let a_row = &a[row * k..(row + 1) * k];
            for (p, &a_ip) in a_row.iter().enumerate() {
                let a_ip = a_ip.to_f32();
                for (s, &b_pj) in acc.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                    *s += a_ip * b_pj.to_f32();
                }
            }
            for (o, &s) in out_row.iter_mut().zip(&acc) {
                *o = T::from_f32(s);
            }
        }
        Ok(())
    }
}

/// The lengths a row-major `m × k` by `k × n` product needs, checked without overflow.
pub(crate) fn check_shapes(a: usize, b: usize, out: usize, m: usize, k: usize, n: usize) -> Result<(), Error> {
    for (what, len, dims) in [("a", a, [m, k]), ("b", b, [k, n]), ("out", out, [m, n])] {
        let want = product(what, &dims)?;
        require(len == want, || format!("gemm {m}x{k}x{n}: `{what}` has {len} elements, expected {want}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn small_product_and_one_rounding() {
        // [1 2; 3 4] · [5 6; 7 8] = [19 22; 43 50]
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [5.0f32, 6.0, 7.0, 8.0];
        let mut out = [0f32; 4];
        ReferenceGemm.gemm(&a, &b, 2, 2, 2, &mut out).unwrap();
        assert_eq!(out, [19.0, 22.0, 43.0, 50.0]);

        // 256 + 1 + 1 in bf16 adds would stay 256 (ulp 2 at 256); the f32 accumulator keeps 258.
        let a = [bf16::from_f32(256.0), bf16::ONE, bf16::ONE];
        let b = [bf16::ONE; 3];
        let mut out = [bf16::ZERO];
        ReferenceGemm.gemm(&a, &b, 1, 3, 1, &mut out).unwrap();
        assert_eq!(out[0].to_f32(), 258.0);
    }

    #[test]
    fn an_element_does_not_depend_on_n() {
        let a: Vec<f32> = (0..12).map(|i| 1.0 / (i as f32 + 1.5)).collect(); // 2 x 6
        let b: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect(); // 6 x 4
        let mut full = [0f32; 8];
        ReferenceGemm.gemm(&a, &b, 2, 6, 4, &mut full).unwrap();
        let col: Vec<f32> = (0..6).map(|p| b[p * 4 + 3]).collect();
        let mut one = [0f32; 2];
        ReferenceGemm.gemm(&a, &col, 2, 6, 1, &mut one).unwrap();
        assert_eq!([full[3].to_bits(), full[7].to_bits()], [one[0].to_bits(), one[1].to_bits()]);
    }

    #[test]
    fn wrong_lengths_are_refused_and_out_untouched() {
        let mut out = [7f32; 4];
        let err = ReferenceGemm.gemm(&[1.0f32; 3], &[1.0; 4], 2, 2, 2, &mut out).unwrap_err();
        assert!(matches!(err, Error::Shape(_)), "{err}");
        assert_eq!(out, [7.0; 4]);
    }
}
