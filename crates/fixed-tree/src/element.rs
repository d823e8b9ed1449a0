//! The element types a reduction is defined for, and their one add.
//!
//! Every add is IEEE 754 addition in the element's own type, rounded to nearest, ties to even:
//! no wider accumulator, no fused operation, no flush to zero. A NaN result is only promised to
//! be *a* NaN: its payload, sign and quiet bit are not part of the contract.
//!
//! # `f16` and `bf16`: one `f32` add, then one rounding, is the exact `T` add
//!
//! [`Element::add`] for `T` = `f16` or `bf16` widens both operands to `f32`, adds in `f32`, and
//! rounds the `f32` sum to `T`. This returns `∘T(a + b)`, the exact sum rounded once: the bits an
//! adder working natively in `T` returns. Notation: `T` has precision p (11 bits for f16, 8 for
//! bf16, hidden bit included), f32 has q = 24; `∘T` and `∘32` round to nearest, ties to even;
//! `s = a + b` is the exact, unrounded sum of two `T` values.
//!
//! 1. **Specials.** Widening is exact for every value (f16 and bf16 are subsets of f32), so the
//!    f32 add sees `a` and `b` themselves, and IEEE 754 gives: NaN if an operand is NaN, and for
//!    `∞ + (−∞)`; `±∞` if an operand is `±∞`; for an exact zero sum, `−0` only for
//!    `(−0) + (−0)`, otherwise `+0` (so `x + (−x) = +0`); and `x + (±0) = x`. Narrowing maps
//!    `±0` and `±∞` to themselves and any NaN to a NaN. All that remains is finite nonzero `s`.
//! 2. **Subnormal results are exact.** Every finite `T` value is an integer multiple of `T`'s
//!    smallest subnormal, `2^-24` for f16 and `2^-133` for bf16, and so is `s`. If `|s|` is
//!    below `T`'s smallest normal, `s` is therefore itself a `T` subnormal; it is also an f32
//!    value, and both roundings return it unchanged. (The same fact means a nonzero `s` never
//!    rounds to zero.)
//! 3. **Normal results: double rounding is innocuous.** Otherwise `|s|` is at least `T`'s
//!    smallest normal (`2^-14`, `2^-126`), which is normal in f32 too, so up to overflow (item 4)
//!    `∘32` and `∘T` act as roundings to q and p bits with unbounded exponent. Double rounding
//!    can only differ from one rounding if `∘32(s)` lands exactly on a midpoint between two
//!    consecutive `T` values while `s` is not on it (a midpoint has p + 1 <= 24 bits, so it is an
//!    f32 value, and the monotone `∘32` can never carry `s` across it). Figueroa proved that
//!    this cannot happen for a sum, difference, product, quotient or square root of p-bit
//!    values as soon as **q >= 2p + 2** (S. A. Figueroa, "When is double rounding innocuous?",
//!    ACM SIGNUM Newsletter 30(3), 1995). Here q = 24 >= 2·11 + 2 = 24 for f16 (exactly on the
//!    bound) and 24 >= 2·8 + 2 = 18 for bf16, so `∘T(∘32(s)) = ∘T(s)`.
//! 4. **Overflow.** `∘T` returns `±∞` exactly when the unbounded-exponent rounding of item 3
//!    reaches `2^(emax+1)`, i.e. when `|s| >= MAX + ulp(MAX)/2` (at that tie the even neighbour
//!    is `2^(emax+1)`, since `MAX` has an odd significand). So the overflow decision is a
//!    function of the unbounded rounding, and item 3 carries over. It remains to check that
//!    `∘32` itself does not overflow where `∘T` would not: for f16, `|s| <= 2·65504` is far
//!    inside f32's range; for bf16 (which has f32's exponent range) `|s|` can reach f32's own
//!    overflow threshold `(2 − 2^-24)·2^127`, but that lies above bf16's `(2 − 2^-8)·2^127`,
//!    so whenever `∘32(s) = ±∞` the exact `∘T(s)` is `±∞` as well.
//!
//! The conversions used are correctly rounded: `half`'s `f16::from_f32` and `bf16::from_f32`
//! round to nearest even (in software, or with the F16C / FP16 conversion instructions, which do
//! the same), and Rust's `f32` add is IEEE 754 binary32 addition without flush to zero.
//!
//! `tests/exact_add.rs` checks this against an integer reference that never uses f32 (every
//! exponent-field pair, ties, subnormals, signed zeros, specials, the overflow boundary, random
//! pairs); its ignored `exhaustive_*` tests check all 2^32 operand pairs of each type
//! (`cargo test --release -p fixed-tree --test exact_add -- --ignored`).
//!
//! # Conversions to and from `f32`
//!
//! The fused residual + RMSNorm reference ([`crate::rmsnorm`]) computes in `f32` and rounds its
//! output to `T` once, so `Element` also carries the two conversions:
//!
//! * [`Element::to_f32_exact`] widens exactly: every f16 and bf16 value (subnormals, `±0`, `±∞`
//!   included) is an f32 value. A NaN stays a NaN (`half` sets the quiet bit of a bf16 NaN;
//!   payloads are not part of the contract anyway).
//! * [`Element::from_f32_rounded`] rounds to nearest, ties to even, with gradual underflow and
//!   overflow to `±∞`; it is the identity for `f32`. This is what `half` 2.7's conversions do:
//!   - `bf16::from_f32` is always software: it keeps the top 16 bits and adds one when the
//!     round bit is set and a lower (sticky) bit or the last kept bit is set, i.e. ties to even.
//!     A carry ripples into the exponent field, up to the infinity pattern `0x7f80` (overflow);
//!     bf16 has f32's exponent range, so f32 subnormals round to bf16 subnormals by the same
//!     rule. A NaN keeps its sign and high payload and gets the quiet bit, so a payload confined
//!     to the dropped bits cannot turn it into `∞`.
//!   - `f16::from_f32` uses the F16C `vcvtps2ph` instruction with `_MM_FROUND_TO_NEAREST_INT`
//!     (x86, detected at run time), `fcvt` under the default FPCR (aarch64 with FP16), or the
//!     software `f32_to_f16_fallback`: all round to nearest even, produce f16 subnormals
//!     (round bit / sticky bit at the subnormal quantum), return a signed zero at or below half
//!     the smallest subnormal (`2^-25` is a tie, to the even zero; every f32 subnormal is far
//!     below), overflow to `±∞` from
//!     `65504 + 16 = 65520` (the tie rounds to the even neighbour, `2^16`) up, and map NaN to
//!     a NaN.
//!
//! `tests/convert.rs` checks both against an integer reference (every f16/bf16 pattern; ties,
//! subnormals, the overflow boundary and random f32 patterns; all 2^32 f32 patterns in its
//! ignored `exhaustive_*` test).
use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A floating-point type the fixed tree reduces: `f32`, `half::f16`, `half::bf16`.
pub trait Element: Copy + PartialEq + core::fmt::Debug + Send + Sync + 'static + sealed::Sealed {
    /// Lower-case dtype name (`"f32"`, `"f16"`, `"bf16"`).
    const NAME: &'static str;
    /// Size in bytes.
    const SIZE: usize;
    /// One add, in `Self`, rounded to nearest even. No fused ops, no flush to zero.
    fn add(self, rhs: Self) -> Self;
    /// The bit pattern, widened to u32, for bitwise comparison.
    fn to_bits_u32(self) -> u32;
    /// The value with this bit pattern (the low `8 * SIZE` bits of `bits`).
    fn from_bits_u32(bits: u32) -> Self;
    /// Whether the value is a NaN (NaN payloads are not part of the contract).
    fn is_nan(self) -> bool;
    /// The value as an `f32`: exact (f16 and bf16 are subsets of f32); a NaN stays a NaN.
    ///
    /// Not named `to_f32`: traits built on `Element` (`detcoll_layers::Scalar`) have their own
    /// `to_f32`, and one name on both would make every call on a generic `T` ambiguous.
    fn to_f32_exact(self) -> f32;
    /// `v` rounded to `Self`, to nearest, ties to even, with subnormals and overflow to `±∞`
    /// (the identity for `f32`); a NaN gives a NaN. See the [module docs](self) for why `half`'s
    /// conversions are this rounding. (Not `from_f32`, for the reason given at
    /// [`Element::to_f32_exact`].)
    fn from_f32_rounded(v: f32) -> Self;
}

impl Element for f32 {
    const NAME: &'static str = "f32";
    const SIZE: usize = 4;
    #[inline]
    fn add(self, rhs: Self) -> Self {
        self + rhs
    }
    #[inline]
    fn to_bits_u32(self) -> u32 {
        self.to_bits()
    }
    #[inline]
    fn from_bits_u32(bits: u32) -> Self {
        f32::from_bits(bits)
    }
    #[inline]
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    #[inline]
    fn to_f32_exact(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32_rounded(v: f32) -> Self {
        v
    }
}

impl Element for f16 {
    const NAME: &'static str = "f16";
    const SIZE: usize = 2;
    #[inline]
    fn add(self, rhs: Self) -> Self {
        // Exact by the argument in the module docs; `from_f32` rounds to nearest even.
        f16::from_f32(self.to_f32() + rhs.to_f32())
    }
    #[inline]
    fn to_bits_u32(self) -> u32 {
        u32::from(self.to_bits())
    }
    #[inline]
    fn from_bits_u32(bits: u32) -> Self {
        f16::from_bits(bits as u16)
    }
    #[inline]
    fn is_nan(self) -> bool {
        f16::is_nan(self)
    }
    #[inline]
    fn to_f32_exact(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn from_f32_rounded(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Element for bf16 {
    const NAME: &'static str = "bf16";
    const SIZE: usize = 2;
    #[inline]
    fn add(self, rhs: Self) -> Self {
        bf16::from_f32(self.to_f32() + rhs.to_f32())
    }
    #[inline]
    fn to_bits_u32(self) -> u32 {
        u32::from(self.to_bits())
    }
    #[inline]
    fn from_bits_u32(bits: u32) -> Self {
        bf16::from_bits(bits as u16)
    }
    #[inline]
    fn is_nan(self) -> bool {
        bf16::is_nan(self)
    }
    #[inline]
    fn to_f32_exact(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn from_f32_rounded(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
