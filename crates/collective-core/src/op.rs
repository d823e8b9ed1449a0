//! Operations and the call signature ranks publish with every generation.
use crate::{DType, Route};

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    AllReduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    ReduceScatterMany = 4,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 4] = [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::ReduceScatterMany];

    /// snake_case name, as on command lines and in bench output.
    pub const fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::ReduceScatterMany => "reduce_scatter_many",
        }
    }
    /// Parses [`Op::name`].
    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }
    /// Whether the operation evaluates the fixed tree.
    pub const fn reduces(self) -> bool {
        !matches!(self, Op::AllGather)
    }
    const fn from_code(code: u8) -> Option<Op> {
        match code {
            1 => Some(Op::AllReduce),
            2 => Some(Op::AllGather),
            3 => Some(Op::ReduceScatter),
            4 => Some(Op::ReduceScatterMany),
            _ => None,
        }
    }
}

impl core::fmt::Display for Op {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one call asks for, as every rank must agree on it: op, dtype, elements each rank
/// contributes (summed over lanes), lane count and how the lanes split that sum.
///
/// Ranks publish it with each generation; a rank that sees a different one from a peer fails
/// with [`crate::Error::SignatureMismatch`] instead of reading mismatched data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signature {
    pub op: Op,
    pub dtype: DType,
    /// Elements this rank contributes (the staging payload), summed over lanes.
    pub count: u64,
    /// 1, or the lane count of `reduce_scatter_many` (at most [`crate::MAX_LANES`]).
    pub lanes: u16,
    /// `reduce_scatter_many`: [`Signature::lane_split`] of the lanes' element counts, in lane
    /// order; 0 for single-lane calls. Without it, lanes `[4, 8]` on one rank and `[8, 4]` on
    /// another had equal signatures and their trees were silently mixed.
    pub split: u32,
    /// The IPC route the call runs by (validation fills in `IpcOneShot`, the plan the route it
    /// takes). Part of the digest: two ranks taking different protocols for the same call
    /// (a direct user forcing routes differently) get a mismatch, never one rank reading a
    /// frame or flag the other wrote for another protocol.
    pub route: Route,
}

const SIG_MAGIC: u64 = 0xD7;

impl Signature {
    /// A 32-bit, order-sensitive hash of per-lane element counts (FNV-1a over each count's
    /// eight little-endian bytes; never 0). 32 bits because the flag word carries a 32-bit
    /// digest of the whole signature anyway: a wider hash would not make detection stronger.
    pub fn lane_split(counts: impl IntoIterator<Item = u64>) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        for c in counts {
            for b in c.to_le_bytes() {
                h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
            }
        }
        if h == 0 { 1 } else { h }
    }

    /// The `split` of the all_reduce of a fused all_reduce + residual + RMSNorm (a single-lane
    /// call, whose `split` is otherwise 0): an order-sensitive hash of a tag, `hidden` and the
    /// bits of `eps` (never 0). Ranks agreeing on the all_reduce's size but not on the norm's
    /// `hidden` or `eps`, or one rank fusing where another makes a plain all_reduce, then fail
    /// with `SignatureMismatch` instead of each returning another `y`.
    pub fn norm_split(hidden: usize, eps: f32) -> u32 {
        const TAG: u64 = 0x4e4f_524d; // "NORM"
        Signature::lane_split([TAG, hidden as u64, u64::from(eps.to_bits())])
    }

    /// The `split` of a part of a call that a composite route (hierarchical; IPC reduce_scatter
    /// then transport all_gather) runs as smaller collectives: an order-sensitive hash of a tag
    /// and the whole call's packed signature (with its own `split`: a fused call's norm, the lanes of
    /// `reduce_scatter_many`; never 0). Without it the parts were signed as calls of their own,
    /// and two calls whose parts had the same sizes ran each other's parts: at 12 ranks in
    /// nodes of 4, an all_reduce of 100 elements then one of 1 against one of 101 (the same
    /// in-node reduce_scatter of 100, then an all_reduce of 1) returned `Ok` on every rank with
    /// sums mixed across the two calls.
    pub fn part_split(whole: &Signature) -> u32 {
        const TAG: u64 = 0x5041_5254; // "PART"
        let [a, b] = whole.pack();
        Signature::lane_split([TAG, a, b])
    }

    /// The `split` a handle's front door signs its call number `seq` with (`split` the call's
    /// own: a fused call's norm, the lanes of `reduce_scatter_many`, or 0): every call a rank
    /// makes or refuses counts, so a call that one rank refused (its own bad argument) while
    /// its peers made it leaves the ranks' numbers apart, and their next calls fail with
    /// `SignatureMismatch` instead of pairing with the peers' earlier ones (which returned `Ok`
    /// with another call's sums, found by an outside probe on 2026-12-06). Never 0.
    pub fn call_split(seq: u32, split: u32) -> u32 {
        const TAG: u64 = 0x4341_4c4c; // "CALL"
        Signature::lane_split([TAG, u64::from(seq), u64::from(split)])
    }

    /// `own`, the split of a call, hashed with `part` (see [`Signature::as_part`]): `own` when
    /// `part` is 0, `part` when `own` is.
    pub fn join_split(own: u32, part: u32) -> u32 {
        match (part, own) {
            (0, own) => own,
            (part, 0) => part,
            (part, own) => Signature::lane_split([u64::from(own), u64::from(part)]),
        }
    }

    /// This signature as a part of a larger call: `part` ([`Signature::part_split`] of the
    /// whole call; 0: a call of its own) becomes the split of a call that has none, and is
    /// hashed with the split it has (a `reduce_scatter_many`'s lanes) otherwise. The one rule
    /// every backend that signs parts follows.
    pub fn as_part(self, part: u32) -> Signature {
        Signature { split: Signature::join_split(self.split, part), ..self }
    }

    /// Two words: `[magic:8 | op:8 | dtype:8 | route:3 lanes:5 | split:32, count]`, as stored
    /// in a control block (the kernels copy them verbatim).
    pub const fn pack(&self) -> [u64; 2] {
        [
            SIG_MAGIC << 56
                | (self.op as u64) << 48
                | (self.dtype as u64) << 40
                | (self.route.code() as u64) << 37
                | ((self.lanes & 0x1f) as u64) << 32
                | self.split as u64,
            self.count,
        ]
    }
    /// Inverse of [`Signature::pack`]; `None` for words no signature packs to.
    pub const fn unpack(w: [u64; 2]) -> Option<Signature> {
        if w[0] >> 56 != SIG_MAGIC {
            return None;
        }
        let Some(op) = Op::from_code((w[0] >> 48) as u8) else { return None };
        let Some(dtype) = DType::from_code((w[0] >> 40) as u8) else { return None };
        let Some(route) = Route::from_code(((w[0] >> 37) & 7) as u8) else { return None };
        Some(Signature { op, dtype, count: w[1], lanes: ((w[0] >> 32) & 0x1f) as u16, split: w[0] as u32, route })
    }
    /// A 32-bit digest carried in the same word as the generation, so one acquire load sees
    /// both. FNV-1a over the packed words; never zero (zero means "nothing published").
    pub const fn digest(&self) -> u32 {
        Signature::digest_of(self.pack())
    }
    /// [`Signature::digest`] of packed words (what a waiter reads from a peer's signature slot).
    pub const fn digest_of(w: [u64; 2]) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        let mut i = 0;
        while i < 16 {
            let byte = (w[i / 8] >> ((i % 8) * 8)) as u8;
            h = (h ^ byte as u32).wrapping_mul(0x0100_0193);
            i += 1;
        }
        if h == 0 { 1 } else { h }
    }
}

impl core::fmt::Display for Signature {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} {} x {}", self.op, self.dtype, self.count)?;
        if self.lanes != 1 {
            write!(f, " in {} lanes (split {:#010x})", self.lanes, self.split)?;
        } else if self.split != 0 {
            // The split alone cannot say which: the front door's call number (`call_split`), a
            // fused call's norm (`norm_split`), or the whole call a composite route's part
            // belongs to (`part_split`); `Error::SignatureMismatch` says what a difference means.
            write!(f, " signed {:#010x}", self.split)?;
        }
        write!(f, " via {}", self.route.name())
    }
}
