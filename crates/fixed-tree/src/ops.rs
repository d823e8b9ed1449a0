//! Reference implementations of every collective, on host slices, one slice per rank.
use crate::tree::{check_world, left_size, tree2, tree4, tree8};
use crate::{Element, Error};

fn check_len(argument: &'static str, expected: usize, got: usize) -> Result<(), Error> {
    if expected == got { Ok(()) } else { Err(Error::LengthMismatch { argument, expected, got }) }
}

fn check_ranks<T>(ranks: &[&[T]], argument: &'static str) -> Result<usize, Error> {
    check_world(ranks.len())?;
    let n = ranks[0].len();
    for r in ranks {
        check_len(argument, n, r.len())?;
    }
    Ok(n)
}

/// Elements one pass of [`tree_cols`] handles at a time, so that its scratch lives on the stack.
const CHUNK: usize = 256;

/// Evaluates the tree over `ranks` for elements `start..start + out.len()` into `out`.
///
/// The caller has checked the world size and that every rank holds those elements. One loop per
/// world size 1, 2, 4 and 8, over columns of equal length, so the per-element work is the tree
/// alone; any other world goes through [`tree_cols`] in chunks of [`CHUNK`] elements.
pub(crate) fn tree_into<T: Element>(ranks: &[&[T]], start: usize, out: &mut [T]) {
    match ranks.len() {
        1 | 2 | 4 | 8 => tree_small(ranks, start, out),
        _ => {
            for (c, chunk) in out.chunks_mut(CHUNK).enumerate() {
                tree_cols(ranks, start + c * CHUNK, chunk);
            }
        }
    }
}

/// [`tree_into`] for a world of 1, 2, 4 or 8 ranks.
fn tree_small<T: Element>(ranks: &[&[T]], start: usize, out: &mut [T]) {
    let n = out.len();
    let col = |k: usize| &ranks[k][start..start + n];
    match ranks.len() {
        1 => out.copy_from_slice(col(0)),
        2 => {
            let (a, b) = (col(0), col(1));
            for (i, o) in out.iter_mut().enumerate() {
                *o = tree2(a[i], b[i]);
            }
        }
        4 => {
            let (a, b, c, d) = (col(0), col(1), col(2), col(3));
            for (i, o) in out.iter_mut().enumerate() {
                *o = tree4(a[i], b[i], c[i], d[i]);
            }
        }
        8 => {
            let (a, b, c, d) = (col(0), col(1), col(2), col(3));
            let (e, f, g, h) = (col(4), col(5), col(6), col(7));
            for (i, o) in out.iter_mut().enumerate() {
                *o = tree8([a[i], b[i], c[i], d[i], e[i], f[i], g[i], h[i]]);
            }
        }
        world => unreachable!("world size {world} is not 1, 2, 4 or 8"),
    }
}

/// The tree over `ranks` (any world from 1 to `MAX_WORLD_SIZE`) for at most [`CHUNK`] elements
/// from `start`, into `out`: the left subtree into `out`, the right one into scratch, then
/// `out[i] = out[i] + scratch[i]` (left operand first), as the definition reads. Subtrees of
/// 1, 2, 4 or 8 ranks take the written-out loops; the recursion is at most
/// `log2 MAX_WORLD_SIZE` = 12 deep, each level with one `CHUNK`-element scratch.
fn tree_cols<T: Element>(ranks: &[&[T]], start: usize, out: &mut [T]) {
    debug_assert!(out.len() <= CHUNK);
    let world = ranks.len();
    if matches!(world, 1 | 2 | 4 | 8) {
        return tree_small(ranks, start, out);
    }
    let Some(&first) = out.first() else { return };
    let (left, right) = ranks.split_at(left_size(world));
    tree_cols(left, start, out);
    let scratch = &mut [first; CHUNK][..out.len()];
    tree_cols(right, start, scratch);
    for (o, s) in out.iter_mut().zip(scratch.iter()) {
        *o = o.add(*s);
    }
}

/// all_reduce reference: `out[i]` is the fixed tree over `ranks[..][i]` (see [`crate::tree_sum`]
/// and [`crate::tree_expression`] for its shape at any world size).
///
/// `ranks.len()` must be in `1..=MAX_WORLD_SIZE` and every slice as long as `out`; otherwise an
/// error is returned and `out` is untouched.
///
/// ```
/// // The balanced tree is not a left fold: (1e20 + 1) + (-1e20 + 1) = 1e20 - 1e20 = 0,
/// // where ((1e20 + 1) - 1e20) + 1 would give 1.
/// let ranks: [&[f32]; 4] = [&[1e20], &[1.0], &[-1e20], &[1.0]];
/// let mut out = [f32::NAN];
/// fixed_tree::reduce(&ranks, &mut out)?;
/// assert_eq!(out, [0.0]);
///
/// // Three ranks: (r0 + r1) + r2 = (1e20 + 1) - 1e20 = 0.
/// fixed_tree::reduce(&ranks[..3], &mut out)?;
/// assert_eq!(out, [0.0]);
///
/// // Zero ranks have no tree.
/// let err = fixed_tree::reduce(&ranks[..0], &mut out).unwrap_err();
/// assert_eq!(err, fixed_tree::Error::UnsupportedWorldSize { world: 0 });
/// # Ok::<(), fixed_tree::Error>(())
/// ```
pub fn reduce<T: Element>(ranks: &[&[T]], out: &mut [T]) -> Result<(), Error> {
    let n = check_ranks(ranks, "ranks[r]")?;
    check_len("out", n, out.len())?;
    tree_into(ranks, 0, out);
    Ok(())
}

/// all_gather reference: `out` is the concatenation of `ranks` in rank order. Any element type.
///
/// `ranks.len()` must be in `1..=MAX_WORLD_SIZE`, every slice as long as the first and `out` as
/// long as all of them together; otherwise an error is returned and `out` is untouched.
pub fn all_gather<T: Copy>(ranks: &[&[T]], out: &mut [T]) -> Result<(), Error> {
    let n = check_ranks(ranks, "ranks[r]")?;
    check_len("out", n * ranks.len(), out.len())?;
    for (chunk, r) in out.chunks_exact_mut(n.max(1)).zip(ranks) {
        chunk.copy_from_slice(r);
    }
    Ok(())
}

/// reduce_scatter reference: `out` is shard `rank` (of `ranks.len()` equal shards) of the tree,
/// i.e. elements `rank * n / world ..(rank + 1) * n / world` of [`reduce`]'s output.
///
/// Besides [`reduce`]'s conditions, `rank` must be below the world size, the common length `n`
/// must divide by it and `out` must hold `n / world` elements; otherwise an error is returned
/// and `out` is untouched.
pub fn reduce_scatter<T: Element>(ranks: &[&[T]], rank: usize, out: &mut [T]) -> Result<(), Error> {
    let n = check_ranks(ranks, "ranks[r]")?;
    let world = ranks.len();
    if rank >= world {
        return Err(Error::RankOutOfRange { rank, world });
    }
    if n % world != 0 {
        return Err(Error::NotDivisible { argument: "ranks[r]", len: n, world });
    }
    let shard = n / world;
    check_len("out", shard, out.len())?;
    tree_into(ranks, rank * shard, out);
    Ok(())
}

/// reduce_scatter_many reference: lane `l` is an independent reduce_scatter of
/// `lanes[l]` (one slice per rank) into `outs[l]`. Lanes never mix: each gets its own tree.
///
/// Every lane (and `outs.len() == lanes.len()`, and one world size for all lanes) is validated
/// before any output is written: on error, no lane's output has been touched.
pub fn reduce_scatter_many<T: Element>(lanes: &[&[&[T]]], rank: usize, outs: &mut [&mut [T]]) -> Result<(), Error> {
    check_len("outs", lanes.len(), outs.len())?;
    let world = lanes.first().map_or(1, |l| l.len());
    for (lane, out) in lanes.iter().zip(outs.iter()) {
        let n = check_ranks(lane, "lanes[l][r]")?;
        check_len("lanes[l]", world, lane.len())?;
        if rank >= world {
            return Err(Error::RankOutOfRange { rank, world });
        }
        if n % world != 0 {
            return Err(Error::NotDivisible { argument: "lanes[l][r]", len: n, world });
        }
        check_len("outs[l]", n / world, out.len())?;
    }
    for (lane, out) in lanes.iter().zip(outs.iter_mut()) {
        reduce_scatter(lane, rank, out)?;
    }
    Ok(())
}

/// Cross-TP helper: given the 8 leaves of a TP=8 reduction, the inputs a TP=`ranks` group holds
/// so that its tree equals the TP=8 tree. Rank `j` of `ranks` gets the fixed tree of the
/// contiguous block of leaves `[j*8/ranks, (j+1)*8/ranks)`.
///
/// `reduce(&cross_tp_leaves(leaves, k)?, out)` equals `reduce(leaves, out)` bit for bit, because
/// the TP=k tree is exactly the top `log2 k` levels of the TP=8 tree.
///
/// This is a property of power-of-two TP sizes, and the function stays restricted to them
/// (`ranks` in [`crate::SUPPORTED_WORLD_SIZES`], exactly 8 leaves) although the tree now takes
/// any world size: splitting leaves into blocks of a size that is not a power of two gives
/// blocks whose trees are not subtrees of the leaves' tree (6 leaves over 2 ranks would hold
/// `(l0+l1)+l2` and `(l3+l4)+l5`, while the tree of 6 is `((l0+l1)+(l2+l3))+(l4+l5)`).
pub fn cross_tp_leaves<T: Element>(leaves: &[&[T]], ranks: usize) -> Result<Vec<Vec<T>>, Error> {
    if leaves.len() != 8 || !crate::SUPPORTED_WORLD_SIZES.contains(&ranks) {
        return Err(Error::UnsupportedTpSplit { leaves: leaves.len(), ranks });
    }
    check_ranks(leaves, "leaves[l]")?;
    let per = 8 / ranks;
    Ok(leaves
        .chunks_exact(per)
        .map(|block| {
            let mut v = block[0].to_vec();
            tree_into(block, 0, &mut v);
            v
        })
        .collect())
}
