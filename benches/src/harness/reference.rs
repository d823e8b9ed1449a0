//! What every rank of a row must receive, computed once per process.
//!
//! Each rank checks its first call against the fixed tree over every rank's deterministic
//! input ([`super::run::rank_input`]). Rebuilding every input and the whole tree on every rank
//! costs seconds per row at large sizes (world 8, 64 MiB: about 7 s of one core per rank, and
//! thread ranks would each redo it), device time spent waiting on the host. So a process keeps
//! the inputs of the row in progress (thread ranks share them; every rank of a run is on the
//! same row, between barriers), generates them in parallel, reduces all_reduce's tree once in
//! parallel slices, reduces only a rank's own shards for reduce_scatter, and compares
//! all_gather piece by piece instead of building the concatenation. The element-wise tree is
//! the same, so the expected bits are those of the plain definition (tested against it).
use super::args::BenchOp;
use super::run::rank_input;
use collective_core::DType;
use collective_core::conformance::data::{compare, reference_reduce};
use std::sync::{Arc, Mutex};

/// Identifies a row's data: same arguments, same inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    seed: u64,
    op: BenchOp,
    dtype: DType,
    size: usize,
    world: usize,
}

/// Every rank's input of one row and, for all_reduce, the tree over them.
#[derive(Debug)]
pub struct RowReference {
    key: Key,
    inputs: Vec<Vec<u8>>,
    /// all_reduce: the fixed tree over every input (every rank's expected output).
    reduced: Option<Vec<u8>>,
}

/// The row in progress in this process.
static CURRENT: Mutex<Option<Arc<RowReference>>> = Mutex::new(None);

/// Threads to spread `work` items over.
fn threads(work: usize) -> usize {
    std::thread::available_parallelism().map_or(1, |p| p.get()).min(work).max(1)
}

/// Runs `f(i)` for `i` in `0..count` on up to [`threads`] threads; results in order of `i`.
fn parallel<T: Send>(count: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let per = count.div_ceil(threads(count));
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..count)
            .step_by(per.max(1))
            .map(|lo| {
                let f = &f;
                s.spawn(move || (lo..(lo + per).min(count)).map(f).collect::<Vec<T>>())
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().expect("a reference thread panicked")).collect()
    })
}

/// Bytes of the smallest slice [`reduce_parallel`] gives a thread of its own.
const MIN_SLICE: usize = 1 << 20;

/// The tree over `inputs`, slices of at least `min_slice` bytes reduced in parallel (each
/// element's tree is the same whatever the slicing).
fn reduce_parallel(inputs: &[Vec<u8>], dtype: DType, min_slice: usize) -> Vec<u8> {
    let (esize, len) = (dtype.size(), inputs.first().map_or(0, Vec::len));
    let elements = len / esize;
    let pieces = threads(elements.div_ceil((min_slice / esize).max(1)).max(1));
    let step = elements.div_ceil(pieces).max(1) * esize;
    parallel(len.div_ceil(step), |i| {
        let (lo, hi) = (i * step, ((i + 1) * step).min(len));
        reference_reduce(&inputs.iter().map(|x| x[lo..hi].to_vec()).collect::<Vec<_>>(), dtype)
    })
    .concat()
}

impl RowReference {
    /// The reference of the row (`seed`, `op`, `dtype`, `size` bytes per rank, `world`): this
    /// process's current one when it is that row, else built (in parallel) and made current.
    /// Thread ranks asking at once wait for the first one's build instead of repeating it.
    pub fn of(seed: u64, op: BenchOp, dtype: DType, size: usize, world: usize) -> Arc<RowReference> {
        let key = Key { seed, op, dtype, size, world };
        let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = current.as_ref().filter(|r| r.key == key) {
            return r.clone();
        }
        // Drop the previous row's data before building the next.
        *current = None;
        let n = size / dtype.size();
        let inputs = parallel(world, |r| rank_input(seed, op, dtype, size, n, r));
        let reduced = (op == BenchOp::AllReduce).then(|| reduce_parallel(&inputs, dtype, MIN_SLICE));
        let r = Arc::new(RowReference { key, inputs, reduced });
        *current = Some(r.clone());
        r
    }

    /// Rank `rank`'s input.
    pub fn input(&self, rank: usize) -> &[u8] {
        &self.inputs[rank]
    }

    /// Bytes of one lane of one rank's input, and of one rank's shard of it.
    fn lane_and_shard(&self) -> (usize, usize) {
        let Key { op, dtype, size, world, .. } = self.key;
        let lane = size / dtype.size() / op.lanes() * dtype.size();
        (lane, lane / world)
    }

    /// Rank `rank`'s reduce_scatter output of lane `l`: the tree over every rank's shard `rank`.
    fn shard(&self, l: usize, rank: usize) -> Vec<u8> {
        let (lane, shard) = self.lane_and_shard();
        let at = l * lane + rank * shard;
        reference_reduce(&self.inputs.iter().map(|x| x[at..at + shard].to_vec()).collect::<Vec<_>>(), self.key.dtype)
    }

    /// Whether `got` (rank `rank`'s output, lanes concatenated) is what the fixed tree gives;
    /// the first differing element otherwise.
    pub fn check(&self, rank: usize, got: &[u8]) -> Result<(), String> {
        let Key { op, dtype, size, .. } = self.key;
        match op {
            BenchOp::AllReduce => compare(got, self.reduced.as_deref().unwrap_or_default(), dtype),
            BenchOp::AllGather => {
                let want = size * self.inputs.len();
                if got.len() != want {
                    return Err(format!("length {} bytes, expected {want}", got.len()));
                }
                for (q, (piece, input)) in got.chunks(size.max(1)).zip(&self.inputs).enumerate() {
                    compare(piece, input, dtype).map_err(|e| format!("rank {q}'s piece: {e}"))?;
                }
                Ok(())
            }
            BenchOp::ReduceScatter | BenchOp::ReduceScatterMany => {
                let shard = self.lane_and_shard().1;
                if got.len() != shard * op.lanes() {
                    return Err(format!("length {} bytes, expected {}", got.len(), shard * op.lanes()));
                }
                for l in 0..op.lanes() {
                    let piece = &got[l * shard..(l + 1) * shard];
                    let lane = |e: String| if op.lanes() > 1 { format!("lane {l}: {e}") } else { e };
                    compare(piece, &self.shard(l, rank), dtype).map_err(lane)?;
                }
                Ok(())
            }
        }
    }

    /// Rank `rank`'s whole expected output, lanes concatenated (for the native references'
    /// distance from the tree).
    pub fn expected(&self, rank: usize) -> Vec<u8> {
        match self.key.op {
            BenchOp::AllReduce => self.reduced.clone().unwrap_or_default(),
            BenchOp::AllGather => self.inputs.concat(),
            op => (0..op.lanes()).flat_map(|l| self.shard(l, rank)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::run::expected_output;

    #[test]
    fn matches_the_plain_definition_for_every_op_dtype_and_world() {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for op in BenchOp::ALL {
                for world in [1, 2, 4, 8] {
                    // Sizes that split into lanes and shards.
                    for size in [64 * world * dtype.size(), 4800 * world * dtype.size()] {
                        let r = RowReference::of(7, op, dtype, size, world);
                        let n = size / dtype.size();
                        for rank in 0..world {
                            let want = expected_output(7, op, dtype, size, n, world, rank);
                            assert_eq!(r.expected(rank), want, "{op:?} {dtype:?} world {world} size {size}");
                            r.check(rank, &want).unwrap_or_else(|e| panic!("{op:?} {dtype:?} w{world}: {e}"));
                            assert_eq!(r.input(rank), rank_input(7, op, dtype, size, n, rank));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn parallel_slices_reduce_as_one_tree() {
        for dtype in [DType::F32, DType::BF16] {
            for elements in [0, 1, 7, 1000, 4099] {
                let inputs: Vec<Vec<u8>> =
                    (0..8).map(|r| rank_input(r, BenchOp::AllReduce, dtype, 0, elements, 0)).collect();
                let want = reference_reduce(&inputs, dtype);
                for min_slice in [1, 16, 64, MIN_SLICE] {
                    assert_eq!(reduce_parallel(&inputs, dtype, min_slice), want, "{dtype:?} {elements} {min_slice}");
                }
            }
        }
    }

    #[test]
    fn a_flipped_bit_is_named() {
        for op in BenchOp::ALL {
            let (dtype, world) = (DType::BF16, 4);
            let size = 256 * world;
            let r = RowReference::of(9, op, dtype, size, world);
            let mut got = r.expected(2);
            let at = got.len() - 2;
            got[at] ^= 1;
            let e = r.check(2, &got).expect_err("a flipped bit must be found");
            assert!(e.contains("element"), "{op:?}: {e}");
            assert!(r.check(2, &got[..got.len() - 2]).unwrap_err().contains("length"), "{op:?}");
        }
    }
}
