//! What the invariance tests share: a thread group over the CPU twin and bit views of outputs.
#![allow(dead_code)] // each test file uses part of it
use fixed_tree::Element;
use shm_ipc::{ShmCollective, ShmConfig};

#[cfg(feature = "cuda")]
pub mod gpu;

/// The TP/CP sizes the fixed tree supports.
pub const SIZES: [usize; 4] = [1, 2, 4, 8];

/// Runs `f` on every rank of a `world`-rank thread group of the CPU twin; the results in rank
/// order.
pub fn on_group<R: Send>(world: usize, f: impl Fn(&ShmCollective) -> R + Sync) -> Vec<R> {
    let ranks = ShmCollective::group(world, ShmConfig::new(1 << 16)).expect("a thread group of the CPU twin");
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = ranks.iter().map(|comm| s.spawn(move || f(comm))).collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// The bit patterns of `v`, for `assert_eq!` with exact comparison (NaN included).
pub fn bits<T: Element>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits_u32()).collect()
}

/// How many elements of `a` and `b` differ in their bits.
pub fn differing<T: Element>(a: &[T], b: &[T]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x.to_bits_u32() != y.to_bits_u32()).count()
}
