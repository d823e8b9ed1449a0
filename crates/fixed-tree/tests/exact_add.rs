//! `Element::add` for `f16` and `bf16` against an independent exact reference.
//!
//! The reference never touches `f32`: it decodes both operands into `±integer · 2^exp`, adds them
//! exactly as integers, and rounds the exact sum to nearest, ties to even, into the target format
//! with its own code (subnormals, overflow to ±inf, the sign of an exact zero). Results are
//! compared by bit pattern; where the reference says NaN, only "is NaN" is checked (NaN payloads
//! are not part of the contract).
//!
//! The `exhaustive_*` tests (ignored by default) check all 2^32 operand pairs of a type; run them
//! in release mode: `cargo test --release -p fixed-tree --test exact_add -- --ignored`.
use fixed_tree::Element;
use half::{bf16, f16};

/// A binary interchange-style format with `exp_bits` exponent and `man_bits` fraction bits.
#[derive(Clone, Copy, Debug)]
struct Format {
    name: &'static str,
    exp_bits: u32,
    man_bits: u32,
}

const F16: Format = Format { name: "f16", exp_bits: 5, man_bits: 10 };
const BF16: Format = Format { name: "bf16", exp_bits: 8, man_bits: 7 };

impl Format {
    /// Precision in bits, hidden bit included.
    fn p(self) -> u32 {
        self.man_bits + 1
    }
    /// All-ones exponent field (inf / NaN).
    fn e_max_field(self) -> u16 {
        (1 << self.exp_bits) - 1
    }
    fn bias(self) -> i32 {
        (1 << (self.exp_bits - 1)) - 1
    }
    /// Exponent of the quantum (ulp) of subnormals, which is also that of the lowest normal binade.
    fn q_min(self) -> i32 {
        1 - self.bias() - self.man_bits as i32
    }
    fn sign_bit(self) -> u16 {
        1 << (self.exp_bits + self.man_bits)
    }
    fn man_mask(self) -> u16 {
        (1 << self.man_bits) - 1
    }
    fn inf(self, neg: bool) -> u16 {
        (if neg { self.sign_bit() } else { 0 }) | (self.e_max_field() << self.man_bits)
    }
    fn bits(self, neg: bool, e_field: u16, man: u16) -> u16 {
        assert!(e_field <= self.e_max_field() && man <= self.man_mask());
        (if neg { self.sign_bit() } else { 0 }) | (e_field << self.man_bits) | man
    }
    /// Largest finite magnitude.
    fn max_finite(self) -> u16 {
        self.bits(false, self.e_max_field() - 1, self.man_mask())
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Nan,
    Inf {
        neg: bool,
    },
    /// `(-1)^neg · mag · 2^exp`, exactly.
    Finite {
        neg: bool,
        mag: u128,
        exp: i32,
    },
}

fn decode(fmt: Format, bits: u16) -> Value {
    let neg = bits & fmt.sign_bit() != 0;
    let e = (bits >> fmt.man_bits) & fmt.e_max_field();
    let m = u128::from(bits & fmt.man_mask());
    if e == fmt.e_max_field() {
        if m != 0 { Value::Nan } else { Value::Inf { neg } }
    } else if e == 0 {
        Value::Finite { neg, mag: m, exp: fmt.q_min() }
    } else {
        Value::Finite { neg, mag: m | (1 << fmt.man_bits), exp: fmt.q_min() + i32::from(e) - 1 }
    }
}

/// Rounds `(-1)^neg · mag · 2^exp` to nearest, ties to even, into `fmt`.
///
/// `mag == 0` gives a zero with the sign `neg`. Requires `exp >= q_min - 1`, which every caller
/// meets, so that the shift below stays under 128.
fn round(fmt: Format, neg: bool, mag: u128, exp: i32) -> u16 {
    let sign = if neg { fmt.sign_bit() } else { 0 };
    if mag == 0 {
        return sign;
    }
    assert!(exp >= fmt.q_min() - 1);
    let p = fmt.p() as i32;
    // 2^top <= |value| < 2^(top + 1)
    let top = exp + (127 - mag.leading_zeros() as i32);
    // The quantum of the result: p bits below the top, but never finer than the subnormal quantum.
    let mut q = (top - (p - 1)).max(fmt.q_min());
    let mut kept = if q <= exp {
        mag << (exp - q) // exact
    } else {
        let shift = (q - exp) as u32;
        assert!(shift < 128);
        let kept = mag >> shift;
        let rem = mag & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        let up = rem > half || (rem == half && kept & 1 == 1);
        kept + u128::from(up)
    };
    if kept == 1 << p {
        // Rounded up into the next binade.
        kept >>= 1;
        q += 1;
    }
    assert!(kept < 1 << p);
    if kept < 1 << (p - 1) {
        // Subnormal (or the rounded-up carry handled above): only possible at the lowest quantum.
        assert_eq!(q, fmt.q_min());
        return sign | kept as u16;
    }
    let e_field = q - fmt.q_min() + 1;
    if e_field >= i32::from(fmt.e_max_field()) {
        return fmt.inf(neg);
    }
    sign | ((e_field as u16) << fmt.man_bits) | (kept as u16 & fmt.man_mask())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Expected {
    Nan,
    Bits(u16),
}

/// Exponent gap beyond which the smaller operand is replaced by a sticky half unit.
const GAP: i32 = 100;

/// The correctly rounded sum of two `fmt` values, computed with integers only.
fn exact_add(fmt: Format, a: u16, b: u16) -> Expected {
    let (x, y) = match (decode(fmt, a), decode(fmt, b)) {
        (Value::Nan, _) | (_, Value::Nan) => return Expected::Nan,
        (Value::Inf { neg: x }, Value::Inf { neg: y }) => {
            return if x == y { Expected::Bits(fmt.inf(x)) } else { Expected::Nan };
        }
        (Value::Inf { neg }, _) | (_, Value::Inf { neg }) => return Expected::Bits(fmt.inf(neg)),
        (x, y) => (x, y),
    };
    let (Value::Finite { neg: xn, mag: xm, exp: xe }, Value::Finite { neg: yn, mag: ym, exp: ye }) = (x, y) else {
        unreachable!()
    };
    if xm == 0 && ym == 0 {
        // Exact zero from zeros: -0 only for (-0) + (-0).
        return Expected::Bits(if xn && yn { fmt.sign_bit() } else { 0 });
    }
    if xm == 0 {
        return Expected::Bits(round(fmt, yn, ym, ye));
    }
    if ym == 0 {
        return Expected::Bits(round(fmt, xn, xm, xe));
    }
    let ((hn, hm, he), (ln, lm, le)) =
        if xe >= ye { ((xn, xm, xe), (yn, ym, ye)) } else { ((yn, ym, ye), (xn, xm, xe)) };
    let d = he - le;
    let (hm, lm, exp) = if d <= GAP {
        // |hm| < 2^11, so hm << 100 < 2^111: exact in i128.
        (hm << d, lm, le)
    } else {
        // The larger operand is normal (a subnormal one would have the smallest exponent), so it
        // is at least 2^(he + p - 1), and |lo| < 2^(le + p) <= u := 2^(he - GAP - 1 + p). Neither
        // a representable value nor a rounding midpoint (nor the overflow threshold) other than
        // `hi` itself lies within `u` of `hi` (they are all multiples of 2^(he - 2)), so `hi + lo`
        // rounds like `hi ± u/2`: represent that exactly, with a unit of u/2.
        let s = GAP + 2 - fmt.p() as i32;
        (hm << s, 1, he - s)
    };
    let signed = |neg: bool, m: u128| if neg { -(m as i128) } else { m as i128 };
    let sum = signed(hn, hm) + signed(ln, lm);
    if sum == 0 {
        // x + (-x) = +0 under round to nearest.
        return Expected::Bits(0);
    }
    Expected::Bits(round(fmt, sum < 0, sum.unsigned_abs(), exp))
}

/// The implementation under test, on bit patterns.
fn implementation_add(fmt: Format, a: u16, b: u16) -> u16 {
    match fmt.name {
        "f16" => Element::add(f16::from_bits(a), f16::from_bits(b)).to_bits(),
        "bf16" => Element::add(bf16::from_bits(a), bf16::from_bits(b)).to_bits(),
        _ => unreachable!(),
    }
}

fn is_nan(fmt: Format, bits: u16) -> bool {
    decode(fmt, bits) == Value::Nan
}

/// Returns a description of the mismatch, if any.
fn mismatch(fmt: Format, a: u16, b: u16) -> Option<String> {
    let got = implementation_add(fmt, a, b);
    let ok = match exact_add(fmt, a, b) {
        Expected::Nan => is_nan(fmt, got),
        Expected::Bits(want) => got == want,
    };
    (!ok).then(|| format!("{}: {a:#06x} + {b:#06x}: got {got:#06x}, want {:?}", fmt.name, exact_add(fmt, a, b)))
}

#[track_caller]
fn check(fmt: Format, a: u16, b: u16) {
    if let Some(m) = mismatch(fmt, a, b) {
        panic!("{m}");
    }
}

/// Checks `a + b` and `b + a`, and asserts an exact expected result computed by hand.
#[track_caller]
fn check_is(fmt: Format, a: u16, b: u16, want: u16) {
    assert_eq!(exact_add(fmt, a, b), Expected::Bits(want), "reference, {}: {a:#06x} + {b:#06x}", fmt.name);
    assert_eq!(implementation_add(fmt, a, b), want, "{}: {a:#06x} + {b:#06x}", fmt.name);
    assert_eq!(implementation_add(fmt, b, a), want, "{}: {b:#06x} + {a:#06x}", fmt.name);
}

#[track_caller]
fn check_is_nan(fmt: Format, a: u16, b: u16) {
    assert_eq!(exact_add(fmt, a, b), Expected::Nan);
    for (x, y) in [(a, b), (b, a)] {
        let got = implementation_add(fmt, x, y);
        assert!(is_nan(fmt, got), "{}: {x:#06x} + {y:#06x} = {got:#06x}, want NaN", fmt.name);
    }
}

/// A tiny deterministic xorshift64 generator.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bits16(&mut self) -> u16 {
        (self.next() >> 32) as u16
    }
}

// ---------------------------------------------------------------------------------------------
// The reference itself, on values whose sums are known by hand.

#[test]
fn reference_sanity() {
    // f16: 1.0 = 0x3c00, 2.0 = 0x4000, 0.5 = 0x3800, 65504 = 0x7bff, min subnormal 0x0001.
    assert_eq!(exact_add(F16, 0x3c00, 0x3c00), Expected::Bits(0x4000));
    assert_eq!(exact_add(F16, 0x3c00, 0x3800), Expected::Bits(0x3e00)); // 1.5
    assert_eq!(exact_add(F16, 0x3c00, 0xbc00), Expected::Bits(0x0000));
    assert_eq!(exact_add(F16, 0x0001, 0x0001), Expected::Bits(0x0002));
    assert_eq!(exact_add(F16, 0x7bff, 0x7bff), Expected::Bits(0x7c00));
    assert_eq!(exact_add(F16, 0xfc00, 0x7c00), Expected::Nan);
    assert_eq!(F16.max_finite(), 0x7bff);
    // bf16: 1.0 = 0x3f80, 2.0 = 0x4000, max = 0x7f7f.
    assert_eq!(exact_add(BF16, 0x3f80, 0x3f80), Expected::Bits(0x4000));
    assert_eq!(exact_add(BF16, 0x7f7f, 0x7f7f), Expected::Bits(0x7f80));
    assert_eq!(exact_add(BF16, 0x0001, 0x8001), Expected::Bits(0x0000));
    assert_eq!(BF16.max_finite(), 0x7f7f);
    // Huge exponent gap (sticky path): max + min subnormal = max, 1 - tiny = 1.
    assert_eq!(exact_add(BF16, 0x7f7f, 0x0001), Expected::Bits(0x7f7f));
    assert_eq!(exact_add(BF16, 0x3f80, 0x8001), Expected::Bits(0x3f80));
}

// ---------------------------------------------------------------------------------------------
// Every exponent-field pair, several significands each, all four sign combinations.

fn exponent_classes(fmt: Format, seed: u64, randoms: usize) {
    let mut rng = XorShift(seed);
    let m = fmt.man_mask();
    let fixed = [0, 1, m, 1 << (fmt.man_bits - 1)];
    let mut failures = Vec::new();
    for ea in 0..fmt.e_max_field() {
        for eb in 0..fmt.e_max_field() {
            let mut sigs: Vec<u16> = fixed.to_vec();
            sigs.extend((0..randoms).map(|_| rng.bits16() & m));
            for &ma in &sigs {
                for &mb in &sigs {
                    for (na, nb) in [(false, false), (false, true), (true, false), (true, true)] {
                        let a = fmt.bits(na, ea, ma);
                        let b = fmt.bits(nb, eb, mb);
                        if let Some(f) = mismatch(fmt, a, b) {
                            failures.push(f);
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures, first: {:?}", failures.len(), &failures[..failures.len().min(10)]);
}

#[test]
fn f16_exponent_classes() {
    exponent_classes(F16, 0x1234_5678_9abc_def1, 4);
}

#[test]
fn bf16_exponent_classes() {
    exponent_classes(BF16, 0x0fed_cba9_8765_4321, 1);
}

// ---------------------------------------------------------------------------------------------
// Ties: sums exactly halfway between two neighbours.

fn ties(fmt: Format) {
    let mut count = 0;
    for e in 2..fmt.e_max_field() {
        // The value 2^(quantum exponent of binade e - 1) is half an ulp of binade e.
        let q = fmt.q_min() + i32::from(e) - 1;
        let half_ulp = round(fmt, false, 1, q - 1);
        let quarter_ulp = (q - 2 >= fmt.q_min()).then(|| round(fmt, false, 1, q - 2));
        for man in [0, 1, 2, 3, fmt.man_mask() - 1, fmt.man_mask()] {
            for neg in [false, true] {
                let s = if neg { fmt.sign_bit() } else { 0 };
                let a = fmt.bits(neg, e, man);
                // Away from zero: a + half ulp is halfway between a and next(a) (bits + 1, which
                // carries into the exponent or to inf as needed). Even significand stays, odd goes up.
                let up = if man % 2 == 0 { a } else { a + 1 };
                check_is(fmt, a, half_ulp | s, up);
                // Towards zero: a - half ulp is halfway between prev(a) and a, when prev(a) is in the
                // same binade (man >= 1). Odd significand goes down to the even neighbour.
                if man >= 1 {
                    let down = if man % 2 == 0 { a } else { a - 1 };
                    check_is(fmt, a, half_ulp | (s ^ fmt.sign_bit()), down);
                }
                // At the bottom of a binade, prev(a) is half an ulp below, and the midpoint a quarter
                // ulp below: it rounds to a (even), not to prev(a) (all-ones significand, odd).
                if let (0, Some(qu)) = (man, quarter_ulp) {
                    check_is(fmt, a, qu | (s ^ fmt.sign_bit()), a);
                }
                count += 1;
            }
        }
    }
    assert!(count > 100);
}

#[test]
fn f16_ties() {
    ties(F16);
    // Concrete: 1 + 2^-11 = 1 (even), (1 + 2^-10) + 2^-11 = 1 + 2^-9, 2048 + 1 = 2048, 2050 + 1 = 2052.
    check_is(F16, 0x3c00, 0x1000, 0x3c00);
    check_is(F16, 0x3c01, 0x1000, 0x3c02);
    check_is(F16, 0x6800, 0x3c00, 0x6800);
    check_is(F16, 0x6801, 0x3c00, 0x6802);
}

#[test]
fn bf16_ties() {
    ties(BF16);
    // 1 + 2^-8 = 1 (even); (1 + 2^-7) + 2^-8 = 1 + 2^-6; 256 + 1 = 256; 258 + 1 = 260.
    check_is(BF16, 0x3f80, 0x3b80, 0x3f80);
    check_is(BF16, 0x3f81, 0x3b80, 0x3f82);
    check_is(BF16, 0x4380, 0x3f80, 0x4380);
    check_is(BF16, 0x4381, 0x3f80, 0x4382);
}

// ---------------------------------------------------------------------------------------------
// Subnormals.

fn subnormals(fmt: Format, stride: usize) {
    let man = fmt.man_mask();
    // Positive subnormals add like integers, carry into the lowest normal binade included.
    for a in (0..=man).step_by(stride) {
        for b in 0..=man {
            check_is(fmt, a, b, a + b);
        }
    }
    // Differences of subnormals and small normals are exact, and subnormal when small.
    let min_normal = fmt.bits(false, 1, 0);
    check_is(fmt, min_normal, 0x0001 | fmt.sign_bit(), man);
    check_is(fmt, min_normal | fmt.sign_bit(), 0x0001, man | fmt.sign_bit());
    check_is(fmt, fmt.bits(false, 1, 5), fmt.bits(true, 1, 0), 5);
    check_is(fmt, fmt.bits(false, 2, 0), fmt.bits(true, 1, man), fmt.bits(false, 0, 1));
    // Every value with exponent field 0, 1 or 2 (both signs) against a sample of the same.
    let small: Vec<u16> = (0..(3u16 << fmt.man_bits)).collect();
    let mut rng = XorShift(0x5eed_5eed_5eed_5eed);
    let sample: Vec<u16> = (0..24).map(|_| small[rng.next() as usize % small.len()]).collect();
    for &a in &small {
        for &b in &sample {
            for s in [0, fmt.sign_bit()] {
                check(fmt, a | s, b);
                check(fmt, a | s, b | fmt.sign_bit());
            }
        }
    }
}

#[test]
fn f16_subnormals() {
    subnormals(F16, 7);
}

#[test]
fn bf16_subnormals() {
    subnormals(BF16, 1);
}

// ---------------------------------------------------------------------------------------------
// Zeros, infinities, NaNs.

fn signed_zeros(fmt: Format) {
    let (pz, nz) = (0, fmt.sign_bit());
    check_is(fmt, pz, pz, pz);
    check_is(fmt, pz, nz, pz);
    check_is(fmt, nz, nz, nz);
    let mut rng = XorShift(42);
    for _ in 0..2000 {
        let x = rng.bits16() & !fmt.sign_bit();
        if is_nan(fmt, x) || x == fmt.inf(false) {
            continue;
        }
        // x + (-x) = +0, for both orders and signs.
        check_is(fmt, x, x | fmt.sign_bit(), pz);
        // x + ±0 = x.
        for z in [pz, nz] {
            check_is(fmt, x, z, x);
            if x != 0 {
                check_is(fmt, x | fmt.sign_bit(), z, x | fmt.sign_bit());
            }
        }
    }
}

#[test]
fn f16_signed_zeros() {
    signed_zeros(F16);
}

#[test]
fn bf16_signed_zeros() {
    signed_zeros(BF16);
}

fn infinities_and_nans(fmt: Format) {
    let (pinf, ninf) = (fmt.inf(false), fmt.inf(true));
    check_is(fmt, pinf, pinf, pinf);
    check_is(fmt, ninf, ninf, ninf);
    check_is_nan(fmt, pinf, ninf);
    let max = fmt.max_finite();
    let finites = [0, fmt.sign_bit(), 1, max, max | fmt.sign_bit(), fmt.bits(false, 1, 0)];
    for x in finites {
        check_is(fmt, pinf, x, pinf);
        check_is(fmt, ninf, x, ninf);
    }
    // NaNs: quiet and signalling, both signs, several payloads.
    let exp = fmt.inf(false);
    let top = 1 << (fmt.man_bits - 1);
    let nans = [exp | top, exp | 1, exp | fmt.man_mask(), exp | top | 1, exp | 2];
    for n in nans {
        for nan in [n, n | fmt.sign_bit()] {
            assert!(is_nan(fmt, nan));
            for x in finites.into_iter().chain([pinf, ninf, nan, nans[0]]) {
                check_is_nan(fmt, nan, x);
            }
        }
    }
}

#[test]
fn f16_infinities_and_nans() {
    infinities_and_nans(F16);
}

#[test]
fn bf16_infinities_and_nans() {
    infinities_and_nans(BF16);
}

// ---------------------------------------------------------------------------------------------
// Overflow at max finite + half an ulp.

fn overflow(fmt: Format, half_ulp_of_max: u16, below_half_ulp: u16) {
    let max = fmt.max_finite();
    let s = fmt.sign_bit();
    // The tie at max + half ulp goes to the even neighbour, which is 2^(emax+1): inf.
    check_is(fmt, max, half_ulp_of_max, fmt.inf(false));
    check_is(fmt, max | s, half_ulp_of_max | s, fmt.inf(true));
    // Just below the threshold stays at max.
    check_is(fmt, max, below_half_ulp, max);
    check_is(fmt, max | s, below_half_ulp | s, max | s);
    // Far beyond the threshold.
    check_is(fmt, max, max, fmt.inf(false));
    check_is(fmt, max | s, max | s, fmt.inf(true));
    // One ulp below max (even significand) plus half an ulp: a tie that stays at the even value.
    check_is(fmt, max - 1, half_ulp_of_max, max - 1);
    // And differences never overflow.
    check_is(fmt, max, max | s, 0);
}

#[test]
fn f16_overflow() {
    // max = 65504, half ulp = 16 (0x4c00), largest below 16 = 15.9921875 (0x4bff).
    overflow(F16, 0x4c00, 0x4bff);
}

#[test]
fn bf16_overflow() {
    // max = (2 - 2^-7) 2^127, half ulp = 2^119 (0x7b00), largest below it 0x7aff.
    overflow(BF16, 0x7b00, 0x7aff);
}

// ---------------------------------------------------------------------------------------------
// Random pairs: uniform bit patterns, and pairs with nearby exponents (cancellation, ties).

fn random_pairs(fmt: Format, seed: u64, n: usize) {
    let mut rng = XorShift(seed);
    let mut failures = Vec::new();
    for i in 0..n {
        let a = rng.bits16();
        let b = if i % 2 == 0 {
            rng.bits16()
        } else {
            // Same sign-stripped exponent neighbourhood as a: flip a few low exponent bits.
            let r = rng.bits16();
            let exp_delta = (r & 0x7) << fmt.man_bits;
            (a ^ exp_delta ^ (r & fmt.man_mask())) ^ (r & fmt.sign_bit())
        };
        if let Some(f) = mismatch(fmt, a, b) {
            failures.push(f);
        }
    }
    assert!(failures.is_empty(), "{} failures, first: {:?}", failures.len(), &failures[..failures.len().min(10)]);
}

#[test]
fn f16_random_pairs() {
    random_pairs(F16, 0x9e37_79b9_7f4a_7c15, 1 << 20);
}

#[test]
fn bf16_random_pairs() {
    random_pairs(BF16, 0xd1b5_4a32_d192_ed03, 1 << 20);
}

// ---------------------------------------------------------------------------------------------
// Exhaustive: all 2^32 pairs. Ignored by default (minutes even in release mode).

fn exhaustive(fmt: Format) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(64);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut failures = Vec::new();
                    let mut a = t as u32;
                    while a <= 0xffff {
                        for b in 0..=0xffffu32 {
                            if let Some(f) = mismatch(fmt, a as u16, b as u16) {
                                failures.push(f);
                            }
                        }
                        a += threads as u32;
                    }
                    failures
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "{} failures, first: {:?}", failures.len(), &failures[..failures.len().min(10)]);
}

#[test]
#[ignore = "all 2^32 pairs: run in release mode"]
fn exhaustive_f16() {
    exhaustive(F16);
}

#[test]
#[ignore = "all 2^32 pairs: run in release mode"]
fn exhaustive_bf16() {
    exhaustive(BF16);
}
