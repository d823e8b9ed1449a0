//! The element types the layers take: a type the fixed tree reduces and collectives move, with
//! the exact widening to f32 and the one rounding back that every layer's math is written in.
use collective_core::Reducible;
use half::{bf16, f16};

/// `f32`, `half::bf16` or `half::f16`. All arithmetic of the layers is done in f32; a value is
/// rounded to `Self` (to nearest, ties to even) only where the layer stores it.
pub trait Scalar: Reducible {
    /// The exact value as f32 (every bf16 and f16 value is an f32 value).
    fn to_f32(self) -> f32;
    /// `v` rounded to `Self`, to nearest, ties to even.
    fn from_f32(v: f32) -> Self;
}

impl Scalar for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Scalar for bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Scalar for f16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
