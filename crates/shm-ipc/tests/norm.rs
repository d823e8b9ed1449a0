//! The host device's residual add + RMSNorm (`NormDevice for HostDevice`) is
//! `fixed_tree::residual_rmsnorm`, bit for bit: every dtype, hidden sizes around the kernel's
//! vector and chunk (8, 2048), several rows, special values, and the outputs aliasing the
//! inputs exactly.
use collective_core::{DType, Error};
use detcoll_protocol::{NormArgs, NormDevice, RawStream};
use fixed_tree::{Element, RmsNormShape};
use half::{bf16, f16};
use shm_ipc::HostDevice;

/// splitmix64: a deterministic stream of test values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-range, range).
    fn uniform(&mut self, range: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * range
    }
}

/// One value of row `row`: every fourth row mixes in zeros, NaN, infinities, subnormals and
/// values whose squares overflow f32; the others are finite and moderate.
fn value<T: Element>(rng: &mut Rng, row: usize) -> T {
    if row % 4 == 3 {
        let smallest = T::from_bits_u32(1 + (rng.next() % 3) as u32);
        let specials = [
            T::from_f32_rounded(0.0),
            T::from_f32_rounded(-0.0),
            T::from_f32_rounded(f32::NAN),
            T::from_f32_rounded(f32::INFINITY),
            T::from_f32_rounded(f32::NEG_INFINITY),
            smallest,
            // Squares overflow f32 (for f16 the largest finite values, whose sums may overflow).
            T::from_f32_rounded(if T::NAME == "f16" { 65504.0 } else { 3.0e30 }),
        ];
        let r = rng.next();
        if r % 16 < specials.len() as u64 {
            return specials[(r % 16) as usize];
        }
    }
    T::from_f32_rounded(rng.uniform(4.0))
}

fn same<T: Element>(a: T, b: T) -> bool {
    a.to_bits_u32() == b.to_bits_u32() || (a.is_nan() && b.is_nan())
}

fn assert_same<T: Element>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(same(*g, *w), "{what}: element {j}: got {:#x}, reference {:#x}", g.to_bits_u32(), w.to_bits_u32());
    }
}

#[derive(Debug, Clone, Copy)]
enum Alias {
    None,
    HIsSum,
    YIsResidual,
    HIsResidualYIsSum,
}

fn check<T: Element>(dtype: DType, rows: usize, hidden: usize, alias: Alias, seed: u64) {
    let mut rng = Rng(seed);
    let n = rows * hidden;
    let sum0: Vec<T> = (0..n).map(|i| value(&mut rng, i / hidden)).collect();
    let residual0: Vec<T> = (0..n).map(|i| value(&mut rng, i / hidden)).collect();
    let weight: Vec<T> = (0..hidden).map(|_| T::from_f32_rounded(rng.uniform(2.0))).collect();
    let eps = [0.0, 1e-6, 1e-5][(seed % 3) as usize];
    let zero = T::from_f32_rounded(0.0);
    let (mut want_h, mut want_y) = (vec![zero; n], vec![zero; n]);
    let shape = RmsNormShape { rows, hidden };
    fixed_tree::residual_rmsnorm(&[&sum0], &residual0, &weight, eps, shape, &mut want_h, &mut want_y).unwrap();

    let (mut sum, mut residual) = (sum0.clone(), residual0.clone());
    let (mut h, mut y) = (vec![zero; n], vec![zero; n]);
    let addr = |v: &mut Vec<T>| v.as_mut_ptr() as u64;
    let (s, r, ha, ya) = (addr(&mut sum), addr(&mut residual), addr(&mut h), addr(&mut y));
    let (h_at, y_at) = match alias {
        Alias::None => (ha, ya),
        Alias::HIsSum => (s, ya),
        Alias::YIsResidual => (ha, r),
        Alias::HIsResidualYIsSum => (r, s),
    };
    let args =
        NormArgs { sum: s, residual: r, weight: weight.as_ptr() as u64, h: h_at, y: y_at, rows, hidden, eps, dtype };
    // SAFETY: host buffers of `n` (`hidden` for weight) elements, alive and not otherwise
    // accessed during the call (a host stream runs it to completion before returning).
    unsafe { HostDevice::threads().residual_rmsnorm(&args, RawStream(core::ptr::null_mut())) }.unwrap();

    let what = |out: &str| format!("{} rows {rows} hidden {hidden} {alias:?}: {out}", T::NAME);
    let pick = |at: u64| {
        if at == s {
            &sum
        } else if at == r {
            &residual
        } else if at == ha {
            &h
        } else {
            &y
        }
    };
    assert_same(&what("h"), pick(h_at), &want_h);
    assert_same(&what("y"), pick(y_at), &want_y);
    // An input no output aliases is untouched.
    if h_at != s && y_at != s {
        assert_same(&what("sum"), &sum, &sum0);
    }
    if h_at != r && y_at != r {
        assert_same(&what("residual"), &residual, &residual0);
    }
}

fn every_shape<T: Element>(dtype: DType) {
    let mut seed = 1u64;
    for hidden in [1, 7, 8, 2049, 4096] {
        for rows in [1, 3, 17] {
            for alias in [Alias::None, Alias::HIsSum, Alias::YIsResidual, Alias::HIsResidualYIsSum] {
                check::<T>(dtype, rows, hidden, alias, seed);
                seed += 1;
            }
        }
    }
}

#[test]
fn host_norm_is_the_reference_f32() {
    every_shape::<f32>(DType::F32);
}

#[test]
fn host_norm_is_the_reference_f16() {
    every_shape::<f16>(DType::F16);
}

#[test]
fn host_norm_is_the_reference_bf16() {
    every_shape::<bf16>(DType::BF16);
}

#[test]
fn host_norm_refuses_bad_arguments_before_writing() {
    let device = HostDevice::threads();
    let (sum, residual, weight) = (vec![1.0f32; 16], vec![2.0f32; 16], vec![1.0f32; 8]);
    let (mut h, mut y) = (vec![0.0f32; 16], vec![0.0f32; 16]);
    let args = NormArgs {
        sum: sum.as_ptr() as u64,
        residual: residual.as_ptr() as u64,
        weight: weight.as_ptr() as u64,
        h: h.as_mut_ptr() as u64,
        y: y.as_mut_ptr() as u64,
        rows: 2,
        hidden: 8,
        eps: 0.0,
        dtype: DType::F32,
    };
    let run = |a: NormArgs| {
        // SAFETY: the buffers above hold what `a` claims (or `pack` refuses `a` first).
        unsafe { device.residual_rmsnorm(&a, RawStream(core::ptr::null_mut())) }
    };
    assert!(matches!(run(NormArgs { hidden: 0, ..args }), Err(Error::InvalidConfig { .. })));
    assert!(matches!(run(NormArgs { eps: f32::NAN, ..args }), Err(Error::InvalidConfig { .. })));
    assert!(matches!(run(NormArgs { y: args.h + 4, ..args }), Err(Error::Overlap { .. })));
    assert!(matches!(run(NormArgs { h: args.h + 2, ..args }), Err(Error::Misaligned { argument: "h", .. })));
    assert!(matches!(run(NormArgs { dtype: DType::U8, ..args }), Err(Error::UnsupportedDtype { .. })));
    run(NormArgs { rows: 0, ..args }).unwrap();
    assert!(h.iter().chain(&y).all(|v| *v == 0.0), "a refused or empty call wrote");
    // h = 3, mean(h^2) = 9, inv = 1/3 rounded, y = f32(3 * f32(1/3)) = 1.
    run(args).unwrap();
    assert!(h.iter().all(|v| *v == 3.0) && y.iter().all(|v| *v == 1.0), "{h:?} {y:?}");
}
