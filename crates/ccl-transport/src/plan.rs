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
//!
//! # Trees over more than 8 inputs
//!
//! The device's tree kernel ([`detcoll_protocol::Device::tree_stacked`]) evaluates the
//! canonical tree of at most 8 inputs. A `tree(...)` above over `W > 8` inputs is planned as
//! passes ([`push_tree`]): pass 1 reduces each block of 8 consecutive inputs (the last block
//! may be partial, even a single input) into its own slot of a scratch region of the
//! workspace, `K = ceil(W / 8)` slots `slot` bytes apart; the next pass treats those `K`
//! partials as its inputs, and so on; the last pass (at most 8 inputs) writes the call's
//! output. By [`block_decomposition`] this is exactly the canonical tree of `W` inputs. The
//! scratch regions of all passes together hold `K + ceil(K/8) + ... ≈ W / 7` slots of one
//! output's size; a plan for `W <= 8` has no pass and no scratch.
//!
//! ```text
//!  W = 20:  pass 1: tree_8(in 0..8) -> p0, tree_8(in 8..16) -> p1, tree_4(in 16..20) -> p2
//!           pass 2: tree_3(p0, p1, p2) -> out
//! ```
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

/// A tree over `world` inputs (1..=[`MAX_TREE_INPUTS`]) stacked in the workspace from
/// `first`, `stride` bytes apart, into `out`: the caller's output, or a scratch slot of a
/// multi-pass tree ([`push_tree`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tree {
    pub first: usize,
    pub stride: usize,
    pub world: usize,
    pub out: Addr,
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

/// The most inputs one tree step takes: the device kernel's limit
/// ([`collective_core::MAX_NODE_WORLD_SIZE`], checked again by
/// [`detcoll_protocol::Device::tree_stacked`]). Larger trees are planned as passes.
pub(crate) const MAX_TREE_INPUTS: usize = collective_core::MAX_NODE_WORLD_SIZE;

/// The block decomposition of the canonical tree, the fact multi-pass trees rest on: for
/// `W > 8`, the canonical tree over `W` inputs equals the canonical tree over the
/// `K = ceil(W / 8)` block partials, block `i` being the canonical tree over inputs
/// `8i .. min(8i + 8, W)` (the last block may be partial, even a single input).
///
/// Proof. The canonical tree of `n >= 2` inputs is the tree of the first `m(n)` plus the tree
/// of the rest, `m(n)` the largest power of two strictly below `n`. Write `W = 8(K-1) + r`,
/// `0 < r <= 8`, `K >= 2`, and let `p = m(K)`, so `p < K <= 2p`. Then `8p <= 8(K-1) < W <=
/// 8K <= 16p`: `8p` is a power of two strictly below `W` and `16p >= W` is not, so
/// `m(W) = 8p`. The top split of `tree_W` thus falls on block boundary `p`, the top split of
/// `tree_K`. Its left part is the first `8p` inputs, `p` full blocks, `p` a power of two: the
/// tree of `8p` inputs is the balanced tree, whose halves, quarters, ... are aligned
/// power-of-two runs of full blocks down to single blocks, i.e. the balanced tree of the `p`
/// block partials, which is `tree_p`. Its right part is the `W - 8p = 8(K-p-1) + r` inputs from
/// block `p` on, again whole blocks with the same (possibly partial) last block: if
/// `K - p = 1` it is that one block, else by induction on `K` it is `tree_{K-p}` over the
/// remaining partials. Both sides mirror `tree_K = tree_p + tree_{K-p}`, so `tree_W` is
/// `tree_K` over the partials. When `K > 8` the same applies to the `K` partials, so passes of
/// at most 8 inputs evaluate any world up to 4096 (`collective_core::MAX_WORLD_SIZE`).
///
/// Returns the block sizes of one pass over `world` inputs: `ceil(world / 8)` blocks, all of
/// 8 inputs but the last (`1..=8`).
pub(crate) fn block_decomposition(world: usize) -> impl Iterator<Item = usize> {
    let blocks = world.div_ceil(MAX_TREE_INPUTS);
    (0..blocks).map(move |i| MAX_TREE_INPUTS.min(world - i * MAX_TREE_INPUTS))
}

/// The tree kernel worlds (1..=8) the plans of a collective of `world` ranks launch: `world`
/// itself when at most 8; else 8, the last block's size of every pass (see
/// [`block_decomposition`]) and the last pass's input count. Each world once, in increasing
/// order; what `Device::load_tree` must load at construction (and nothing else).
pub(crate) fn tree_worlds(world: usize) -> impl Iterator<Item = usize> {
    let mut used = [false; MAX_TREE_INPUTS + 1];
    let mut w = world;
    while w > MAX_TREE_INPUTS {
        for b in block_decomposition(w) {
            used[b] = true;
        }
        w = w.div_ceil(MAX_TREE_INPUTS);
    }
    if w > 0 {
        used[w] = true;
    }
    (1..=MAX_TREE_INPUTS).filter(move |&k| used[k])
}

/// Appends the steps of the canonical tree over `world` inputs stacked `stride` bytes apart
/// from workspace offset `first`, `count` elements of `dtype` each, into the caller's `out`.
///
/// `world <= 8`: one tree step, no scratch. `world > 8`: passes of at most 8 inputs per step
/// (see the module docs and [`block_decomposition`]); pass `j`'s partials go to a scratch
/// region from offset `scratch` on, each region co-aligned with `out` modulo 16 and its slots
/// a multiple of 16 bytes apart (the kernel's vector path then stays available to every pass).
/// Returns the end of the scratch used (`scratch` when none).
#[allow(clippy::too_many_arguments)] // one per dimension of the tree
fn push_tree(
    steps: &mut Vec<Step>,
    op: Op,
    dtype: DType,
    first: usize,
    stride: usize,
    world: usize,
    out: u64,
    count: usize,
    scratch: usize,
) -> Result<usize, Error> {
    let (mut first, mut stride, mut world, mut end) = (first, stride, world, scratch);
    if world > MAX_TREE_INPUTS {
        let slot = mul(op, count, dtype.size())?.checked_next_multiple_of(VECTOR).ok_or_else(|| overflow(op))?;
        while world > MAX_TREE_INPUTS {
            add(op, end, VECTOR)?;
            let region = co_aligned(end, out, 0);
            let mut input = first;
            for (i, inputs) in block_decomposition(world).enumerate() {
                steps.push(Step::Tree(Tree {
                    first: input,
                    stride,
                    world: inputs,
                    out: Addr::Ws(add(op, region, mul(op, i, slot)?)?),
                    count,
                }));
                input = add(op, input, mul(op, inputs, stride)?)?;
            }
            let blocks = world.div_ceil(MAX_TREE_INPUTS);
            end = add(op, region, mul(op, blocks, slot)?)?;
            (first, stride, world) = (region, slot, blocks);
        }
    }
    steps.push(Step::Tree(Tree { first, stride, world, out: Addr::User(out), count }));
    Ok(end)
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

    /// Appends `call`'s tree over the plan's `world` inputs stacked `stride` bytes apart from
    /// `first` ([`push_tree`]: one step, or passes with scratch from `scratch` on). Returns the
    /// workspace end the tree needs (`scratch` when single-pass).
    fn tree(&mut self, call: &Call, first: usize, stride: usize, scratch: usize) -> Result<usize, Error> {
        push_tree(&mut self.steps, call.op, self.dtype, first, stride, self.world, call.dst, call.count_out, scratch)
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
        let gathered = add(call.op, g, mul(call.op, world, b)?)?;
        p.steps.push(Step::Exchange(vec![Transfer::AllGather {
            send: Addr::User(call.src),
            recv: Addr::Ws(g),
            bytes: b,
        }]));
        p.workspace = p.tree(call, g, b, gathered)?;
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
                let gathered = add(call.op, g, mul(call.op, world, b)?)?;
                p.steps.push(Step::Exchange(vec![Transfer::AllGather {
                    send: Addr::User(call.src),
                    recv: Addr::Ws(g),
                    bytes: b,
                }]));
                p.workspace = p.tree(call, g + rank * s, b, gathered)?;
            }
            Exchange::AllToAll => {
                let g = co_aligned(0, call.dst, 0);
                let gathered = add(call.op, g, b)?;
                let mut t = Vec::with_capacity(2 * world);
                for q in 0..world {
                    t.push(Transfer::Send { src: Addr::User(call.src + (q * s) as u64), bytes: s, peer: q });
                    t.push(Transfer::Recv { dst: Addr::Ws(g + q * s), bytes: s, peer: q });
                }
                p.steps.push(Step::Exchange(t));
                p.workspace = p.tree(call, g, s, gathered)?;
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
            let gathered = add(op, g, mul(op, world, payload)?)?;
            p.workspace = gathered;
            for (c, off) in live.iter().zip(&offs) {
                p.steps.push(Step::Pack { src: c.src, dst: *off, bytes: c.bytes_in() });
            }
            p.steps.push(Step::Exchange(vec![Transfer::AllGather {
                send: Addr::Ws(0),
                recv: Addr::Ws(g),
                bytes: payload,
            }]));
            // Lanes run one after another on the stream: they share one scratch region.
            for (c, off) in live.iter().zip(&offs) {
                let first = g + off + rank * c.bytes_out();
                let end = p.tree(c, first, payload, gathered)?;
                p.workspace = p.workspace.max(end);
            }
        } else {
            let mut transfers = Vec::with_capacity(live.len());
            let mut firsts = Vec::with_capacity(live.len());
            let mut end = 0usize;
            for c in &live {
                let r = co_aligned(end, c.dst, rank * c.bytes_out());
                transfers.push(Transfer::AllGather { send: Addr::User(c.src), recv: Addr::Ws(r), bytes: c.bytes_in() });
                firsts.push(r + rank * c.bytes_out());
                end = add(op, r, mul(op, world, c.bytes_in())?)?;
            }
            p.workspace = end;
            p.steps.push(Step::Exchange(transfers));
            // As packed: one scratch region after every lane's gather, shared by the lanes.
            for (c, first) in live.iter().zip(firsts) {
                let used = p.tree(c, first, c.bytes_in(), end)?;
                p.workspace = p.workspace.max(used);
            }
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
        assert_eq!((t.stride, t.world, t.out, t.count), (2000, 4, Addr::User(0x2002), 1000));
        assert_eq!(t.first % 16, 2);
        assert_eq!(p.workspace, t.first + 4 * 2000);
    }

    #[test]
    fn reduce_scatter_reads_only_the_local_shard() {
        let c = call(Op::ReduceScatter, 0x1000, 0x8000, 64, 4);
        let p = Plan::reduce_scatter(&c, 3, 4, Exchange::AllGather).expect("plan");
        let Step::Tree(t) = p.steps[1] else { panic!("{p:?}") };
        assert_eq!((t.first, t.stride, t.world, t.count), (3 * 32, 128, 4, 16));
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

    /// Values whose sums round differently under different parenthesisations: random sign
    /// and mantissa, exponents `lo .. lo + span` (more binades than any mantissa holds).
    fn spread(n: usize, seed: u64, lo: i32, span: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let m = 1.0 + (x & 0xFF_FFFF) as f32 / 16_777_216.0;
                let e = lo + ((x >> 32) % span) as i32;
                let v = m * (e as f32).exp2();
                if x >> 63 == 1 { -v } else { v }
            })
            .collect()
    }

    /// The multi-pass evaluation, written independently of the planner: trees of the blocks
    /// of [`block_decomposition`], then recursively over the partials.
    fn by_blocks<T: fixed_tree::Element>(v: &[T]) -> T {
        if v.len() <= MAX_TREE_INPUTS {
            return fixed_tree::tree_sum(v).expect("1..=8 inputs");
        }
        let mut partials = Vec::new();
        let mut at = 0;
        for b in block_decomposition(v.len()) {
            partials.push(fixed_tree::tree_sum(&v[at..at + b]).expect("a block"));
            at += b;
        }
        assert_eq!(at, v.len());
        by_blocks(&partials)
    }

    /// A wrong association: the left-to-right sum.
    fn sequential<T: fixed_tree::Element>(v: &[T]) -> T {
        v[1..].iter().fold(v[0], |a, &b| a.add(b))
    }

    /// A wrong decomposition: the partial block first (blocks aligned to the end).
    fn partial_first<T: fixed_tree::Element>(v: &[T]) -> T {
        if v.len() <= MAX_TREE_INPUTS {
            return fixed_tree::tree_sum(v).expect("1..=8 inputs");
        }
        let head = v.len() % MAX_TREE_INPUTS;
        let mut partials = Vec::new();
        if head > 0 {
            partials.push(fixed_tree::tree_sum(&v[..head]).expect("a block"));
        }
        partials.extend(v[head..].chunks(MAX_TREE_INPUTS).map(|c| fixed_tree::tree_sum(c).expect("a block")));
        partial_first(&partials)
    }

    /// For every world 1..=300 and 128 columns of values per dtype: the block decomposition
    /// gives `tree_sum`'s bits; and the data has teeth (a sequential sum differs in some
    /// column for W >= 4, blocks aligned to the end for W > 8 not a multiple of 8).
    fn decomposition_holds<T: fixed_tree::Element>(lo: i32, span: u64, conv: impl Fn(f32) -> T) {
        for world in 1..=300usize {
            let cols: Vec<Vec<T>> = (0..128u64)
                .map(|c| spread(world, world as u64 * 1000 + c, lo, span).into_iter().map(&conv).collect())
                .collect();
            let (mut seq_differs, mut partial_differs) = (false, false);
            for v in &cols {
                let want = fixed_tree::tree_sum(v).expect("1..=4096");
                let got = by_blocks(v);
                assert_eq!(got.to_bits_u32(), want.to_bits_u32(), "{} W {world}: {got:?} != {want:?}", T::NAME);
                seq_differs |= sequential(v).to_bits_u32() != want.to_bits_u32();
                partial_differs |= partial_first(v).to_bits_u32() != want.to_bits_u32();
            }
            // (For 3 ranks the canonical tree is the sequential sum.)
            if world >= 4 {
                assert!(seq_differs, "{} W {world}: values blind to association", T::NAME);
            }
            if world > MAX_TREE_INPUTS && world % MAX_TREE_INPUTS != 0 {
                assert!(partial_differs, "{} W {world}: values blind to a wrong block split", T::NAME);
            }
        }
    }

    #[test]
    fn block_decomposition_is_the_canonical_tree() {
        decomposition_holds(-30, 41, |x| x);
        decomposition_holds(-30, 41, half::bf16::from_f32);
        // f16: values below 2^7, so that sums of 300 stay finite.
        decomposition_holds(-8, 14, half::f16::from_f32);
    }

    #[test]
    fn block_sizes_cover_the_world() {
        for world in 1..=4096usize {
            let b: Vec<usize> = block_decomposition(world).collect();
            assert_eq!(b.len(), world.div_ceil(8));
            assert_eq!(b.iter().sum::<usize>(), world);
            assert!(b.iter().all(|&k| (1..=8).contains(&k)));
            assert!(b[..b.len() - 1].iter().all(|&k| k == 8));
        }
    }

    #[test]
    fn tree_worlds_are_the_kernel_worlds_the_plans_launch() {
        let worlds = |w: usize| tree_worlds(w).collect::<Vec<_>>();
        for w in 1..=8 {
            assert_eq!(worlds(w), [w]);
        }
        assert_eq!(worlds(9), [1, 2, 8]);
        assert_eq!(worlds(16), [2, 8]);
        assert_eq!(worlds(17), [1, 3, 8]);
        assert_eq!(worlds(100), [2, 4, 5, 8]);
        assert_eq!(worlds(4096), [8]);
        // Exactly the worlds of the tree steps an all_reduce plan launches: all of them
        // (nothing missing at the first call) and no others (nothing loaded in vain).
        for w in (1..=300).chain([511, 512, 513, 1000, 4095, 4096]) {
            let p = Plan::all_reduce(&call(Op::AllReduce, 0x1000, 0x9000, 3, w), w).expect("plan");
            let mut used: Vec<usize> =
                p.steps.iter().filter_map(|s| if let Step::Tree(t) = s { Some(t.world) } else { None }).collect();
            used.sort_unstable();
            used.dedup();
            assert_eq!(used, worlds(w), "W {w}");
        }
    }

    #[test]
    fn plans_of_8_ranks_or_fewer_are_single_pass() {
        for w in 1..=8 {
            let c = call(Op::AllReduce, 0x1000, 0x2002, 64 * w, w);
            let p = Plan::all_reduce(&c, w).expect("plan");
            let Step::Tree(t) = p.steps[1] else { panic!("{p:?}") };
            assert_eq!(p.steps.len(), 2);
            assert_eq!((t.world, t.out), (w, Addr::User(0x2002)));
            assert_eq!((t.stride, p.workspace), (128 * w, t.first + w * t.stride), "no scratch");
        }
    }

    #[test]
    fn multi_pass_plans_grow_the_workspace_by_about_w_over_7_outputs() {
        for w in [9usize, 16, 17, 64, 65, 100, 4096] {
            let n = 1000usize;
            let c = call(Op::AllReduce, 0x1000, 0x2006, n, w);
            let p = Plan::all_reduce(&c, w).expect("plan");
            let trees: Vec<Tree> =
                p.steps.iter().filter_map(|s| if let Step::Tree(t) = s { Some(*t) } else { None }).collect();
            let gathered = trees[0].first + w * 2 * n;
            let slot = (2 * n).next_multiple_of(VECTOR);
            let mut slots = 0;
            let mut k = w;
            while k > 8 {
                k = k.div_ceil(8);
                slots += k;
            }
            assert!(p.workspace > gathered, "W {w}");
            // Each pass's region starts at most 15 bytes of alignment after the last.
            assert!(p.workspace - gathered <= slots * slot + 16 * 3, "W {w}: {} extra", p.workspace - gathered);
            // K + ceil(K/8) + ...: W/7 up to a slot per pass (ceilings).
            assert!(slots <= w / 7 + 3, "W {w}: {slots} slots");
            // Only the last step writes the output; every scratch output is co-aligned with it
            // and lies inside the workspace, after the gathered inputs.
            let (last, passes) = trees.split_last().expect("trees");
            assert_eq!(last.out, Addr::User(0x2006));
            for t in passes {
                let Addr::Ws(o) = t.out else { panic!("{t:?}") };
                assert!(o >= gathered && o + 2 * n <= p.workspace && o % 16 == 0x2006 % 16, "{t:?}");
                assert!(t.world <= 8);
            }
        }
    }

    #[test]
    fn multi_pass_overflow_is_capacity_exceeded() {
        // The gathered inputs fit, the scratch of the passes does not.
        let w = 9;
        let n = usize::MAX / 2 / 10;
        let c = call(Op::AllReduce, 0, 0x10, n, w);
        assert!(matches!(Plan::all_reduce(&c, w), Err(Error::CapacityExceeded { .. })));
    }

    #[test]
    fn overflow_is_capacity_exceeded() {
        let c = call(Op::AllReduce, 0, 0x10, usize::MAX / 4, 8);
        assert!(matches!(Plan::all_reduce(&c, 8), Err(Error::CapacityExceeded { .. })));
    }
}
