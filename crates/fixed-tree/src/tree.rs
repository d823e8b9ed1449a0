//! The balanced rank tree itself, for one element.
use crate::{Element, Error};

/// The world sizes the tree is defined for.
pub const SUPPORTED_WORLD_SIZES: [usize; 4] = [1, 2, 4, 8];

/// Checks that `world` is one of [`SUPPORTED_WORLD_SIZES`].
pub(crate) fn check_world(world: usize) -> Result<(), Error> {
    if SUPPORTED_WORLD_SIZES.contains(&world) { Ok(()) } else { Err(Error::UnsupportedWorldSize { world }) }
}

/// The tree over `v` (length 1, 2, 4 or 8): `((v0+v1)+(v2+v3))+((v4+v5)+(v6+v7))` and its prefixes.
///
/// Returns `None` for any other length.
#[inline]
pub fn tree_sum<T: Element>(v: &[T]) -> Option<T> {
    Some(match *v {
        [a] => a,
        [a, b] => tree2(a, b),
        [a, b, c, d] => tree4(a, b, c, d),
        [a, b, c, d, e, f, g, h] => tree8([a, b, c, d, e, f, g, h]),
        _ => return None,
    })
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
