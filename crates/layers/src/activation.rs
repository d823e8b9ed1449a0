//! The FFN's activation: SiLU, `x · sigmoid(x) = x / (1 + e^(-x))`, in f32, and the gated
//! form of Llama, Mistral and Qwen (SwiGLU): `SiLU(gate) · up`.
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

/// SwiGLU's activation of one element: [`silu`] of `gate` rounded once to `T`, then that value
/// times `up` in f32, rounded once to `T` — what `F.silu(gate) * up` computes on tensors of
/// `T` in PyTorch (each op widens to f32 and rounds its result), and what the GPU kernel
/// evaluates. For bf16 the f32 product of two bf16 values is exact, so the one rounding is the
/// product's correct rounding.
#[inline]
pub fn silu_mul<T: Scalar>(gate: T, up: T) -> T {
    let activated = T::from_f32(silu(gate.to_f32()));
    T::from_f32(activated.to_f32() * up.to_f32())
}

/// [`silu_mul`] in place over `gate`, element by element with `up` (the same length).
///
/// # Panics
///
/// If the lengths differ (the layer passes buffers of one shape).
pub fn silu_mul_in_place<T: Scalar>(gate: &mut [T], up: &[T]) {
    assert_eq!(gate.len(), up.len(), "silu_mul_in_place: gate and up differ in length");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu_mul(*g, u);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// The gated activation rounds twice: SiLU to `T`, then the product to `T` (not the f32
    /// SiLU times `up`, rounded once). At gate 0.5 and up 3.0 the two orders give different
    /// bf16 values (0.9296875 against 0.93359375).
    #[test]
    fn silu_mul_rounds_the_silu_to_the_dtype_first() {
        let (g, u) = (bf16::from_f32(0.5), bf16::from_f32(3.0));
        let once = bf16::from_f32(silu(0.5) * 3.0);
        let twice = bf16::from_f32(bf16::from_f32(silu(0.5)).to_f32() * 3.0);
        assert_eq!(twice.to_f32(), 0.929_687_5);
        assert_ne!(once.to_bits(), twice.to_bits(), "the example does not tell the orders apart");
        assert_eq!(silu_mul(g, u).to_bits(), twice.to_bits());
        let mut gate = vec![g, bf16::from_f32(-2.0), bf16::ZERO];
        silu_mul_in_place(&mut gate, &[u, bf16::from_f32(0.5), bf16::from_f32(7.0)]);
        let want = [twice, bf16::from_f32(bf16::from_f32(silu(-2.0)).to_f32() * 0.5), bf16::ZERO];
        assert_eq!(gate.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.map(|v| v.to_bits()).to_vec());
        // f32: SiLU then one f32 multiply.
        assert_eq!(silu_mul(1.5f32, -2.0).to_bits(), (silu(1.5) * -2.0).to_bits());
    }

    #[test]
    fn known_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((silu(-1.0) + 0.268_941_4).abs() < 1e-6);
        assert_eq!(silu(100.0), 100.0);
        assert_eq!(silu(-200.0), -0.0);
    }
}
