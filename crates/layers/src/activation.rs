//! The FFN's activation: SiLU, `x · sigmoid(x) = x / (1 + e^(-x))`, in f32.
//!
//! Elementwise, so no reduction order is involved: the bits depend only on the input value and
//! the f32 operations below (negate, `f32::exp`, add, divide), none of them fused or
//! approximated. `f32::exp` is the platform's `expf` (not correctly rounded in general, but a
//! fixed function on a given build), so the bits are the same at every TP size, on every rank,
//! every run; a GPU backend must use an `expf` with the same results to match the CPU bits.
use crate::Scalar;

/// SiLU of one f32 value: `x / (1 + exp(-x))`. Finite inputs give finite outputs (below about
/// -88, `exp(-x)` overflows to infinity and the result is `-0`); `-inf` gives NaN (`-inf / inf`).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SiLU applied in place: each element widened to f32, [`silu`], rounded once to `T`.
pub fn silu_in_place<T: Scalar>(values: &mut [T]) {
    for v in values {
        *v = T::from_f32(silu(v.to_f32()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((silu(-1.0) + 0.268_941_4).abs() < 1e-6);
        assert_eq!(silu(100.0), 100.0);
        assert_eq!(silu(-200.0), -0.0);
    }
}
