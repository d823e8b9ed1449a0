//! The canonical rank tree itself, for one element, and its shape.
//!
//! # The tree for `W` ranks
//!
//! * `W = 1`: the leaf `r0`.
//! * `W >= 2`: with `m` the largest power of two strictly below `W`, the tree of ranks
//!   `0..m` (the left subtree) plus the tree of ranks `m..W` (the right subtree), one add in the
//!   element's dtype, left operand first.
//!
//! The left subtree always has a power-of-two size, and the tree of `2^k` ranks is the balanced
//! tree (its `m` is exactly half). So for 1, 2, 4 and 8 ranks this is the balanced tree
//! `((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))` and its prefixes, and for every other `W` it is the
//! balanced tree of the first `m` ranks plus the canonical tree of the remaining `W - m`:
//! `((r0+r1)+(r2+r3))+(r4+r5)` for `W = 6`. [`tree_expression`] writes the tree out.
//!
//! Unrolled, the tree of `W` is the balanced trees of the aligned power-of-two blocks of `W`'s
//! binary expansion, largest first, each added to the tree of everything after it: for
//! `W = 13 = 8 + 4 + 1`, `B(r0..r7) + (B(r8..r11) + r12)` with `B` the balanced tree.
//!
//! Why this shape: it is one tree per `W` (no choice is left to a backend), it is the balanced
//! tree every existing 1/2/4/8-rank result was produced with, it is no deeper than
//! `ceil(log2 W)` adds, and its power-of-two blocks are the units a hierarchical route can
//! reduce first.
use crate::{Element, Error};

/// The world sizes detcoll's collectives are built for today: the powers of two up to 8
/// (one node). They are also the TP sizes [`crate::cross_tp_leaves`] splits the eight TP=8
/// leaves over, a property of power-of-two sizes only.
///
/// The tree itself and the reference functions ([`tree_sum`], [`crate::reduce`],
/// [`crate::all_gather`], [`crate::reduce_scatter`], [`crate::reduce_scatter_many`],
/// [`tree_expression`]) take any world size from 1 to [`MAX_WORLD_SIZE`].
pub const SUPPORTED_WORLD_SIZES: [usize; 4] = [1, 2, 4, 8];

/// The largest world size the tree and the reference functions accept.
///
/// A bound rather than `usize::MAX` so that the contract names one: the tree is then at most
/// `log2 4096` = 12 adds deep, and a kernel can size its per-rank tables from it. A world of 0
/// ranks or above this is [`Error::UnsupportedWorldSize`], as any world a function does not
/// take (and `None` from [`tree_sum`]); nothing panics.
pub const MAX_WORLD_SIZE: usize = 4096;

/// Checks that `world` is in `1..=MAX_WORLD_SIZE`.
pub(crate) fn check_world(world: usize) -> Result<(), Error> {
    if (1..=MAX_WORLD_SIZE).contains(&world) { Ok(()) } else { Err(Error::UnsupportedWorldSize { world }) }
}

/// The size of the left subtree of the tree of `world >= 2` ranks: the largest power of two
/// strictly below `world`.
#[inline]
pub(crate) fn left_size(world: usize) -> usize {
    debug_assert!(world >= 2);
    1 << (usize::BITS - 1 - (world - 1).leading_zeros())
}

/// The tree over `v`, one value per rank, for any length from 1 to [`MAX_WORLD_SIZE`]:
/// `((v0+v1)+(v2+v3))+((v4+v5)+(v6+v7))` for 8, `((v0+v1)+(v2+v3))+(v4+v5)` for 6, and so on
/// (see [`tree_expression`]).
///
/// Returns `None` for an empty `v` or one longer than [`MAX_WORLD_SIZE`].
///
/// ```
/// // Six ranks: ((1 + 2) + (4 + 8)) + (16 + 32).
/// let v = [1.0f32, 2.0, 4.0, 8.0, 16.0, 32.0];
/// assert_eq!(fixed_tree::tree_sum(&v), Some(63.0));
/// assert_eq!(fixed_tree::tree_sum::<f32>(&[]), None);
/// ```
#[inline]
pub fn tree_sum<T: Element>(v: &[T]) -> Option<T> {
    check_world(v.len()).ok()?;
    Some(tree_of(v))
}

/// The tree over `v`, `1 <= v.len()`. The 1/2/4/8 cases are written out (they are the hot
/// path and the tree every existing result was produced with); any other length splits.
fn tree_of<T: Element>(v: &[T]) -> T {
    match *v {
        [a] => a,
        [a, b] => tree2(a, b),
        [a, b, c, d] => tree4(a, b, c, d),
        [a, b, c, d, e, f, g, h] => tree8([a, b, c, d, e, f, g, h]),
        _ => {
            let (left, right) = v.split_at(left_size(v.len()));
            tree_of(left).add(tree_of(right))
        }
    }
}

/// The tree of `world` ranks as an expression over `r0 .. r{world-1}`, every add in
/// parentheses but the outermost: `r0` for 1 rank, `r0+r1` for 2, `(r0+r1)+r2` for 3,
/// `((r0+r1)+(r2+r3))+(r4+r5)` for 6. For documentation, tests and error messages: the
/// reference functions evaluate exactly this expression, per element.
///
/// Returns [`Error::UnsupportedWorldSize`] outside `1..=MAX_WORLD_SIZE`.
///
/// ```
/// assert_eq!(fixed_tree::tree_expression(6)?, "((r0+r1)+(r2+r3))+(r4+r5)");
/// assert_eq!(fixed_tree::tree_expression(8)?, "((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))");
/// # Ok::<(), fixed_tree::Error>(())
/// ```
pub fn tree_expression(world: usize) -> Result<String, Error> {
    check_world(world)?;
    fn write(out: &mut String, lo: usize, hi: usize, outer: bool) {
        use core::fmt::Write as _;
        if hi - lo == 1 {
            // Writing to a String cannot fail.
            let _ = write!(out, "r{lo}");
            return;
        }
        let mid = lo + left_size(hi - lo);
        if !outer {
            out.push('(');
        }
        write(out, lo, mid, false);
        out.push('+');
        write(out, mid, hi, false);
        if !outer {
            out.push(')');
        }
    }
    let mut out = String::new();
    write(&mut out, 0, world, true);
    Ok(out)
}

/// `v0 + v1`: the tree of 2 ranks.
#[inline(always)]
pub(crate) fn tree2<T: Element>(a: T, b: T) -> T {
    a.add(b)
}

/// `(v0 + v1) + (v2 + v3)`: the tree of 4 ranks.
#[inline(always)]
pub(crate) fn tree4<T: Element>(a: T, b: T, c: T, d: T) -> T {
    tree2(a, b).add(tree2(c, d))
}

/// `((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))`: the tree of 8 ranks.
#[inline(always)]
pub(crate) fn tree8<T: Element>(v: [T; 8]) -> T {
    tree4(v[0], v[1], v[2], v[3]).add(tree4(v[4], v[5], v[6], v[7]))
}
