//! The canonical tree over rows of raw bytes: `fixed-tree` on the element type a [`DType`]
//! names. Rows arrive as unaligned byte vectors from the bootstrap, so elements are decoded
//! and encoded little-endian (the host order of every platform detcoll builds for).
use collective_core::{DType, Error};
use half::{bf16, f16};

/// `out = tree(rows[0][at..], ..., rows[W-1][at..])` over `out.len() / size` elements of
/// `dtype`, element offset `at` in every row.
pub(crate) fn reduce_rows(dtype: DType, rows: &[&[u8]], at: usize, out: &mut [u8]) -> Result<(), Error> {
    match dtype {
        DType::F32 => typed(rows, at, out, f32::from_le_bytes, f32::to_le_bytes),
        DType::F16 => typed(rows, at, out, f16::from_le_bytes, f16::to_le_bytes),
        DType::BF16 => typed(rows, at, out, bf16::from_le_bytes, bf16::to_le_bytes),
        other => Err(Error::InvalidConfig { detail: format!("the host transport cannot reduce {other}") }),
    }
}

fn typed<T: fixed_tree::Element, const N: usize>(
    rows: &[&[u8]],
    at: usize,
    out: &mut [u8],
    decode: impl Fn([u8; N]) -> T,
    encode: impl Fn(T) -> [u8; N],
) -> Result<(), Error> {
    let count = out.len() / N;
    let span = (at * N)..((at + count) * N);
    let decoded: Vec<Vec<T>> = rows
        .iter()
        .map(|r| r[span.clone()].chunks_exact(N).map(|c| decode(c.try_into().unwrap_or([0; N]))).collect())
        .collect();
    let views: Vec<&[T]> = decoded.iter().map(Vec::as_slice).collect();
    let mut sum = vec![decode([0; N]); count];
    fixed_tree::reduce(&views, &mut sum)
        .map_err(|e| Error::InvalidConfig { detail: format!("the host transport's tree: {e}") })?;
    for (dst, x) in out.chunks_exact_mut(N).zip(sum) {
        dst.copy_from_slice(&encode(x));
    }
    Ok(())
}
