//! `Element::to_f32_exact` and `Element::from_f32_rounded` against an independent integer
//! reference.
//!
//! `to_f32_exact` must be exact; `from_f32_rounded` must round to nearest, ties to even, with
//! subnormals, overflow to `±∞`, and NaN to a NaN (payloads are not part of the contract). The
//! reference decodes an f32 into `±integer · 2^exp` and rounds it with integer arithmetic only.
//!
//! The `exhaustive_*` test (ignored by default) checks all 2^32 f32 patterns for f16 and bf16;
//! run it in release mode: `cargo test --release -p fixed-tree --test convert -- --ignored`.
use fixed_tree::Element;
use half::{bf16, f16};

/// A narrow binary format: `exp_bits` exponent bits, `man_bits` fraction bits.
#[derive(Clone, Copy, Debug)]
struct Format {
    name: &'static str,
    exp_bits: u32,
    man_bits: u32,
}

const F16: Format = Format { name: "f16", exp_bits: 5, man_bits: 10 };
const BF16: Format = Format { name: "bf16", exp_bits: 8, man_bits: 7 };

impl Format {
    fn bias(self) -> i32 {
        (1 << (self.exp_bits - 1)) - 1
    }
    /// Exponent of the subnormal quantum.
    fn q_min(self) -> i32 {
        1 - self.bias() - self.man_bits as i32
    }
    fn sign_bit(self) -> u16 {
        1 << (self.exp_bits + self.man_bits)
    }
    fn e_all_ones(self) -> u16 {
        (1 << self.exp_bits) - 1
    }
    fn inf(self, neg: bool) -> u16 {
        (if neg { self.sign_bit() } else { 0 }) | (self.e_all_ones() << self.man_bits)
    }
    fn is_nan(self, bits: u16) -> bool {
        let e = (bits >> self.man_bits) & self.e_all_ones();
        e == self.e_all_ones() && bits & ((1 << self.man_bits) - 1) != 0
    }
}

/// The reference: `None` for NaN, otherwise the bits of `x` rounded to nearest even into `fmt`.
fn reference(fmt: Format, x: u32) -> Option<u16> {
    let neg = x >> 31 == 1;
    let sign = if neg { fmt.sign_bit() } else { 0 };
    let e = (x >> 23) & 0xff;
    let m = u128::from(x & 0x7f_ffff);
    if e == 0xff {
        return if m == 0 { Some(fmt.inf(neg)) } else { None };
    }
    // |x| = mag · 2^exp exactly.
    let (mag, exp) = if e == 0 { (m, -149) } else { (m | 1 << 23, e as i32 - 150) };
    if mag == 0 {
        return Some(sign);
    }
    let p = fmt.man_bits as i32 + 1;
    let top = exp + (127 - mag.leading_zeros() as i32); // 2^top <= |x| < 2^(top+1)
    let mut q = (top - (p - 1)).max(fmt.q_min()); // the result's quantum
    let mut kept = if q <= exp {
        mag << (exp - q)
    } else {
        let shift = (q - exp) as u32;
        if shift >= 127 {
            0 // far below half a quantum: mag < 2^24 <= 2^(shift - 1)
        } else {
            let kept = mag >> shift;
            let rem = mag & ((1u128 << shift) - 1);
            let half = 1u128 << (shift - 1);
            kept + u128::from(rem > half || (rem == half && kept & 1 == 1))
        }
    };
    if kept == 1 << p {
        kept >>= 1;
        q += 1;
    }
    if kept < 1 << (p - 1) {
        // Subnormal or zero: only at the lowest quantum.
        assert_eq!(q, fmt.q_min());
        return Some(sign | kept as u16);
    }
    let e_field = q - fmt.q_min() + 1;
    if e_field >= i32::from(fmt.e_all_ones()) {
        return Some(fmt.inf(neg));
    }
    Some(sign | (e_field as u16) << fmt.man_bits | (kept as u16 & ((1 << fmt.man_bits) - 1)))
}

fn implementation(fmt: Format, x: u32) -> u16 {
    let v = f32::from_bits(x);
    match fmt.name {
        "f16" => <f16 as Element>::from_f32_rounded(v).to_bits(),
        "bf16" => <bf16 as Element>::from_f32_rounded(v).to_bits(),
        _ => unreachable!(),
    }
}

fn mismatch(fmt: Format, x: u32) -> Option<String> {
    let got = implementation(fmt, x);
    let ok = match reference(fmt, x) {
        None => fmt.is_nan(got),
        Some(want) => got == want,
    };
    (!ok).then(|| format!("{}: from_f32_rounded({x:#010x}) = {got:#06x}, want {:?}", fmt.name, reference(fmt, x)))
}

#[track_caller]
fn check_all(fmt: Format, xs: impl IntoIterator<Item = u32>) -> usize {
    let mut count = 0;
    let mut failures = Vec::new();
    for x in xs {
        count += 1;
        if let Some(m) = mismatch(fmt, x) {
            failures.push(m);
        }
    }
    assert!(failures.is_empty(), "{} failures, first: {:?}", failures.len(), &failures[..failures.len().min(10)]);
    count
}

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[test]
fn reference_sanity() {
    // f16: 1.0 = 0x3c00, 65504 = 0x7bff; 65520 is the tie between 65504 and 2^16 (even): inf.
    assert_eq!(reference(F16, 1.0f32.to_bits()), Some(0x3c00));
    assert_eq!(reference(F16, 65504.0f32.to_bits()), Some(0x7bff));
    assert_eq!(reference(F16, 65519.996f32.to_bits()), Some(0x7bff));
    assert_eq!(reference(F16, 65520.0f32.to_bits()), Some(0x7c00));
    assert_eq!(reference(F16, (-65520.0f32).to_bits()), Some(0xfc00));
    // f16 smallest subnormal 2^-24; 2^-25 is a tie to the even zero; just above rounds up.
    assert_eq!(reference(F16, 2f32.powi(-24).to_bits()), Some(0x0001));
    assert_eq!(reference(F16, 2f32.powi(-25).to_bits()), Some(0x0000));
    assert_eq!(reference(F16, (-2f32.powi(-25)).to_bits()), Some(0x8000));
    assert_eq!(reference(F16, (2f32.powi(-25) * 1.0001).to_bits()), Some(0x0001));
    // 1.5 · 2^-24 is a tie between 1 and 2 subnormal quanta: to 2 (even).
    assert_eq!(reference(F16, (1.5 * 2f32.powi(-24)).to_bits()), Some(0x0002));
    // bf16: 1 + 2^-8 is a tie to 1 (even), 1 + 3·2^-8 to 1 + 2^-6; f32::MAX overflows.
    assert_eq!(reference(BF16, (1.0f32 + 2f32.powi(-8)).to_bits()), Some(0x3f80));
    assert_eq!(reference(BF16, (1.0f32 + 3.0 * 2f32.powi(-8)).to_bits()), Some(0x3f82));
    assert_eq!(reference(BF16, f32::MAX.to_bits()), Some(0x7f80));
    // f32 subnormals are bf16 subnormals (truncated to 7 fraction bits and rounded).
    assert_eq!(reference(BF16, 0x0001_0000), Some(0x0001));
    assert_eq!(reference(BF16, 0x0000_8000), Some(0x0000));
    assert_eq!(reference(BF16, 0x0001_8000), Some(0x0002));
    assert_eq!(reference(BF16, f32::NAN.to_bits()), None);
    assert_eq!(reference(F16, f32::NEG_INFINITY.to_bits()), Some(0xfc00));
}

/// `to_f32_exact` is exact: for every f16/bf16 pattern it equals the value decoded by hand (as f64,
/// exact), and `from_f32_rounded` gives the same pattern back. NaN widens to a NaN.
fn widen_all<T: Element>(fmt: Format) {
    let man_mask = (1u32 << fmt.man_bits) - 1;
    for bits in 0..=u16::MAX as u32 {
        let v = T::from_bits_u32(bits);
        let wide = v.to_f32_exact();
        let e = (bits >> fmt.man_bits) & u32::from(fmt.e_all_ones());
        let m = f64::from(bits & man_mask);
        let neg = bits & u32::from(fmt.sign_bit()) != 0;
        let expected = if e == u32::from(fmt.e_all_ones()) {
            if m == 0.0 { f64::INFINITY } else { f64::NAN }
        } else if e == 0 {
            m * 2f64.powi(fmt.q_min())
        } else {
            (m + f64::from(1u32 << fmt.man_bits)) * 2f64.powi(fmt.q_min() + e as i32 - 1)
        };
        let expected = if neg { -expected } else { expected };
        if expected.is_nan() {
            assert!(wide.is_nan(), "{}: {bits:#06x} widened to {wide}", fmt.name);
            assert!(T::from_f32_rounded(wide).is_nan());
            continue;
        }
        assert_eq!(wide.to_bits(), (expected as f32).to_bits(), "{}: {bits:#06x}", fmt.name);
        assert_eq!(f64::from(wide), expected, "{}: {bits:#06x} not exact", fmt.name);
        assert_eq!(T::from_f32_rounded(wide).to_bits_u32(), bits, "{}: {bits:#06x} round trip", fmt.name);
    }
}

#[test]
fn f16_widens_exactly() {
    widen_all::<f16>(F16);
}

#[test]
fn bf16_widens_exactly() {
    widen_all::<bf16>(BF16);
}

#[test]
fn f32_conversions_are_the_identity() {
    let mut rng = SplitMix64(3);
    for _ in 0..100_000 {
        let x = f32::from_bits(rng.next() as u32);
        assert_eq!(<f32 as Element>::from_f32_rounded(x).to_bits(), x.to_bits());
        assert_eq!(Element::to_f32_exact(x).to_bits(), x.to_bits());
    }
}

/// For every f32 exponent field, significands with a tie, and one unit either side of it, at
/// every rounding position (the position moves with the exponent in the subnormal range), odd
/// and even kept bits, both signs; plus fixed edge significands.
fn ties_everywhere(fmt: Format) {
    let mut rng = SplitMix64(0x7e57_0000 + u64::from(fmt.man_bits));
    let mut xs = Vec::new();
    for e in 0u32..=0xff {
        for k in 0..23 {
            for _ in 0..2 {
                let high = (rng.next() as u32) & 0x7f_ffff & !((2 << k) - 1);
                for low in [1u32 << k, (1 << k) - 1, (1 << k) + 1, 0] {
                    for odd in [0, 2 << k] {
                        let m = (high ^ odd) & 0x7f_ffff | (low & 0x7f_ffff);
                        for s in [0, 1u32 << 31] {
                            xs.push(s | e << 23 | m);
                        }
                    }
                }
            }
        }
        for m in [0, 1, 0x7f_ffff, 0x40_0000, 0x7f_e000, 0x7f_f000, 0x00_1000, 0x00_8000] {
            xs.push(e << 23 | m);
            xs.push(1 << 31 | e << 23 | m);
        }
    }
    assert!(check_all(fmt, xs) > 100_000);
}

#[test]
fn f16_from_f32_ties_subnormals_overflow() {
    ties_everywhere(F16);
}

#[test]
fn bf16_from_f32_ties_subnormals_overflow() {
    ties_everywhere(BF16);
}

#[test]
fn from_f32_random_patterns() {
    for fmt in [F16, BF16] {
        let mut rng = SplitMix64(0x5eed + u64::from(fmt.exp_bits));
        check_all(fmt, (0..1_000_000).map(|_| rng.next() as u32));
    }
}

#[test]
fn from_f32_specials() {
    for fmt in [F16, BF16] {
        let xs = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::NAN,
            -f32::NAN,
        ];
        check_all(fmt, xs.iter().map(|x| x.to_bits()));
        // NaNs whose payload sits only in the low bits that the conversion drops.
        check_all(fmt, [0x7f80_0001, 0xff80_0001, 0x7f80_1000, 0x7fc0_0000, 0x7f80_ffff]);
    }
}

#[test]
#[ignore = "all 2^32 f32 patterns; run with --release"]
fn exhaustive_from_f32() {
    for fmt in [F16, BF16] {
        check_all(fmt, 0..=u32::MAX);
    }
}
