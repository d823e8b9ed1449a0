//! Deterministic inputs and the fixed-tree reference on byte buffers.
use crate::DType;
use fixed_tree::Element;
use half::{bf16, f16};

/// A small deterministic generator (xorshift64*), so every rank can rebuild every rank's input.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03 | 1)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Finite values of mixed magnitude and sign: sums of them round differently under different
/// parenthesisations, so a wrong tree is caught; magnitudes keep 8-leaf sums finite.
pub fn finite_values(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        let r = rng.next_u64();
        let sign = (r >> 63) as u32;
        match dtype {
            DType::F32 => {
                let exp = 110 + (r >> 32) as u32 % 30;
                let bits = sign << 31 | exp << 23 | (r as u32 & 0x7F_FFFF);
                out.extend_from_slice(&bits.to_le_bytes());
            }
            DType::F16 => {
                let exp = 5 + (r >> 32) as u32 % 20;
                let bits = (sign << 15 | exp << 10 | (r as u32 & 0x3FF)) as u16;
                out.extend_from_slice(&bits.to_le_bytes());
            }
            DType::BF16 => {
                let exp = 110 + (r >> 32) as u32 % 30;
                let bits = (sign << 15 | exp << 7 | (r as u32 & 0x7F)) as u16;
                out.extend_from_slice(&bits.to_le_bytes());
            }
            other => out.extend_from_slice(&r.to_le_bytes()[..other.size()]),
        }
    }
    out
}

/// Special bit patterns of a reducible dtype: ±0, subnormals, normals at the edges, the
/// largest finite values (two of which overflow), ±inf, NaN, and values whose sums tie.
pub fn special_patterns(dtype: DType) -> Vec<u32> {
    match dtype {
        DType::F32 => vec![
            0x0000_0000,
            0x8000_0000,
            0x0000_0001,
            0x8000_0001,
            0x007F_FFFF,
            0x0080_0000,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_0000,
            0x3F80_0000,
            0x3380_0000,
            0x3F80_0001,
            0xBF80_0000,
            0x4B80_0001,
        ],
        DType::F16 => vec![
            0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x3C00, 0x1400,
            0x3C01, 0xBC00, 0x6401,
        ],
        DType::BF16 => vec![
            0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0x3F80, 0x3B80,
            0x3F81, 0xBF80, 0x4301,
        ],
        _ => vec![0],
    }
}

/// Rank `rank`'s input of `n` special values: patterns combined so that every pair of
/// specials meets in some element across ranks.
pub fn special_values(dtype: DType, n: usize, rank: usize) -> Vec<u8> {
    let p = special_patterns(dtype);
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let k = (i / p.len().pow(rank as u32 % 3) + i * rank + rank) % p.len();
        push_bits(&mut out, dtype, p[k]);
    }
    out
}

fn push_bits(out: &mut Vec<u8>, dtype: DType, bits: u32) {
    out.extend_from_slice(&bits.to_le_bytes()[..dtype.size()]);
}

/// Element `i` of a byte buffer of `dtype`, widened to u32 (reducible dtypes only).
pub fn bits_at(bytes: &[u8], dtype: DType, i: usize) -> u32 {
    let s = dtype.size();
    let mut w = [0u8; 4];
    w[..s].copy_from_slice(&bytes[i * s..(i + 1) * s]);
    u32::from_le_bytes(w)
}

fn decode<T: Element>(bytes: &[u8], dtype: DType) -> Vec<T> {
    (0..bytes.len() / dtype.size()).map(|i| T::from_bits_u32(bits_at(bytes, dtype, i))).collect()
}

fn encode<T: Element>(v: &[T], dtype: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * dtype.size());
    for x in v {
        push_bits(&mut out, dtype, x.to_bits_u32());
    }
    out
}

fn reduce_typed<T: Element>(ranks: &[Vec<u8>], dtype: DType) -> Vec<u8> {
    let typed: Vec<Vec<T>> = ranks.iter().map(|r| decode::<T>(r, dtype)).collect();
    let refs: Vec<&[T]> = typed.iter().map(|v| v.as_slice()).collect();
    let mut out = typed[0].clone();
    fixed_tree::reduce(&refs, &mut out).expect("suite builds valid reference inputs");
    encode(&out, dtype)
}

/// The fixed tree over every rank's bytes (all the same length), as bytes.
pub fn reference_reduce(ranks: &[Vec<u8>], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => reduce_typed::<f32>(ranks, dtype),
        DType::F16 => reduce_typed::<f16>(ranks, dtype),
        DType::BF16 => reduce_typed::<bf16>(ranks, dtype),
        other => panic!("{other} is not reducible"),
    }
}

fn cross_tp_typed<T: Element>(leaves: &[Vec<u8>], k: usize, dtype: DType) -> Vec<Vec<u8>> {
    let typed: Vec<Vec<T>> = leaves.iter().map(|r| decode::<T>(r, dtype)).collect();
    let refs: Vec<&[T]> = typed.iter().map(|v| v.as_slice()).collect();
    fixed_tree::cross_tp_leaves(&refs, k).expect("8 leaves, k in 1/2/4/8").iter().map(|v| encode(v, dtype)).collect()
}

/// Inputs of a TP=`k` group holding the trees of contiguous blocks of the 8 `leaves`.
pub fn cross_tp_inputs(leaves: &[Vec<u8>], k: usize, dtype: DType) -> Vec<Vec<u8>> {
    match dtype {
        DType::F32 => cross_tp_typed::<f32>(leaves, k, dtype),
        DType::F16 => cross_tp_typed::<f16>(leaves, k, dtype),
        DType::BF16 => cross_tp_typed::<bf16>(leaves, k, dtype),
        other => panic!("{other} is not reducible"),
    }
}

/// Compares `got` to `want` element by element: bits must match, except that a NaN reference
/// only requires a NaN result. Returns the first difference.
pub fn compare(got: &[u8], want: &[u8], dtype: DType) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("length {} bytes, expected {}", got.len(), want.len()));
    }
    // Equal bytes are equal bits (a memcmp; outputs of hundreds of MiB are compared).
    if got == want {
        return Ok(());
    }
    if !dtype.is_reducible() {
        return match got.iter().zip(want).position(|(g, w)| g != w) {
            None => Ok(()),
            Some(b) => Err(format!("byte {b} of {}: got {:#x}, expected {:#x}", want.len(), got[b], want[b])),
        };
    }
    let n = want.len() / dtype.size();
    for i in 0..n {
        let (g, w) = (bits_at(got, dtype, i), bits_at(want, dtype, i));
        if g == w {
            continue;
        }
        let both_nan = match dtype {
            DType::F32 => f32::from_bits(g).is_nan() && f32::from_bits(w).is_nan(),
            DType::F16 => f16::from_bits(g as u16).is_nan() && f16::from_bits(w as u16).is_nan(),
            DType::BF16 => bf16::from_bits(g as u16).is_nan() && bf16::from_bits(w as u16).is_nan(),
            _ => false,
        };
        if !both_nan {
            return Err(format!("element {i} of {n}: got bits {g:#x}, expected {w:#x}"));
        }
    }
    Ok(())
}
