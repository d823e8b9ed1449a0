//! The fused all_reduce + residual + RMSNorm on the RS+AG route, with the norm on each rank's
//! shard of whole rows before the all-gather: every rank normalises `1 / world` of the rows
//! instead of all of them, and the gather moves `h` and `y` instead of the sum (which the
//! unfused call would gather and then read again for the norm).
//!
//! Per chunk of whole rows (elements `[lo, hi)` of the call, `c = hi - lo`; a chunk takes at
//! most the staging capacity: its input, then its `y` rows), rank `r` with shard `[a_r, b_r)`
//! of the chunk — whole rows and a multiple of 16 bytes ([`shard_bounds`] in units of
//! [`ShardNormChunks::unit`]) — runs one launch (`Launch::SingleNorm`):
//!
//! * stage: the chunk of `x` into the own frame at 0, as the pull routes do;
//! * phase 1: the tree over every rank's frame at `[a_r, b_r)` into the caller's `y` rows (the
//!   sum, where the all_reduce writes it);
//! * the norm of the shard's rows ([`NORM_IN_FRAME`], `dc_norm_shard`): `h` into the own frame
//!   at `a_r` (over the own staged shard, which only this rank reads) and `y` at `c + a_r`;
//! * phase 2: every rank's `h` and `y` rows, the own included, from its frame into the caller's
//!   `h` and `y`.
//!
//! The bits are those of the unfused call: the tree, then `fixed_tree::rmsnorm` of each row (by
//! whichever rank holds it). The signature carries the form and the row length
//! ([`Signature::shard_norm_split`]): a rank making a plain all_reduce of the same size (which
//! would read `h` where it expects the sum), or the fused call with another `hidden` (other
//! shard bounds), gets a mismatch.
use crate::chunk::{balanced, chunk_elements, piece};
use crate::norm::{NORM_IN_FRAME, NormArgs, NormParams};
use crate::plan::{Phase, Plan, shard_bounds};
use collective_core::{Call, Op, Route, Signature};

/// The launches of one fused call in the shard form, chunk by chunk: each item the chunk's plan
/// and the norm parameters of the rank's shard (no heap allocation).
#[derive(Debug, Clone)]
pub struct ShardNormChunks {
    call: Call,
    args: NormArgs,
    sig: Signature,
    rank: usize,
    world: usize,
    unit: usize,
    step: usize,
    lo: usize,
}

const fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl ShardNormChunks {
    /// The chunks of the all_reduce `call` (validated: `x` -> `y`) fused with the norm of `args`
    /// (packed: `NormParams::pack` accepted them, `args.sum` is `call.dst`) on `rank` of `world`,
    /// in frames of `capacity` bytes. `None` when the form does not apply: an empty call, one
    /// rank, `call` not the all_reduce of `args`' rows, or not even one unit (twice: input and
    /// `y`) fitting the frame — the caller then runs the all_reduce and the norm apart.
    pub fn new(call: &Call, args: &NormArgs, rank: usize, world: usize, capacity: usize) -> Option<ShardNormChunks> {
        let size = call.dtype.size();
        let n = call.count_in;
        let ours = call.op == Op::AllReduce && args.sum == call.dst && args.dtype == call.dtype;
        if world < 2 || n == 0 || !ours || args.rows.checked_mul(args.hidden) != Some(n) {
            return None;
        }
        let unit = Self::unit(args.hidden, size)?;
        let step = chunk_elements(capacity, size, 2) / unit * unit;
        if step == 0 || u32::try_from(args.hidden).is_err() {
            return None;
        }
        let sig = Signature {
            route: Route::IpcReduceScatterAllGather,
            split: Signature::shard_norm_split(args.hidden as u32),
            ..call.signature()
        };
        let step = balanced(step, n, unit);
        Some(ShardNormChunks { call: *call, args: *args, sig, rank, world, unit, step, lo: 0 })
    }

    /// Elements of the smallest shard piece: whole rows of `hidden` that are also a multiple of
    /// 16 bytes (the frame offsets of the gathers and of the norm's vector path). `None` on
    /// overflow.
    pub fn unit(hidden: usize, size: usize) -> Option<usize> {
        let align = if size >= 16 { 1 } else { 16 / size };
        (hidden / gcd(hidden, align)).checked_mul(align)
    }

    /// The signature every chunk carries (the whole call's, with the form).
    pub fn signature(&self) -> Signature {
        self.sig
    }

    /// The plan and norm parameters of elements `[lo, hi)`.
    fn chunk(&self, lo: usize, hi: usize) -> (Plan, NormParams) {
        let (call, args) = (&self.call, &self.args);
        let size = call.dtype.size();
        let at = |addr: u64, el: usize| addr + (el * size) as u64;
        let c = hi - lo;
        let seg = piece;
        let mut p = Plan::empty(self.sig, Route::IpcReduceScatterAllGather);
        p.stage.push(seg(Phase::Stage, at(call.src, lo), 0, 0, c, self.rank));
        let (a, b) = shard_bounds(c, self.world, self.rank, self.unit);
        p.phase1.push(seg(Phase::Reduce, 0, at(call.dst, lo + a), a, b - a, self.rank));
        for q in 0..self.world {
            let (qa, qb) = shard_bounds(c, self.world, q, self.unit);
            if qb > qa {
                p.phase2.push(seg(Phase::Gather, 0, at(args.h, lo + qa), qa, qb - qa, q));
                p.phase2.push(seg(Phase::Gather, 0, at(args.y, lo + qa), c + qa, qb - qa, q));
            }
        }
        let norm = NormParams {
            sum: at(call.dst, lo + a),
            residual: at(args.residual, lo + a),
            weight: args.weight,
            h: (a * size) as u64,
            y: ((c + a) * size) as u64,
            rows: ((b - a) / args.hidden) as u64,
            hidden: args.hidden as u32,
            dtype: args.dtype as u32,
            eps: args.eps,
            flags: NORM_IN_FRAME,
        };
        (p, norm)
    }
}

impl Iterator for ShardNormChunks {
    type Item = (Plan, NormParams);

    fn next(&mut self) -> Option<(Plan, NormParams)> {
        let n = self.call.count_in;
        if self.lo >= n {
            return None;
        }
        let hi = n.min(self.lo + self.step);
        let item = self.chunk(self.lo, hi);
        self.lo = hi;
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collective_core::DType;

    fn call(n: usize, dtype: DType) -> Call {
        Call { op: Op::AllReduce, dtype, src: 0x10_0000, dst: 0x20_0000, count_in: n, count_out: n, in_place: false }
    }

    fn args(rows: usize, hidden: usize, dtype: DType) -> NormArgs {
        NormArgs {
            sum: 0x20_0000,
            residual: 0x30_0000,
            weight: 0x40_0000,
            h: 0x30_0000,
            y: 0x20_0000,
            rows,
            hidden,
            eps: 1e-6,
            dtype,
        }
    }

    #[test]
    fn units_are_whole_rows_of_sixteen_bytes() {
        assert_eq!(ShardNormChunks::unit(4096, 2), Some(4096));
        assert_eq!(ShardNormChunks::unit(2049, 2), Some(2049 * 8));
        assert_eq!(ShardNormChunks::unit(6, 4), Some(12));
        assert_eq!(ShardNormChunks::unit(usize::MAX, 2), None);
    }

    /// Every element of every row is reduced by exactly one rank, normalised as part of whole
    /// rows, and gathered into h and y by every rank; chunks take at most the frame.
    #[test]
    fn shards_cover_whole_rows_once_within_the_frame() {
        for (rows, hidden, dtype, world, capacity) in [
            (300usize, 4096usize, DType::BF16, 4usize, 16usize << 20),
            (300, 4096, DType::BF16, 8, 1 << 20),
            (7, 2049, DType::F16, 3, 1 << 20),
            (100, 512, DType::F32, 8, 64 << 10),
            (5, 24, DType::F32, 2, 256),
        ] {
            let n = rows * hidden;
            let size = dtype.size();
            let (c, a) = (call(n, dtype), args(rows, hidden, dtype));
            let mut normed = vec![0u8; rows];
            let mut gathered = vec![vec![0u8; n]; world];
            let mut lo = 0;
            for (rank, gathered) in gathered.iter_mut().enumerate() {
                lo = 0;
                let chunks = ShardNormChunks::new(&c, &a, rank, world, capacity).expect("applies");
                assert_eq!(chunks.signature().split, Signature::shard_norm_split(hidden as u32));
                for (p, norm) in chunks {
                    let stage = p.stage.as_slice()[0];
                    let chunk = stage.count;
                    assert_eq!(stage.src, c.src + (lo * size) as u64);
                    assert_eq!(chunk % hidden, 0, "chunks of whole rows");
                    let frame_end = p.phase2.as_slice().iter().map(|s| (s.frame_offset + s.count) * size).max();
                    assert!(frame_end.unwrap_or(0) <= capacity, "chunk within the frame");
                    assert!(2 * chunk * size <= capacity);
                    let r = p.phase1.as_slice()[0];
                    assert_eq!(norm.sum, r.dst);
                    assert_eq!(norm.flags, NORM_IN_FRAME);
                    assert_eq!(norm.h, (r.frame_offset * size) as u64);
                    assert_eq!(norm.y, ((chunk + r.frame_offset) * size) as u64);
                    assert_eq!(norm.rows as usize * hidden, r.count);
                    assert!(r.count == 0 || (r.frame_offset * size) % 16 == 0, "16-byte aligned shards");
                    let first_row = (lo + r.frame_offset) / hidden;
                    for k in &mut normed[first_row..first_row + norm.rows as usize] {
                        *k += 1;
                    }
                    for s in p.phase2.as_slice() {
                        let out = if s.frame_offset >= chunk { a.y } else { a.h };
                        let (h_or_y, off) = if out == a.h { (0, 0) } else { (1, chunk) };
                        let first = (s.dst - out) as usize / size;
                        assert_eq!(first, lo + s.frame_offset - off);
                        if h_or_y == 0 {
                            for e in &mut gathered[first..first + s.count] {
                                *e += 1;
                            }
                        }
                    }
                    lo += chunk;
                }
                assert_eq!(lo, n);
            }
            assert!(normed.iter().all(|&k| k == 1), "every row normalised by one rank");
            assert!(gathered.iter().all(|g| g.iter().all(|&k| k == 1)), "every element gathered once per rank");
            assert!(lo == n);
        }
    }

    #[test]
    fn the_form_needs_two_ranks_rows_and_a_frame_for_one_unit() {
        let (c, a) = (call(4 * 4096, DType::BF16), args(4, 4096, DType::BF16));
        assert!(ShardNormChunks::new(&c, &a, 0, 1, 1 << 20).is_none(), "one rank");
        assert!(ShardNormChunks::new(&c, &a, 0, 2, (16 << 10) - 2).is_none(), "a row and its y exceed the frame");
        assert!(ShardNormChunks::new(&c, &a, 0, 2, 16 << 10).is_some());
        assert!(ShardNormChunks::new(&call(0, DType::BF16), &args(0, 4096, DType::BF16), 0, 2, 1 << 20).is_none());
        let other_sum = NormArgs { sum: 0x50_0000, ..a };
        assert!(ShardNormChunks::new(&c, &other_sum, 0, 2, 1 << 20).is_none(), "not this all_reduce's norm");
    }
}
