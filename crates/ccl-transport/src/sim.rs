//! Host simulation of plans (tests only): every rank's plan runs in lockstep over host
//! arenas, NCCL's all_gather and send/recv are emulated, and the tree is `fixed-tree`'s. This
//! checks, for worlds 1/2/4/8 without a GPU, that the plans' addresses and layouts give the
//! fixed tree's bits, write nothing outside the output, and issue matching calls on every
//! rank.
use crate::plan::{Addr, Exchange, Plan, Step, Transfer, VECTOR};
use collective_core::conformance::data::{compare, finite_values, reference_reduce, special_values};
use collective_core::{DType, Io, Op, RawMut, RawRef, validate, validate_many};

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

/// Runs every rank's plan; panics on any inconsistency between ranks.
fn simulate(ranks: &mut [Rank], plans: &[Plan]) {
    let world = ranks.len();
    for (r, p) in ranks.iter_mut().zip(plans) {
        r.ws = vec![WS_JUNK; p.workspace];
    }
    let steps = plans[0].steps.len();
    assert!(plans.iter().all(|p| p.steps.len() == steps), "ranks planned different step counts");
    for i in 0..steps {
        match &plans[0].steps[i] {
            Step::Pack { .. } => {
                for (r, p) in ranks.iter_mut().zip(plans) {
                    let Step::Pack { src, dst, bytes } = p.steps[i] else { panic!("ranks disagree on step {i}") };
                    let data = r.user(src, bytes).to_vec();
                    r.write(Addr::Ws(dst), &data);
                }
            }
            Step::Exchange(first) => {
                let lists: Vec<&Vec<Transfer>> = plans
                    .iter()
                    .map(|p| match &p.steps[i] {
                        Step::Exchange(t) => t,
                        _ => panic!("ranks disagree on step {i}"),
                    })
                    .collect();
                assert!(lists.iter().all(|l| l.len() == first.len()), "ranks issue different numbers of NCCL calls");
                // All sends/gathers read before any receive writes (NCCL's group semantics).
                let mut writes: Vec<(usize, Addr, Vec<u8>)> = Vec::new();
                for k in 0..first.len() {
                    match first[k] {
                        Transfer::AllGather { bytes, .. } => {
                            let sends: Vec<Vec<u8>> = (0..world)
                                .map(|q| match lists[q][k] {
                                    Transfer::AllGather { send, bytes: b, .. } => {
                                        assert_eq!(b, bytes, "all_gather sizes differ between ranks");
                                        ranks[q].read(send, b)
                                    }
                                    _ => panic!("ranks disagree on call {k}"),
                                })
                                .collect();
                            for (r, list) in lists.iter().enumerate() {
                                let Transfer::AllGather { recv, .. } = list[k] else { unreachable!() };
                                writes.push((r, recv, sends.concat()));
                            }
                        }
                        Transfer::Send { .. } | Transfer::Recv { .. } => {}
                    }
                }
                for (r, list) in lists.iter().enumerate() {
                    for t in list.iter() {
                        if let Transfer::Recv { dst, bytes, peer } = *t {
                            let matching: Vec<Vec<u8>> = lists[peer]
                                .iter()
                                .filter_map(|s| match *s {
                                    Transfer::Send { src, bytes: b, peer: to } if to == r => {
                                        assert_eq!(b, bytes, "send/recv sizes differ");
                                        Some(ranks[peer].read(src, b))
                                    }
                                    _ => None,
                                })
                                .collect();
                            assert_eq!(
                                matching.len(),
                                1,
                                "rank {r} receives from {peer} without exactly one matching send"
                            );
                            writes.push((r, dst, matching.into_iter().next().unwrap_or_default()));
                        }
                    }
                }
                for (r, at, data) in writes {
                    ranks[r].write(at, &data);
                }
            }
            Step::Tree(_) => {
                for (r, p) in ranks.iter_mut().zip(plans) {
                    let Step::Tree(t) = p.steps[i] else { panic!("ranks disagree on step {i}") };
                    let bytes = t.count * p.dtype.size();
                    let inputs: Vec<Vec<u8>> =
                        (0..p.world).map(|q| r.ws[t.first + q * t.stride..][..bytes].to_vec()).collect();
                    let out = reference_reduce(&inputs, p.dtype);
                    r.user_mut(t.out, bytes).copy_from_slice(&out);
                }
            }
        }
    }
}

/// Bytes of `dtype` values for `n` elements: finite randoms or the special-value pattern.
fn values(dtype: DType, n: usize, seed: u64, rank: usize, special: bool) -> Vec<u8> {
    if special { special_values(dtype, n, rank) } else { finite_values(dtype, n, seed ^ (rank as u64) << 32) }
}

/// One single-lane case on every rank: builds arenas, validates, plans, simulates, checks.
#[allow(clippy::too_many_arguments)] // one parameter per dimension of the case matrix
fn single(
    op: Op,
    dtype: DType,
    n: usize,
    world: usize,
    in_place: bool,
    offs: (usize, usize),
    how: Exchange,
    special: bool,
) {
    let size = dtype.size();
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| values(dtype, n, n as u64 * 31 + world as u64, r, special)).collect();
    let full = reference_reduce(&inputs, dtype);
    let shard = n / world * size;
    let mut ranks = Vec::new();
    let mut plans = Vec::new();
    let mut outs = Vec::new();
    for (rank, mine) in inputs.iter().enumerate() {
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
        outs.push((call.dst, want, arena.clone()));
        ranks.push(Rank { arena, ws: Vec::new() });
        plans.push(plan);
    }
    simulate(&mut ranks, &plans);
    for (rank, (r, (dst, want, before))) in ranks.iter().zip(outs).enumerate() {
        let label = format!("{op:?} {dtype} n {n} world {world} rank {rank} in_place {in_place} offs {offs:?} {how:?}");
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
                        single(Op::AllReduce, dtype, n, world, in_place, offs, Exchange::AllGather, false);
                        single(Op::AllGather, dtype, n, world, in_place, offs, Exchange::AllGather, false);
                        for how in [Exchange::AllGather, Exchange::AllToAll] {
                            single(Op::ReduceScatter, dtype, n, world, in_place, offs, how, false);
                        }
                    }
                }
            }
            let n = 16 * 16 * 16 * world;
            single(Op::AllReduce, dtype, n, world, false, (0, 0), Exchange::AllGather, true);
            single(Op::ReduceScatter, dtype, n, world, true, (0, 1), Exchange::AllToAll, true);
        }
    }
}

#[test]
fn empty_calls_plan_nothing_on_every_rank() {
    for world in [1usize, 2, 8] {
        for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
            single(op, DType::F16, 0, world, false, (0, 0), Exchange::AllGather, false);
        }
    }
}

/// reduce_scatter_many with lane 0 in place (when several lanes), packed or per lane.
fn many(dtype: DType, lane_sizes: &[usize], world: usize, packed: bool) {
    let size = dtype.size();
    let lanes_in: Vec<Vec<Vec<u8>>> = lane_sizes
        .iter()
        .enumerate()
        .map(|(l, &n)| (0..world).map(|r| values(dtype, n, l as u64 + 77, r, l == 1)).collect())
        .collect();
    let mut ranks = Vec::new();
    let mut plans = Vec::new();
    let mut expect = Vec::new();
    for rank in 0..world {
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
        plans.push(Plan::many(&calls, rank, world, packed).expect("plan"));
        let wants: Vec<(u64, Vec<u8>)> = calls
            .iter()
            .enumerate()
            .map(|(l, c)| {
                let full = reference_reduce(&lanes_in[l], dtype);
                let s = c.call.bytes_out();
                (c.call.dst, full[rank * s..(rank + 1) * s].to_vec())
            })
            .collect();
        expect.push((wants, arena.clone()));
        ranks.push(Rank { arena, ws: Vec::new() });
    }
    simulate(&mut ranks, &plans);
    for (rank, (r, (wants, before))) in ranks.iter().zip(expect).enumerate() {
        let label = format!("many {dtype} {lane_sizes:?} world {world} rank {rank} packed {packed}");
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
                    many(dtype, &lanes, world, packed);
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
