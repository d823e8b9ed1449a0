//! What one call does, as data: copies, NCCL exchanges and local trees over a workspace.
//!
//! Planning is pure (addresses in, steps out), so it is tested on the host against
//! `fixed-tree` for every world size (see `sim.rs`) without a GPU or NCCL.
//!
//! ```text
//!  all_gather:      ncclAllGather(input -> caller's output)                 (no workspace)
//!  all_reduce:      ncclAllGather(input -> ws[G + q*B]) ; tree(ws[G + q*B], q < W) -> out
//!  reduce_scatter:  ncclAllGather(input -> ws[G + q*B]) ; tree(ws[G + q*B + r*S]) -> out
//!     all-to-all:   group{ send(input[q*S] -> q), recv(q -> ws[G + q*S]) } ; tree(ws[G + q*S])
//!  many, packed:    copy lanes -> ws[off_l] ; ncclAllGather(ws[0..P] -> ws[G + q*P]) ;
//!                   per lane: tree(ws[G + q*P + off_l + r*S_l]) -> out_l
//!  many, per lane:  group{ ncclAllGather(input_l -> ws[R_l + q*B_l]) } ;
//!                   per lane: tree(ws[R_l + q*B_l + r*S_l]) -> out_l
//! ```
//!
//! (`B` bytes per rank, `S = B / W` shard bytes, `r` this rank.) Gather regions start at an
//! offset `G`/`R_l` chosen so that the tree's inputs are co-aligned with its output modulo 16
//! bytes: the kernel then takes its 16-byte vector path (when the strides are multiples of 16
//! too) instead of scalar code. The choice is local (it only moves this rank's receive
//! buffer); everything ranks must agree on — the packed layout — depends only on sizes.
use collective_core::{Call, DType, Error, LaneCall, Op};

/// The tree kernel's vector width in bytes.
pub(crate) const VECTOR: usize = 16;

/// A device address: the caller's memory, or an offset into the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Addr {
    User(u64),
    Ws(usize),
}

/// One NCCL call of an exchange (`bytes` are moved as `ncclUint8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transfer {
    AllGather { send: Addr, recv: Addr, bytes: usize },
    Send { src: Addr, bytes: usize, peer: usize },
    Recv { dst: Addr, bytes: usize, peer: usize },
}

/// A tree over `world` inputs stacked in the workspace from `first`, `stride` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tree {
    pub first: usize,
    pub stride: usize,
    pub out: u64,
    pub count: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Device copy of the caller's `src` into the workspace.
    Pack {
        src: u64,
        dst: usize,
        bytes: usize,
    },
    /// NCCL calls issued together (in one group when more than one).
    Exchange(Vec<Transfer>),
    Tree(Tree),
}

/// The steps of one call and the workspace bytes they need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub dtype: DType,
    pub world: usize,
    pub steps: Vec<Step>,
    pub workspace: usize,
}

/// How `reduce_scatter` moves the inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exchange {
    /// Rank-ordered all_gather of whole inputs.
    AllGather,
    /// Each rank receives only the shard it reduces (grouped send/recv).
    AllToAll,
}

fn overflow(op: Op) -> Error {
    Error::CapacityExceeded { op, needed: usize::MAX, capacity: usize::MAX }
}

fn mul(op: Op, a: usize, b: usize) -> Result<usize, Error> {
    a.checked_mul(b).ok_or_else(|| overflow(op))
}

fn add(op: Op, a: usize, b: usize) -> Result<usize, Error> {
    a.checked_add(b).ok_or_else(|| overflow(op))
}

/// The smallest offset `o >= base` with `o + inner ≡ target (mod 16)`: places a receive
/// region so that the byte at `o + inner` is co-aligned with the output address `target`.
pub(crate) fn co_aligned(base: usize, target: u64, inner: usize) -> usize {
    base + (target as usize).wrapping_sub(inner).wrapping_sub(base) % VECTOR
}

impl Plan {
    fn empty(dtype: DType, world: usize) -> Plan {
        Plan { dtype, world, steps: Vec::new(), workspace: 0 }
    }

    /// all_gather straight into the caller's output (in place: NCCL's in-place form, the
    /// contribution already at shard `rank`, which `validate` put in `call.src`).
    pub(crate) fn all_gather(call: &Call, world: usize) -> Plan {
        let mut p = Plan::empty(call.dtype, world);
        let bytes = call.bytes_in();
        if bytes > 0 {
            p.steps.push(Step::Exchange(vec![Transfer::AllGather {
                send: Addr::User(call.src),
                recv: Addr::User(call.dst),
                bytes,
            }]));
        }
        p
    }

    /// all_reduce: gather every input, then the tree into the output.
    pub(crate) fn all_reduce(call: &Call, world: usize) -> Result<Plan, Error> {
        let mut p = Plan::empty(call.dtype, world);
        let b = call.bytes_in();
        if b == 0 {
            return Ok(p);
        }
        let g = co_aligned(0, call.dst, 0);
        p.workspace = add(call.op, g, mul(call.op, world, b)?)?;
        p.steps.push(Step::Exchange(vec![Transfer::AllGather {
            send: Addr::User(call.src),
            recv: Addr::Ws(g),
            bytes: b,
        }]));
        p.steps.push(Step::Tree(Tree { first: g, stride: b, out: call.dst, count: call.count_out }));
        Ok(p)
    }

    /// reduce_scatter: only this rank's shard is reduced (the tree reads shard `rank` of
    /// every gathered input).
    pub(crate) fn reduce_scatter(call: &Call, rank: usize, world: usize, how: Exchange) -> Result<Plan, Error> {
        let mut p = Plan::empty(call.dtype, world);
        let b = call.bytes_in();
        let s = call.bytes_out();
        if s == 0 {
            return Ok(p);
        }
        match how {
            Exchange::AllGather => {
                let g = co_aligned(0, call.dst, rank * s);
                p.workspace = add(call.op, g, mul(call.op, world, b)?)?;
                p.steps.push(Step::Exchange(vec![Transfer::AllGather {
                    send: Addr::User(call.src),
                    recv: Addr::Ws(g),
                    bytes: b,
                }]));
                p.steps.push(Step::Tree(Tree { first: g + rank * s, stride: b, out: call.dst, count: call.count_out }));
            }
            Exchange::AllToAll => {
                let g = co_aligned(0, call.dst, 0);
                p.workspace = add(call.op, g, b)?;
                let mut t = Vec::with_capacity(2 * world);
                for q in 0..world {
                    t.push(Transfer::Send { src: Addr::User(call.src + (q * s) as u64), bytes: s, peer: q });
                    t.push(Transfer::Recv { dst: Addr::Ws(g + q * s), bytes: s, peer: q });
                }
                p.steps.push(Step::Exchange(t));
                p.steps.push(Step::Tree(Tree { first: g, stride: s, out: call.dst, count: call.count_out }));
            }
        }
        Ok(p)
    }

    /// reduce_scatter_many: `packed` gathers all lanes in one all_gather (after copying them
    /// into one payload), otherwise one all_gather per lane in one NCCL group. One tree per
    /// lane either way; lanes never mix. Empty lanes do nothing; a single non-empty lane is
    /// never packed (the copy would be pure overhead).
    pub(crate) fn many(lanes: &[LaneCall], rank: usize, world: usize, packed: bool) -> Result<Plan, Error> {
        let op = Op::ReduceScatterMany;
        let dtype = lanes.first().map_or(DType::F32, |l| l.call.dtype);
        let mut p = Plan::empty(dtype, world);
        let live: Vec<&Call> = lanes.iter().map(|l| &l.call).filter(|c| c.bytes_out() > 0).collect();
        if live.is_empty() {
            return Ok(p);
        }
        if packed && live.len() > 1 {
            // Rank-independent layout: lane offsets depend only on sizes (equal on all ranks).
            let mut offs = Vec::with_capacity(live.len());
            let mut end = 0usize;
            for c in &live {
                let off = end.next_multiple_of(VECTOR);
                offs.push(off);
                end = add(op, off, c.bytes_in())?;
            }
            let payload = end.next_multiple_of(VECTOR);
            let first = live[0];
            let g = co_aligned(payload, first.dst, offs[0] + rank * first.bytes_out());
            p.workspace = add(op, g, mul(op, world, payload)?)?;
            for (c, off) in live.iter().zip(&offs) {
                p.steps.push(Step::Pack { src: c.src, dst: *off, bytes: c.bytes_in() });
            }
            p.steps.push(Step::Exchange(vec![Transfer::AllGather {
                send: Addr::Ws(0),
                recv: Addr::Ws(g),
                bytes: payload,
            }]));
            for (c, off) in live.iter().zip(&offs) {
                let first = g + off + rank * c.bytes_out();
                p.steps.push(Step::Tree(Tree { first, stride: payload, out: c.dst, count: c.count_out }));
            }
        } else {
            let mut transfers = Vec::with_capacity(live.len());
            let mut trees = Vec::with_capacity(live.len());
            let mut end = 0usize;
            for c in &live {
                let r = co_aligned(end, c.dst, rank * c.bytes_out());
                transfers.push(Transfer::AllGather { send: Addr::User(c.src), recv: Addr::Ws(r), bytes: c.bytes_in() });
                trees.push(Step::Tree(Tree {
                    first: r + rank * c.bytes_out(),
                    stride: c.bytes_in(),
                    out: c.dst,
                    count: c.count_out,
                }));
                end = add(op, r, mul(op, world, c.bytes_in())?)?;
            }
            p.workspace = end;
            p.steps.push(Step::Exchange(transfers));
            p.steps.extend(trees);
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(op: Op, src: u64, dst: u64, n: usize, world: usize) -> Call {
        let count_out = if matches!(op, Op::ReduceScatter | Op::ReduceScatterMany) { n / world } else { n };
        Call { op, dtype: DType::BF16, src, dst, count_in: n, count_out, in_place: false }
    }

    #[test]
    fn co_aligned_matches_the_target_modulo_16() {
        for base in [0usize, 5, 16, 1000] {
            for target in [0u64, 2, 14, 0x1000_0006] {
                for inner in [0usize, 2, 6, 4098] {
                    let o = co_aligned(base, target, inner);
                    assert!(o >= base && o < base + 16);
                    assert_eq!((o + inner) % 16, target as usize % 16);
                }
            }
        }
    }

    #[test]
    fn all_reduce_gathers_then_reduces_into_the_output() {
        let c = call(Op::AllReduce, 0x1000, 0x2002, 1000, 4);
        let p = Plan::all_reduce(&c, 4).expect("plan");
        assert_eq!(p.steps.len(), 2);
        let Step::Tree(t) = p.steps[1] else { panic!("{p:?}") };
        assert_eq!((t.stride, t.out, t.count), (2000, 0x2002, 1000));
        assert_eq!(t.first % 16, 2);
        assert_eq!(p.workspace, t.first + 4 * 2000);
    }

    #[test]
    fn reduce_scatter_reads_only_the_local_shard() {
        let c = call(Op::ReduceScatter, 0x1000, 0x8000, 64, 4);
        let p = Plan::reduce_scatter(&c, 3, 4, Exchange::AllGather).expect("plan");
        let Step::Tree(t) = p.steps[1] else { panic!("{p:?}") };
        assert_eq!((t.first, t.stride, t.count), (3 * 32, 128, 16));
        let p = Plan::reduce_scatter(&c, 3, 4, Exchange::AllToAll).expect("plan");
        let Step::Exchange(ts) = &p.steps[0] else { panic!("{p:?}") };
        assert_eq!(ts.len(), 8);
        assert_eq!(ts[2], Transfer::Send { src: Addr::User(0x1000 + 32), bytes: 32, peer: 1 });
        assert_eq!(p.workspace, 128);
    }

    #[test]
    fn empty_calls_do_nothing() {
        assert!(Plan::all_reduce(&call(Op::AllReduce, 8, 16, 0, 2), 2).expect("plan").steps.is_empty());
        assert!(Plan::all_gather(&call(Op::AllGather, 8, 16, 0, 2), 2).steps.is_empty());
        assert!(Plan::many(&[], 0, 2, true).expect("plan").steps.is_empty());
    }

    #[test]
    fn overflow_is_capacity_exceeded() {
        let c = call(Op::AllReduce, 0, 0x10, usize::MAX / 4, 8);
        assert!(matches!(Plan::all_reduce(&c, 8), Err(Error::CapacityExceeded { .. })));
    }
}
