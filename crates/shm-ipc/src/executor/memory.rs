//! Raw access to the addresses a launch carries (every rank's control block and frames, the
//! caller's buffers, the error record): the host's counterparts of the kernels' loads, stores,
//! LL lines and 16-byte vectors (`kernels/detcoll_tree.h`).
//!
//! # Safety (for every function here)
//! Addresses come from a packed launch: the group's live staging (alive while any handle of
//! the world is), the error record of the launching rank, and caller views validated by the
//! engine. Control words are 8-byte aligned and only ever accessed atomically; frame and caller
//! bytes are plain memory whose hand-over between ranks the protocol's flags order
//! (release/acquire), exactly as on the GPU.
use collective_core::DType;
use detcoll_protocol::params::MAX_WORLD;
use half::{bf16, f16};
use std::sync::atomic::{AtomicU64, Ordering};

/// The control word at `addr`.
///
/// # Safety
/// `addr` is an 8-aligned control word of a live staging or error record.
pub(super) unsafe fn word<'a>(addr: u64) -> &'a AtomicU64 {
    // SAFETY: the caller's promise; AtomicU64 has the layout of u64.
    unsafe { &*(addr as *const AtomicU64) }
}

/// Copies `n` bytes (`memmove`: an in-place self gather copies a range onto itself).
///
/// # Safety
/// Both ranges are valid for `n` bytes.
pub(super) unsafe fn copy(dst: u64, src: u64, n: u64) {
    if n == 0 || dst == src {
        return;
    }
    // SAFETY: the caller's promise.
    unsafe { core::ptr::copy(src as *const u8, dst as *mut u8, n as usize) };
}

/// A 16-byte vector: the payload of one LL line (`dc_u32x4`).
pub(super) type Vec16 = [u8; 16];

/// The first `n` (<= 16) bytes at `p`, zero-padded (`dc_load16`).
///
/// # Safety
/// `p` is valid for `n` bytes.
pub(super) unsafe fn load16(p: u64, n: u64) -> Vec16 {
    let mut v = [0u8; 16];
    // SAFETY: the caller's promise; `n <= 16`.
    unsafe { core::ptr::copy_nonoverlapping(p as *const u8, v.as_mut_ptr(), n.min(16) as usize) };
    v
}

/// The first `n` (<= 16) bytes of `v` to `p` (`dc_store16`).
///
/// # Safety
/// `p` is valid for `n` bytes.
pub(super) unsafe fn store16(p: u64, v: &Vec16, n: u64) {
    // SAFETY: the caller's promise; `n <= 16`.
    unsafe { core::ptr::copy_nonoverlapping(v.as_ptr(), p as *mut u8, n.min(16) as usize) };
}

/// Writes `v` as one LL line at `line`: four words, each `flag << 32 | 4 payload bytes`
/// (`dc_ll_store`; one atomic word carries its own flag, so relaxed stores suffice).
///
/// # Safety
/// `line` is a 32-byte LL line of a live control block.
pub(super) unsafe fn ll_store(line: u64, v: &Vec16, flag: u32) {
    let f = u64::from(flag) << 32;
    for i in 0..4 {
        let payload = u32::from_le_bytes([v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]]);
        // SAFETY: word i of the line (the caller's promise).
        unsafe { word(line + 8 * i as u64) }.store(f | u64::from(payload), Ordering::Relaxed);
    }
}

/// The payload of the LL line at `line` if all four of its words carry `flag` (`dc_ll_load`).
///
/// # Safety
/// As [`ll_store`].
pub(super) unsafe fn ll_load(line: u64, flag: u32) -> Option<Vec16> {
    let mut v = [0u8; 16];
    for i in 0..4 {
        // SAFETY: word i of the line (the caller's promise).
        let w = unsafe { word(line + 8 * i as u64) }.load(Ordering::Relaxed);
        if (w >> 32) as u32 != flag {
            return None;
        }
        v[4 * i..4 * i + 4].copy_from_slice(&(w as u32).to_le_bytes());
    }
    Some(v)
}

/// `dst[i] = tree(src[0][i], ..., src[W-1][i])` over `bytes` bytes of `dtype` (the kernel
/// header's dtype code), each source and the destination any byte address. Sources may alias
/// the destination (an in-place call's own leaf): every element is read before it is written.
///
/// # Safety
/// Every source is valid for `bytes` reads and `dst` for `bytes` writes.
pub(crate) unsafe fn tree(dtype: u32, src: &[u64], dst: u64, bytes: u64) {
    match dtype {
        // SAFETY: forwarded from the caller.
        c if c == DType::F32 as u32 => unsafe { tree_of::<f32>(src, dst, bytes) },
        // SAFETY: forwarded from the caller.
        c if c == DType::F16 as u32 => unsafe { tree_of::<f16>(src, dst, bytes) },
        // SAFETY: forwarded from the caller.
        _ => unsafe { tree_of::<bf16>(src, dst, bytes) },
    }
}

/// [`tree`] for element type `T`, through aligned scratch (caller views and frame offsets need
/// not be aligned to `T` on the host's side of the ABI).
///
/// # Safety
/// As [`tree`].
unsafe fn tree_of<T: fixed_tree::Element + Default>(src: &[u64], dst: u64, bytes: u64) {
    const CHUNK: usize = 512;
    let size = size_of::<T>() as u64;
    let count = (bytes / size) as usize;
    let align = align_of::<T>() as u64;
    let apart = |s: u64| s + bytes <= dst || dst + bytes <= s;
    if dst.is_multiple_of(align) && src.iter().all(|&s| s % align == 0 && apart(s)) {
        // The common case (frames and caller views aligned, the output no source): the tree
        // straight over the memory.
        let mut ranks: [&[T]; MAX_WORLD] = [&[]; MAX_WORLD];
        for (r, &s) in ranks.iter_mut().zip(src) {
            // SAFETY: `count` aligned elements readable at `s` (caller), not written meanwhile.
            *r = unsafe { core::slice::from_raw_parts(s as *const T, count) };
        }
        // SAFETY: `count` aligned elements writable at `dst` (caller), overlapping no source.
        let out = unsafe { core::slice::from_raw_parts_mut(dst as *mut T, count) };
        let _ = fixed_tree::reduce(&ranks[..src.len()], out);
        return;
    }
    let mut leaves = [[T::default(); CHUNK]; MAX_WORLD];
    let mut out = [T::default(); CHUNK];
    let mut done = 0usize;
    while done < count {
        let n = CHUNK.min(count - done);
        let at = done as u64 * size;
        for (leaf, &s) in leaves.iter_mut().zip(src) {
            // SAFETY: `n` elements from byte `at` of a source valid for `bytes` (caller).
            unsafe {
                core::ptr::copy_nonoverlapping((s + at) as *const u8, leaf.as_mut_ptr().cast::<u8>(), n * size as usize)
            };
        }
        let mut ranks: [&[T]; MAX_WORLD] = [&[]; MAX_WORLD];
        for (r, l) in ranks.iter_mut().zip(&leaves) {
            *r = &l[..n];
        }
        // The world size is a kernel parameter the engine validated; the reference accepts it.
        let _ = fixed_tree::reduce(&ranks[..src.len()], &mut out[..n]);
        // SAFETY: `n` elements into a destination valid for `bytes` (caller).
        unsafe { core::ptr::copy_nonoverlapping(out.as_ptr().cast::<u8>(), (dst + at) as *mut u8, n * size as usize) };
        done += n;
    }
}
