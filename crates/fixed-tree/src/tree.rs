//! The balanced rank tree itself, for one element.
use crate::{Element, Error};

/// The world sizes the tree is defined for.
pub const SUPPORTED_WORLD_SIZES: [usize; 4] = [1, 2, 4, 8];

/// Checks that `world` is one of [`SUPPORTED_WORLD_SIZES`].
pub(crate) fn check_world(world: usize) -> Result<(), Error> {
    if SUPPORTED_WORLD_SIZES.contains(&world) {
        Ok(())
    } else {
        Err(Error::UnsupportedWorldSize { world })
    }
}

/// The tree over `v` (length 1, 2, 4 or 8): `((v0+v1)+(v2+v3))+((v4+v5)+(v6+v7))` and its prefixes.
///
/// Returns `None` for any other length.
#[inline]
pub fn tree_sum<T: Element>(v: &[T]) -> Option<T> {
    Some(match *v {
        [a] => a,
        [a, b] => a.add(b),
        [a, b, c, d] => a.add(b).add(c.add(d)),
        [a, b, c, d, e, f, g, h] => a.add(b).add(c.add(d)).add(e.add(f).add(g.add(h))),
        _ => return None,
    })
}
