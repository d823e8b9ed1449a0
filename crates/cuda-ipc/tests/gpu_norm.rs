//! The residual add + RMSNorm kernel (`detcoll_residual_rmsnorm`, `NormDevice for CudaDevice`)
//! against its definition, `fixed_tree::residual_rmsnorm`, bit for bit (any NaN equals any
//! NaN): f32, f16 and bf16; hidden sizes around the kernel's vector (8), block (256) and chunk
//! (2048) and its paths (vector with h in registers, vector streaming, scalar: misaligned
//! tensors and odd sizes); rows up to 64 and beyond the grid limit; adversarial rows (zeros, NaN, infinities,
//! subnormals, values whose squares overflow); the outputs aliasing the inputs exactly; and
//! batch invariance (a row computed alone is the same row of a batch).
//! Without a GPU each test prints "skipped: no CUDA device".
mod common;

use collective_core::DType;
use common::Cuda;
use cuda_ipc::{CudaDevice, Device, NormArgs, NormDevice, RawStream};
use fixed_tree::{Element, RmsNormShape};
use gpu_conformance::{TestGpu, gpu, gpu_lock};
use half::{bf16, f16};
use std::sync::Arc;

type Stream = Arc<cuda_ipc::cudarc::driver::CudaStream>;

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
    fn sign(&mut self) -> f32 {
        if self.next() & 1 == 0 { 1.0 } else { -1.0 }
    }
}

/// One value of a row of `kind` (0..8): moderate values, a mix of specials, zeros, huge values
/// (squares overflow f32; for f16 the largest finite ones, whose adds may overflow), subnormals
/// only, and a wide dynamic range.
fn value<T: Element>(rng: &mut Rng, kind: usize) -> T {
    let huge = if T::NAME == "f16" { 65504.0 } else { 3.0e30 };
    match kind {
        3 => {
            let specials = [
                T::from_f32_rounded(0.0),
                T::from_f32_rounded(-0.0),
                T::from_f32_rounded(f32::NAN),
                T::from_f32_rounded(f32::INFINITY),
                T::from_f32_rounded(f32::NEG_INFINITY),
                T::from_bits_u32(1 + (rng.next() % 3) as u32),
                T::from_f32_rounded(huge),
            ];
            let r = rng.next();
            if r % 16 < specials.len() as u64 {
                specials[(r % 16) as usize]
            } else {
                T::from_f32_rounded(rng.uniform(4.0))
            }
        }
        4 => T::from_f32_rounded(if rng.next() & 1 == 0 { 0.0 } else { -0.0 }),
        5 => T::from_f32_rounded(rng.sign() * huge * (0.5 + rng.uniform(0.25))),
        6 => {
            // Subnormals of T (f32: 23 mantissa bits, f16: 10, bf16: 7), either sign.
            let bits = if T::SIZE == 4 {
                23
            } else if T::NAME == "f16" {
                10
            } else {
                7
            };
            let man = 1 + (rng.next() % ((1 << bits) - 1)) as u32;
            let sign = if rng.next() & 1 == 0 { 0 } else { 1u32 << (8 * T::SIZE as u32 - 1) };
            T::from_bits_u32(sign | man)
        }
        7 => {
            let e = (rng.next() % 41) as i32 - 20;
            T::from_f32_rounded(rng.uniform(1.0) * 2f32.powi(e))
        }
        _ => T::from_f32_rounded(rng.uniform(4.0)),
    }
}

fn to_bytes<T: Element>(v: &[T]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits_u32().to_le_bytes()[..T::SIZE].to_vec()).collect()
}

fn from_bytes<T: Element>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(T::SIZE)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..T::SIZE].copy_from_slice(c);
            T::from_bits_u32(u32::from_le_bytes(w))
        })
        .collect()
}

fn assert_same<T: Element>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<usize> = (0..got.len())
        .filter(|&j| got[j].to_bits_u32() != want[j].to_bits_u32() && !(got[j].is_nan() && want[j].is_nan()))
        .collect();
    if let Some(&j) = bad.first() {
        panic!(
            "{what}: {} of {} elements differ; first at {j}: kernel {:#x}, reference {:#x}",
            bad.len(),
            got.len(),
            got[j].to_bits_u32(),
            want[j].to_bits_u32()
        );
    }
}

/// Device buffers of the five tensors, large enough for every case.
struct Bufs {
    device: CudaDevice,
    stream: Stream,
    sum: u64,
    residual: u64,
    weight: u64,
    h: u64,
    y: u64,
    _owned: Vec<<CudaDevice as Device>::Allocation>,
}

impl Bufs {
    fn new(device: CudaDevice, bytes: usize) -> Bufs {
        let stream = Cuda::new_stream(&device).expect("stream");
        let owned: Vec<_> = (0..5).map(|_| device.alloc(bytes).expect("cuMemAlloc")).collect();
        let a: Vec<u64> = owned.iter().map(|x| device.address(x)).collect();
        Bufs { sum: a[0], residual: a[1], weight: a[2], h: a[3], y: a[4], device, stream, _owned: owned }
    }

    fn raw(&self) -> RawStream {
        self.device.raw_stream(&self.stream).expect("raw stream")
    }

    /// Runs one launch and waits for it.
    fn run(&self, args: &NormArgs) {
        // SAFETY: every address of `args` lies in this struct's allocations with the sizes the
        // callers set up, which outlive the synchronisation below; the stream is this device's.
        unsafe { self.device.residual_rmsnorm(args, self.raw()) }.unwrap_or_else(|e| panic!("{args:?}: {e}"));
        Cuda::synchronize(&self.stream).expect("synchronize");
    }

    fn upload<T: Element>(&self, dst: u64, v: &[T]) {
        Cuda::upload(&self.stream, dst, &to_bytes(v)).expect("upload");
    }

    fn download<T: Element>(&self, src: u64, n: usize) -> Vec<T> {
        let mut b = vec![0u8; n * T::SIZE];
        Cuda::download(&self.stream, src, &mut b).expect("download");
        from_bytes(&b)
    }

    /// Fills `n` elements at `dst` with a sentinel, so an element the kernel does not write
    /// shows up as a difference.
    fn poison(&self, dst: u64, n: usize, elem: usize) {
        Cuda::upload(&self.stream, dst, &vec![0xA5; n * elem]).expect("poison");
    }
}

const MAX_BYTES: usize = 16 << 20;

fn open() -> Option<Bufs> {
    let device = gpu::<Cuda>()?;
    Some(Bufs::new(device, MAX_BYTES))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Alias {
    None,
    HIsSum,
    YIsResidual,
    HIsResidualYIsSum,
}

const ALIASES: [Alias; 4] = [Alias::None, Alias::HIsSum, Alias::YIsResidual, Alias::HIsResidualYIsSum];

struct Case<T> {
    sum: Vec<T>,
    residual: Vec<T>,
    weight: Vec<T>,
    eps: f32,
    h: Vec<T>,
    y: Vec<T>,
}

/// Random inputs of `rows x hidden` and their reference outputs.
fn case<T: Element>(rows: usize, hidden: usize, seed: u64) -> Case<T> {
    let mut rng = Rng(seed);
    let n = rows * hidden;
    let kind = |i: usize| (i / hidden + seed as usize) % 8;
    let sum: Vec<T> = (0..n).map(|i| value(&mut rng, kind(i))).collect();
    let residual: Vec<T> = (0..n).map(|i| value(&mut rng, kind(i))).collect();
    let weight: Vec<T> = (0..hidden).map(|_| T::from_f32_rounded(rng.uniform(2.0))).collect();
    let eps = [0.0, 1e-6, 1e-5][(seed % 3) as usize];
    let zero = T::from_f32_rounded(0.0);
    let (mut h, mut y) = (vec![zero; n], vec![zero; n]);
    let shape = RmsNormShape { rows, hidden };
    fixed_tree::residual_rmsnorm(&[&sum], &residual, &weight, eps, shape, &mut h, &mut y).expect("reference");
    Case { sum, residual, weight, eps, h, y }
}

fn check<T: Element>(b: &Bufs, dtype: DType, rows: usize, hidden: usize, alias: Alias, c: &Case<T>) {
    check_at(b, dtype, rows, hidden, alias, [0; 5], c);
}

/// [`check`] with the tensors at byte offsets `[sum, residual, weight, h, y]` into their
/// allocations (an offset that is not a multiple of 16 bytes takes the kernel's scalar path).
fn check_at<T: Element>(
    b: &Bufs,
    dtype: DType,
    rows: usize,
    hidden: usize,
    alias: Alias,
    offsets: [u64; 5],
    c: &Case<T>,
) {
    let n = rows * hidden;
    assert!(n * T::SIZE + offsets.iter().max().copied().unwrap_or(0) as usize <= MAX_BYTES);
    let (sum, residual, weight) = (b.sum + offsets[0], b.residual + offsets[1], b.weight + offsets[2]);
    b.upload(sum, &c.sum);
    b.upload(residual, &c.residual);
    b.upload(weight, &c.weight);
    let (h, y) = match alias {
        Alias::None => (b.h + offsets[3], b.y + offsets[4]),
        Alias::HIsSum => (sum, b.y + offsets[4]),
        Alias::YIsResidual => (b.h + offsets[3], residual),
        Alias::HIsResidualYIsSum => (residual, sum),
    };
    // The outputs that are not inputs start as a sentinel: an element the kernel does not
    // write shows up as a difference.
    for out in [h, y] {
        if out != sum && out != residual {
            b.poison(out, n, T::SIZE);
        }
    }
    let args = NormArgs { sum, residual, weight, h, y, rows, hidden, eps: c.eps, dtype };
    b.run(&args);
    let what = |out: &str| {
        format!("{} rows {rows} hidden {hidden} eps {} {alias:?} offsets {offsets:?}: {out}", T::NAME, c.eps)
    };
    assert_same(&what("h"), &b.download::<T>(h, n), &c.h);
    assert_same(&what("y"), &b.download::<T>(y, n), &c.y);
    if alias == Alias::None {
        assert_same(&what("sum (input)"), &b.download::<T>(sum, n), &c.sum);
        assert_same(&what("residual (input)"), &b.download::<T>(residual, n), &c.residual);
    }
}

fn every_shape<T: Element>(dtype: DType) {
    let Some(b) = open() else { return };
    let _g = gpu_lock();
    let mut seed = 0x5eed_u64 + dtype as u64 * 1000;
    // Around the vector (8), the chunk (2048), the rows kept in registers (4096 f32, 8192
    // f16/bf16) and beyond them (the streaming vector path: 6144 for f32, 16384 for all).
    for hidden in [1, 7, 8, 255, 2048, 2049, 4096, 6144, 8192, 16384, 5123] {
        for rows in [1, 2, 5, 64] {
            let c = case::<T>(rows, hidden, seed);
            for alias in ALIASES {
                check(&b, dtype, rows, hidden, alias, &c);
            }
            seed += 1;
        }
    }
    println!("{}: every shape and aliasing equals fixed_tree::residual_rmsnorm", T::NAME);
}

/// Tensors one element (or 8 bytes) off a 16-byte boundary, one at a time and all together,
/// with a `hidden` the vector path would take (a multiple of 8; in registers or streamed):
/// the launch takes the scalar path, with the same bits. An offset of 16 bytes keeps the
/// vector path.
fn misaligned<T: Element>(dtype: DType) {
    let Some(b) = open() else { return };
    let _g = gpu_lock();
    let e = T::SIZE as u64;
    for (k, (rows, hidden)) in [(5usize, 8usize), (3, 4096), (2, 16384)].into_iter().enumerate() {
        let c = case::<T>(rows, hidden, 0xa11 + dtype as u64 * 100 + k as u64);
        let mut offsets: Vec<[u64; 5]> = (0..5)
            .map(|i| {
                let mut o = [0; 5];
                o[i] = e;
                o
            })
            .collect();
        offsets.extend([[e; 5], [8; 5], [16; 5], [16, 0, 32, 48, 16]]);
        for o in offsets {
            check_at(&b, dtype, rows, hidden, Alias::None, o, &c);
        }
        // Exact aliasing at an offset: the outputs share the inputs' (mis)alignment.
        for alias in [Alias::HIsSum, Alias::HIsResidualYIsSum] {
            check_at(&b, dtype, rows, hidden, alias, [e; 5], &c);
        }
    }
    println!("{}: misaligned tensors (the scalar path) equal fixed_tree::residual_rmsnorm", T::NAME);
}

#[test]
fn misaligned_tensors_are_the_reference_f32() {
    misaligned::<f32>(DType::F32);
}

#[test]
fn misaligned_tensors_are_the_reference_f16() {
    misaligned::<f16>(DType::F16);
}

#[test]
fn misaligned_tensors_are_the_reference_bf16() {
    misaligned::<bf16>(DType::BF16);
}

#[test]
fn norm_kernel_is_the_reference_f32() {
    every_shape::<f32>(DType::F32);
}

#[test]
fn norm_kernel_is_the_reference_f16() {
    every_shape::<f16>(DType::F16);
}

#[test]
fn norm_kernel_is_the_reference_bf16() {
    every_shape::<bf16>(DType::BF16);
}

/// Row `i` computed alone (rows = 1, the tensors offset to row `i`) has the bits of row `i` of
/// the batch of 64, for every row.
fn batch_invariance<T: Element>(dtype: DType) {
    let Some(b) = open() else { return };
    let _g = gpu_lock();
    let rows = 64;
    for (k, hidden) in [7usize, 2049, 4096, 5123, 16384].into_iter().enumerate() {
        let c = case::<T>(rows, hidden, 77 + k as u64);
        let n = rows * hidden;
        b.upload(b.sum, &c.sum);
        b.upload(b.residual, &c.residual);
        b.upload(b.weight, &c.weight);
        let batch = NormArgs {
            sum: b.sum,
            residual: b.residual,
            weight: b.weight,
            h: b.h,
            y: b.y,
            rows,
            hidden,
            eps: c.eps,
            dtype,
        };
        b.run(&batch);
        let (bh, by) = (b.download::<T>(b.h, n), b.download::<T>(b.y, n));
        b.poison(b.h, n, T::SIZE);
        b.poison(b.y, n, T::SIZE);
        for i in 0..rows {
            let off = (i * hidden * T::SIZE) as u64;
            let alone =
                NormArgs { sum: b.sum + off, residual: b.residual + off, h: b.h + off, y: b.y + off, rows: 1, ..batch };
            b.run(&alone);
        }
        let (ah, ay) = (b.download::<T>(b.h, n), b.download::<T>(b.y, n));
        let what = |out: &str| format!("{} hidden {hidden}: {out} of rows alone vs the batch", T::NAME);
        assert_same(&what("h"), &ah, &bh);
        assert_same(&what("y"), &ay, &by);
        assert_same(&what("y (reference)"), &by, &c.y);
    }
}

#[test]
fn a_row_alone_equals_the_row_in_a_batch_f32() {
    batch_invariance::<f32>(DType::F32);
}

#[test]
fn a_row_alone_equals_the_row_in_a_batch_f16() {
    batch_invariance::<f16>(DType::F16);
}

#[test]
fn a_row_alone_equals_the_row_in_a_batch_bf16() {
    batch_invariance::<bf16>(DType::BF16);
}

/// More rows than one launch has blocks (65535): the blocks stride over the rest.
#[test]
fn rows_beyond_the_grid_limit() {
    let Some(b) = open() else { return };
    let _g = gpu_lock();
    for (hidden, rows) in [(1usize, 70_000usize), (8, 66_000), (33, 65_537)] {
        assert!(rows * hidden * 4 <= MAX_BYTES);
        let c = case::<f32>(rows, hidden, 9 + hidden as u64);
        check(&b, DType::F32, rows, hidden, Alias::None, &c);
        let c = case::<bf16>(rows, hidden, 10 + hidden as u64);
        check(&b, DType::BF16, rows, hidden, Alias::YIsResidual, &c);
    }
}

/// Zero rows enqueue nothing; refused arguments are typed errors before any launch.
#[test]
fn empty_and_refused_calls() {
    let Some(b) = open() else { return };
    let _g = gpu_lock();
    b.poison(b.h, 16, 4);
    let args = NormArgs {
        sum: b.sum,
        residual: b.residual,
        weight: b.weight,
        h: b.h,
        y: b.y,
        rows: 0,
        hidden: 16,
        eps: 0.0,
        dtype: DType::F32,
    };
    b.run(&args);
    assert!(b.download::<f32>(b.h, 16).iter().all(|v| v.to_bits() == 0xA5A5_A5A5), "rows = 0 wrote");
    for bad in [
        NormArgs { rows: 1, hidden: 0, ..args },
        NormArgs { rows: 1, y: b.h, ..args },
        NormArgs { rows: 1, eps: -1.0, ..args },
    ] {
        // SAFETY: refused by the checks before any launch (asserted).
        let r = unsafe { b.device.residual_rmsnorm(&bad, b.raw()) };
        assert!(r.is_err(), "{bad:?} was accepted");
    }
}
