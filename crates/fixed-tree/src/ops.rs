//! Reference implementations of every collective, on host slices, one slice per rank.
use crate::tree::{check_world, tree_sum};
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

/// Evaluates the tree over `ranks` for elements `range` into `out` (same length as `range`).
fn tree_into<T: Element>(ranks: &[&[T]], start: usize, out: &mut [T]) {
    let mut leaf = [ranks[0][0]; 8];
    for (i, o) in out.iter_mut().enumerate() {
        for (l, r) in leaf.iter_mut().zip(ranks) {
            *l = r[start + i];
        }
        // The world size was checked, so the tree exists.
        if let Some(v) = tree_sum(&leaf[..ranks.len()]) {
            *o = v;
        }
    }
}

/// all_reduce reference: `out[i]` is the fixed tree over `ranks[..][i]`.
///
/// `ranks.len()` must be 1, 2, 4 or 8 and every slice as long as `out`; otherwise an error is
/// returned and `out` is untouched.
///
/// ```
/// // The balanced tree is not a left fold: (1e20 + 1) + (-1e20 + 1) = 1e20 - 1e20 = 0,
/// // where ((1e20 + 1) - 1e20) + 1 would give 1.
/// let ranks: [&[f32]; 4] = [&[1e20], &[1.0], &[-1e20], &[1.0]];
/// let mut out = [f32::NAN];
/// fixed_tree::reduce(&ranks, &mut out)?;
/// assert_eq!(out, [0.0]);
///
/// // Three ranks have no tree.
/// let err = fixed_tree::reduce(&ranks[..3], &mut out).unwrap_err();
/// assert_eq!(err, fixed_tree::Error::UnsupportedWorldSize { world: 3 });
/// # Ok::<(), fixed_tree::Error>(())
/// ```
pub fn reduce<T: Element>(ranks: &[&[T]], out: &mut [T]) -> Result<(), Error> {
    let n = check_ranks(ranks, "ranks[r]")?;
    check_len("out", n, out.len())?;
    if n > 0 {
        tree_into(ranks, 0, out);
    }
    Ok(())
}

/// all_gather reference: `out` is the concatenation of `ranks` in rank order. Any element type.
///
/// `ranks.len()` must be 1, 2, 4 or 8, every slice as long as the first and `out` as long as all
/// of them together; otherwise an error is returned and `out` is untouched.
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
    if shard > 0 {
        tree_into(ranks, rank * shard, out);
    }
    Ok(())
}

/// reduce_scatter_many reference: lane `l` is an independent reduce_scatter of
/// `lanes[l]` (one slice per rank) into `outs[l]`. Lanes never mix: each gets its own tree.
///
/// Every lane (and `outs.len() == lanes.len()`, and one world size for all lanes) is validated
/// before any output is written: on error, no lane's output has been touched.
pub fn reduce_scatter_many<T: Element>(
    lanes: &[&[&[T]]],
    rank: usize,
    outs: &mut [&mut [T]],
) -> Result<(), Error> {
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
pub fn cross_tp_leaves<T: Element>(leaves: &[&[T]], ranks: usize) -> Result<Vec<Vec<T>>, Error> {
    if leaves.len() != 8 || !crate::SUPPORTED_WORLD_SIZES.contains(&ranks) {
        return Err(Error::UnsupportedTpSplit { leaves: leaves.len(), ranks });
    }
    let n = check_ranks(leaves, "leaves[l]")?;
    let per = 8 / ranks;
    Ok(leaves
        .chunks_exact(per)
        .map(|block| {
            let mut v = block[0].to_vec();
            if n > 0 {
                tree_into(block, 0, &mut v);
            }
            v
        })
        .collect())
}
