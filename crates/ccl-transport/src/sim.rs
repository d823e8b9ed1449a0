//! Host simulation of plans (tests only): every rank's plan runs over host arenas, NCCL's
//! all_gather and send/recv are emulated, and each tree step is `fixed-tree`'s tree of its (at
//! most 8) inputs. This checks, for worlds 1 to 8 and for multi-pass worlds up to 4096 without
//! a GPU, that the plans' addresses and layouts give the fixed tree's bits over all `W` ranks,
//! write nothing outside the output, never ask the kernel for more than 8 inputs, and issue
//! matching calls on every rank.
use crate::plan::{Addr, Exchange, MAX_TREE_INPUTS, Plan, Step, Transfer, VECTOR};
use collective_core::conformance::data::{compare, finite_values, reference_reduce, special_values};
use collective_core::{DType, Io, Op, RawMut, RawRef, validate, validate_many};
use half::{bf16, f16};
use std::collections::HashMap;

/// Fake device address of every rank's arena (ranks have separate address spaces).
const BASE: u64 = 0x7f00_0000_0000;
const GUARD: u8 = 0xA5;
const WS_JUNK: u8 = 0xEE;

struct Rank {
    arena: Vec<u8>,
    ws: Vec<u8>,
}

impl Rank {
    fn user(&self, a: u64, n: usize) -> &[u8] {
        let o = (a - BASE) as usize;
        &self.arena[o..o + n]
    }
    fn user_mut(&mut self, a: u64, n: usize) -> &mut [u8] {
        let o = (a - BASE) as usize;
        &mut self.arena[o..o + n]
    }
    fn read(&self, a: Addr, n: usize) -> Vec<u8> {
        match a {
            Addr::User(p) => self.user(p, n).to_vec(),
            Addr::Ws(o) => self.ws[o..o + n].to_vec(),
        }
    }
    fn write(&mut self, a: Addr, data: &[u8]) {
        match a {
            Addr::User(p) => self.user_mut(p, data.len()).copy_from_slice(data),
            Addr::Ws(o) => self.ws[o..o + data.len()].copy_from_slice(data),
        }
    }
}

/// The shape of a plan that every rank must agree on: step kinds, and per exchange the NCCL
/// calls' kinds and all_gather sizes (send/recv are matched pairwise instead).
fn shape(p: &Plan) -> Vec<(u8, Vec<(u8, usize)>)> {
    p.steps
        .iter()
        .map(|s| match s {
            Step::Pack { .. } => (0, Vec::new()),
            Step::Tree(_) => (2, Vec::new()),
            Step::Exchange(ts) => (
                1,
                ts.iter()
                    .map(|t| match *t {
                        Transfer::AllGather { bytes, .. } => (0, bytes),
                        Transfer::Send { .. } => (1, 0),
                        Transfer::Recv { .. } => (2, 0),
                    })
                    .collect(),
            ),
        })
        .collect()
}

/// Runs the local steps `steps` of one rank (packs and trees) on its memory.
fn local(r: &mut Rank, p: &Plan, steps: &[Step]) {
    for step in steps {
        match *step {
            Step::Pack { src, dst, bytes } => {
                let data = r.user(src, bytes).to_vec();
                r.write(Addr::Ws(dst), &data);
            }
            Step::Tree(t) => {
                assert!((1..=MAX_TREE_INPUTS).contains(&t.world), "a tree step of {} inputs: {t:?}", t.world);
                let bytes = t.count * p.dtype.size();
                let inputs: Vec<Vec<u8>> =
                    (0..t.world).map(|q| r.ws[t.first + q * t.stride..][..bytes].to_vec()).collect();
                if let Addr::Ws(o) = t.out {
                    // The kernel's contract: the output overlaps no input.
                    let disjoint = (0..t.world).all(|q| {
                        let i = t.first + q * t.stride;
                        o + bytes <= i || i + bytes <= o
                    });
                    assert!(disjoint, "a tree step writes over its own input: {t:?}");
                }
                let out = reference_reduce(&inputs, p.dtype);
                r.write(t.out, &out);
            }
            Step::Exchange(_) => unreachable!("local steps only"),
        }
    }
}

/// Runs the plans of `world` ranks — rank `q`'s memory and plan built by `setup(q)` — and
/// returns the ranks in `keep` (in order) after their plans ran; panics on any inconsistency
/// between ranks (different step shapes, all_gather sizes, unmatched send/recv).
///
/// Every plan is local steps, at most one exchange, local steps. Every rank runs its steps up
/// to the exchange and hands over what it sends (all sends read before any receive writes:
/// NCCL's group semantics); only the ranks in `keep` keep their memory and run the rest, so a
/// world of 4096 ranks is simulated in the memory of a few.
fn simulate(world: usize, keep: &[usize], mut setup: impl FnMut(usize) -> (Rank, Plan)) -> Vec<(Rank, Plan)> {
    let mut want_shape = None;
    // Per all_gather call of the exchange: every rank's send bytes, in rank order.
    let mut gathers: Vec<Vec<u8>> = Vec::new();
    // (from, to) -> bytes of a send to a kept rank.
    let mut sends: HashMap<(usize, usize), Vec<u8>> = HashMap::new();
    let mut kept = Vec::new();
    for q in 0..world {
        let (mut r, p) = setup(q);
        let sh = shape(&p);
        match &want_shape {
            None => want_shape = Some(sh),
            Some(w) => assert_eq!(w, &sh, "rank {q} planned a different shape than rank 0"),
        }
        let ex = p.steps.iter().position(|s| matches!(s, Step::Exchange(_)));
        assert!(p.steps.iter().filter(|s| matches!(s, Step::Exchange(_))).count() <= 1, "several exchanges");
        let before = &p.steps[..ex.unwrap_or(p.steps.len())];
        let keeps = keep.contains(&q);
        // A rank that is not kept needs only the workspace its packs and sends touch.
        let touched = if keeps {
            p.workspace
        } else {
            let mut end = 0;
            for s in &p.steps {
                match s {
                    Step::Pack { dst, bytes, .. } => end = end.max(dst + bytes),
                    Step::Exchange(ts) => {
                        for t in ts {
                            match *t {
                                Transfer::AllGather { send: Addr::Ws(o), bytes, .. }
                                | Transfer::Send { src: Addr::Ws(o), bytes, .. } => end = end.max(o + bytes),
                                _ => {}
                            }
                        }
                    }
                    Step::Tree(_) => {}
                }
            }
            end
        };
        assert!(touched <= p.workspace, "rank {q} touches workspace beyond its plan's {}", p.workspace);
        r.ws = vec![WS_JUNK; touched];
        local(&mut r, &p, before);
        if let Some(i) = ex {
            let Step::Exchange(ts) = &p.steps[i] else { unreachable!() };
            let mut g = 0;
            for t in ts {
                match *t {
                    Transfer::AllGather { send, bytes, .. } => {
                        if gathers.len() <= g {
                            gathers.push(Vec::new());
                        }
                        gathers[g].extend_from_slice(&r.read(send, bytes));
                        g += 1;
                    }
                    Transfer::Send { src, bytes, peer } => {
                        assert!(peer < world, "rank {q} sends to rank {peer}");
                        if keep.contains(&peer) {
                            let old = sends.insert((q, peer), r.read(src, bytes));
                            assert!(old.is_none(), "rank {q} sends to {peer} twice in one exchange");
                        }
                    }
                    Transfer::Recv { .. } => {}
                }
            }
        }
        if keeps {
            kept.push((q, r, p, ex));
        }
    }
    let mut out = Vec::new();
    for &k in keep {
        let (q, mut r, p, ex) = kept.iter().position(|e| e.0 == k).map(|i| kept.swap_remove(i)).expect("kept");
        if let Some(i) = ex {
            let Step::Exchange(ts) = &p.steps[i] else { unreachable!() };
            let mut writes: Vec<(Addr, Vec<u8>)> = Vec::new();
            let mut g = 0;
            for t in ts {
                match *t {
                    Transfer::AllGather { recv, .. } => {
                        writes.push((recv, gathers[g].clone()));
                        g += 1;
                    }
                    Transfer::Recv { dst, bytes, peer } => {
                        let data = sends
                            .remove(&(peer, q))
                            .unwrap_or_else(|| panic!("rank {q} receives from {peer} without a matching send"));
                        assert_eq!(data.len(), bytes, "send/recv sizes differ");
                        writes.push((dst, data));
                    }
                    Transfer::Send { .. } => {}
                }
            }
            for (at, data) in writes {
                r.write(at, &data);
            }
        }
        local(&mut r, &p, &p.steps[ex.map_or(p.steps.len(), |i| i + 1)..]);
        out.push((r, p));
    }
    assert!(sends.is_empty(), "sends nobody received: {:?}", sends.keys().collect::<Vec<_>>());
    out
}

/// What the inputs hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Data {
    /// `finite_values`: mixed magnitudes and signs (8-leaf sums finite).
    Finite,
    /// `special_values`: ±0, subnormals, extremes, ±inf, NaN, ties.
    Special,
    /// [`adversarial`]: magnitudes spread over more than the mantissa, sums finite for any
    /// world up to 4096, so a wrong association changes the bits.
    Adversarial,
}

/// `n` values of `dtype` whose sums round differently under different parenthesisations: a
/// random sign and mantissa, and an exponent spread over more binades than the mantissa holds,
/// capped so that the sum of 4096 of them stays finite (f16's range is the binding one).
fn adversarial(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = collective_core::conformance::data::Rng::new(seed);
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        let r = rng.next_u64();
        let neg = r >> 63 == 1;
        let mant = 1.0 + (r & 0xFFFF) as f32 / 65536.0;
        let v = |lo: i32, span: u64| {
            let e = lo + ((r >> 32) % span) as i32;
            let x = mant * (e as f32).exp2();
            if neg { -x } else { x }
        };
        match dtype {
            DType::F32 => out.extend_from_slice(&v(-30, 40).to_bits().to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f32(v(-8, 11)).to_bits().to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f32(v(-20, 30)).to_bits().to_le_bytes()),
            other => panic!("{other} is not reducible"),
        }
    }
    out
}

/// Bytes of `dtype` values for `n` elements of rank `rank`.
fn values(dtype: DType, n: usize, seed: u64, rank: usize, data: Data) -> Vec<u8> {
    let seed = seed ^ (rank as u64) << 32;
    match data {
        Data::Finite => finite_values(dtype, n, seed),
        Data::Special => special_values(dtype, n, rank),
        Data::Adversarial => adversarial(dtype, n, seed),
    }
}

/// Every rank of `world`.
fn all(world: usize) -> Vec<usize> {
    (0..world).collect()
}

/// A few ranks of `world`: the first, the last, and ranks in and next to the middle.
fn some(world: usize) -> Vec<usize> {
    let mut k = vec![0, world / 2, (world / 2 + 1) % world, world - 1];
    k.sort_unstable();
    k.dedup();
    k
}

/// The left-to-right sum of `inputs` (a wrong association for any world above 3): adversarial
/// data must give different bits for it somewhere, or the case could not catch a wrong tree.
fn sequential(inputs: &[Vec<u8>], dtype: DType) -> Vec<u8> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        acc = reference_reduce(&[acc, x.clone()], dtype);
    }
    acc
}

/// Asserts that adversarial inputs of `world >= 4` ranks tell the canonical tree from a
/// sequential sum (the data has teeth; for 3 ranks the two are the same tree). Checked for 9
/// elements or more: one element alone may happen to round alike under both.
fn assert_association_visible(inputs: &[Vec<u8>], full: &[u8], dtype: DType, label: &str) {
    if inputs.len() >= 4 && full.len() >= 9 * dtype.size() {
        assert!(compare(&sequential(inputs, dtype), full, dtype).is_err(), "{label}: data blind to association");
    }
}

/// One single-lane case on every rank: builds arenas, validates, plans, simulates and checks
/// the ranks in `keep`.
#[allow(clippy::too_many_arguments)] // one parameter per dimension of the case matrix
fn single(
    op: Op,
    dtype: DType,
    n: usize,
    world: usize,
    in_place: bool,
    offs: (usize, usize),
    how: Exchange,
    data: Data,
    keep: &[usize],
) {
    let size = dtype.size();
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| values(dtype, n, n as u64 * 31 + world as u64, r, data)).collect();
    let label = format!("{op:?} {dtype} n {n} world {world} in_place {in_place} offs {offs:?} {how:?} {data:?}");
    let full = if op == Op::AllGather { Vec::new() } else { reference_reduce(&inputs, dtype) };
    if data == Data::Adversarial && op != Op::AllGather {
        assert_association_visible(&inputs, &full, dtype, &label);
    }
    let shard = n / world * size;
    let mut outs = HashMap::new();
    let ranks = simulate(world, keep, |rank| {
        let mine = &inputs[rank];
        let (want, out_len) = match op {
            Op::AllReduce => (full.clone(), n),
            Op::AllGather => (inputs.concat(), n * world),
            _ => (full[rank * shard..(rank + 1) * shard].to_vec(), n / world),
        };
        let in_at = 64 + offs.0 * size;
        let buf_len = if op == Op::AllGather { n * world } else { n };
        let out_at = (in_at + buf_len * size + 64).next_multiple_of(VECTOR) + offs.1 * size;
        let mut arena = vec![GUARD; out_at + out_len * size + 64];
        if in_place && op == Op::AllGather {
            arena[in_at + rank * n * size..][..n * size].copy_from_slice(mine);
        } else {
            arena[in_at..in_at + n * size].copy_from_slice(mine);
        }
        let a = |o: usize| BASE + o as u64;
        // SAFETY: fake addresses, never dereferenced: only validated and planned.
        let io = unsafe {
            if in_place {
                Io::InPlace(RawMut::from_raw(a(in_at), buf_len, dtype))
            } else {
                Io::OutOfPlace {
                    input: RawRef::from_raw(a(in_at), n, dtype),
                    output: RawMut::from_raw(a(out_at), out_len, dtype),
                }
            }
        };
        let call = validate(op, &io, rank, world, usize::MAX).expect("valid call");
        let plan = match op {
            Op::AllGather => Plan::all_gather(&call, world),
            Op::AllReduce => Plan::all_reduce(&call, world).expect("plan"),
            _ => Plan::reduce_scatter(&call, rank, world, how).expect("plan"),
        };
        if keep.contains(&rank) {
            outs.insert(rank, (call.dst, want, arena.clone()));
        }
        (Rank { arena, ws: Vec::new() }, plan)
    });
    for (&rank, (r, _)) in keep.iter().zip(&ranks) {
        let (dst, want, before) = outs.remove(&rank).expect("kept");
        let label = format!("{label} rank {rank}");
        let o = (dst - BASE) as usize;
        compare(&r.arena[o..o + want.len()], &want, dtype).unwrap_or_else(|e| panic!("{label}: {e}"));
        let outside =
            r.arena.iter().zip(&before).enumerate().find(|(i, (x, y))| x != y && !(o..o + want.len()).contains(i));
        assert!(outside.is_none(), "{label}: wrote outside the output at byte {:?}", outside.map(|(i, _)| i));
    }
}

#[test]
fn single_lane_plans_give_the_fixed_tree_for_every_world() {
    for world in [1usize, 2, 4, 8] {
        for dtype in DType::REDUCIBLE {
            for n in [world, 7 * world, 1001 * world] {
                for in_place in [false, true] {
                    for offs in [(0, 0), (1, 3), (3, 1)] {
                        let k = &all(world);
                        single(Op::AllReduce, dtype, n, world, in_place, offs, Exchange::AllGather, Data::Finite, k);
                        single(Op::AllGather, dtype, n, world, in_place, offs, Exchange::AllGather, Data::Finite, k);
                        for how in [Exchange::AllGather, Exchange::AllToAll] {
                            single(Op::ReduceScatter, dtype, n, world, in_place, offs, how, Data::Finite, k);
                        }
                    }
                }
            }
            let n = 16 * 16 * 16 * world;
            single(Op::AllReduce, dtype, n, world, false, (0, 0), Exchange::AllGather, Data::Special, &all(world));
            single(Op::ReduceScatter, dtype, n, world, true, (0, 1), Exchange::AllToAll, Data::Special, &all(world));
        }
    }
}

/// The worlds above one kernel tree (8 inputs): one pass and a partial last block (9, 12, 17),
/// full blocks (16, 24, 64), two passes (65, 100: K = 9, 13) and the largest (4096: 512, 64
/// and 8 partials, three passes plus the last).
const PASS_WORLDS: [usize; 9] = [9, 12, 16, 17, 24, 64, 65, 100, 4096];

/// Every rank for worlds up to 100, a few ranks of 4096.
fn keep_of(world: usize) -> Vec<usize> {
    if world <= 100 { all(world) } else { some(world) }
}

#[test]
fn single_lane_plans_give_the_fixed_tree_above_8_ranks() {
    for world in PASS_WORLDS {
        let keep = keep_of(world);
        for dtype in DType::REDUCIBLE {
            for data in [Data::Adversarial, Data::Finite, Data::Special] {
                // all_reduce needs no divisibility: small counts, including one element.
                for (n, offs) in [(1, (0, 0)), (3, (1, 3)), (17, (3, 1))] {
                    if data != Data::Special || n > 1 {
                        single(Op::AllReduce, dtype, n, world, false, offs, Exchange::AllGather, data, &keep);
                    }
                }
                single(Op::AllReduce, dtype, 9, world, true, (1, 0), Exchange::AllGather, data, &keep);
                // reduce_scatter: one and three elements per shard (one at 4096: its reference
                // is a tree over 4096 inputs of 4096 elements), both exchanges.
                let shards: &[_] = if world > 100 {
                    &[(world, true, (1, 3))]
                } else {
                    &[(world, false, (0, 0)), (3 * world, true, (1, 3))]
                };
                for &(n, in_place, offs) in shards {
                    for how in [Exchange::AllGather, Exchange::AllToAll] {
                        single(Op::ReduceScatter, dtype, n, world, in_place, offs, how, data, &keep);
                    }
                }
            }
        }
        // all_gather has no tree, but its plan must not refuse the world.
        single(Op::AllGather, DType::BF16, 2, world, true, (0, 0), Exchange::AllGather, Data::Finite, &keep);
    }
}

#[test]
fn empty_calls_plan_nothing_on_every_rank() {
    for world in [1usize, 2, 8, 9, 100] {
        for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
            single(op, DType::F16, 0, world, false, (0, 0), Exchange::AllGather, Data::Finite, &all(world));
        }
    }
}

/// reduce_scatter_many with lane 0 in place (when several lanes), packed or per lane; lane 1
/// holds special values, the others `data`; the ranks in `keep` are checked.
fn many(dtype: DType, lane_sizes: &[usize], world: usize, packed: bool, data: Data, keep: &[usize]) {
    let size = dtype.size();
    let lanes_in: Vec<Vec<Vec<u8>>> = lane_sizes
        .iter()
        .enumerate()
        .map(|(l, &n)| {
            let d = if l == 1 { Data::Special } else { data };
            (0..world).map(|r| values(dtype, n, l as u64 + 77, r, d)).collect()
        })
        .collect();
    let label = format!("many {dtype} {lane_sizes:?} world {world} packed {packed} {data:?}");
    let fulls: Vec<Vec<u8>> = lanes_in.iter().map(|l| reference_reduce(l, dtype)).collect();
    if data == Data::Adversarial {
        assert_association_visible(&lanes_in[0], &fulls[0], dtype, &label);
    }
    let mut expect = HashMap::new();
    let ranks = simulate(world, keep, |rank| {
        let mut arena = vec![GUARD; 64];
        let mut ats = Vec::new();
        for (l, &n) in lane_sizes.iter().enumerate() {
            let in_at = arena.len() + l % 3 * size;
            arena.resize(in_at, GUARD);
            arena.extend_from_slice(&lanes_in[l][rank]);
            let out_at = arena.len() + 64 + (l + 1) % 2 * size;
            arena.resize(out_at + n / world * size + 64, GUARD);
            ats.push((in_at, out_at, n));
        }
        let a = |o: usize| BASE + o as u64;
        let in_place = |l: usize| l == 0 && lane_sizes.len() > 1;
        // SAFETY: fake addresses, never dereferenced.
        let ios: Vec<Io<'_>> = ats
            .iter()
            .enumerate()
            .map(|(l, &(i, o, n))| unsafe {
                if in_place(l) {
                    Io::InPlace(RawMut::from_raw(a(i), n, dtype))
                } else {
                    Io::OutOfPlace {
                        input: RawRef::from_raw(a(i), n, dtype),
                        output: RawMut::from_raw(a(o), n / world, dtype),
                    }
                }
            })
            .collect();
        let (calls, _) = validate_many(&ios, rank, world, usize::MAX).expect("valid lanes");
        let plan = Plan::many(&calls, rank, world, packed).expect("plan");
        if keep.contains(&rank) {
            let wants: Vec<(u64, Vec<u8>)> = calls
                .iter()
                .enumerate()
                .map(|(l, c)| {
                    let s = c.call.bytes_out();
                    (c.call.dst, fulls[l][rank * s..(rank + 1) * s].to_vec())
                })
                .collect();
            expect.insert(rank, (wants, arena.clone()));
        }
        (Rank { arena, ws: Vec::new() }, plan)
    });
    for (&rank, (r, _)) in keep.iter().zip(&ranks) {
        let (wants, before) = expect.remove(&rank).expect("kept");
        let label = format!("{label} rank {rank}");
        let mut allowed = Vec::new();
        for (l, (dst, want)) in wants.iter().enumerate() {
            let o = (dst - BASE) as usize;
            compare(&r.arena[o..o + want.len()], want, dtype).unwrap_or_else(|e| panic!("{label} lane {l}: {e}"));
            allowed.push(o..o + want.len());
        }
        let outside = r
            .arena
            .iter()
            .zip(&before)
            .enumerate()
            .find(|(i, (x, y))| x != y && !allowed.iter().any(|a| a.contains(i)));
        assert!(outside.is_none(), "{label}: wrote outside the outputs at byte {:?}", outside.map(|(i, _)| i));
    }
}

#[test]
fn many_lane_plans_give_one_fixed_tree_per_lane() {
    for world in [1usize, 2, 4, 8] {
        for dtype in DType::REDUCIBLE {
            for lanes in
                [vec![world], vec![16 * world, 3 * world], vec![world, 1000 * world, 7 * world], vec![0, 5 * world, 0]]
            {
                for packed in [false, true] {
                    many(dtype, &lanes, world, packed, Data::Finite, &all(world));
                }
            }
        }
    }
}

#[test]
fn many_lane_plans_give_one_fixed_tree_per_lane_above_8_ranks() {
    for world in PASS_WORLDS {
        let keep = keep_of(world);
        for dtype in DType::REDUCIBLE {
            // Lanes share the multi-pass scratch: a lane's passes must not disturb the next's.
            let lanes: &[Vec<usize>] = if world > 100 {
                &[vec![world, world]]
            } else {
                &[vec![world], vec![3 * world, world, 2 * world], vec![0, world, 0, 2 * world]]
            };
            for lanes in lanes {
                for packed in [false, true] {
                    for data in [Data::Adversarial, Data::Finite] {
                        many(dtype, lanes, world, packed, data, &keep);
                    }
                }
            }
        }
    }
}

#[test]
fn packed_layout_is_the_same_on_every_rank() {
    // The all_gather payload and lane offsets may depend only on sizes, never on addresses.
    let world = 4;
    let dtype = DType::BF16;
    let mut payloads = Vec::new();
    for rank in 0..world {
        let base = BASE + 2 * rank as u64;
        // SAFETY: fake addresses, never dereferenced.
        let ios: Vec<Io<'_>> = (0..3u64)
            .map(|l| unsafe {
                Io::OutOfPlace {
                    input: RawRef::from_raw(base + l * 0x10000, 12 * world, dtype),
                    output: RawMut::from_raw(base + l * 0x10000 + 0x8000 + 2 * l, 12, dtype),
                }
            })
            .collect();
        let (calls, _) = validate_many(&ios, rank, world, usize::MAX).expect("valid");
        let p = Plan::many(&calls, rank, world, true).expect("plan");
        let packs: Vec<(usize, usize)> = p
            .steps
            .iter()
            .filter_map(|s| if let Step::Pack { dst, bytes, .. } = s { Some((*dst, *bytes)) } else { None })
            .collect();
        let gather = p.steps.iter().find_map(|s| if let Step::Exchange(t) = s { Some(t.clone()) } else { None });
        let Some([Transfer::AllGather { bytes, send: Addr::Ws(0), .. }]) = gather.as_deref() else { panic!("{p:?}") };
        payloads.push((packs, *bytes));
    }
    assert!(payloads.windows(2).all(|w| w[0] == w[1]), "{payloads:?}");
}
