//! An empty call is a call of the group on the hierarchical route too (several nodes: the CPU
//! twin inside each node, the host transport across nodes; ranks as threads on
//! `cpu::virtual_nodes`). `reduce_scatter_many` with no lanes, or with every lane empty, and a
//! reduce_scatter, all_gather or all_reduce of 0 elements, made no step there before
//! 2026-12-06: a rank making one returned `Ok` at once while its peers made another call, and
//! they failed only at its next call or at their bound (found by an outside probe). Now such a
//! call makes one signed empty step inside the node and one across nodes:
//!
//! * ranks that all make the same empty call all return `Ok`, and the calls after it give
//!   `fixed-tree`'s bits (they stayed in step);
//! * a rank making it while its peers make another call gets a typed error, as every peer
//!   does, well within the peer bound, and nothing is written to the outputs of the empty
//!   call or of a reduce_scatter (an all_reduce's or all_gather's node step writes its
//!   output itself: see [`stages_its_output`]).
#![cfg(feature = "cpu")]

use collective_core::conformance::data::{finite_values, reference_reduce};
use collective_factory::{Collective, Config, CpuCollective, Error, Io, Op, RawMut, RawRef, Route, cpu};
use std::time::{Duration, Instant};

/// The peer bound of the CPU twin inside a node; a disagreement must be reported before it
/// (by the calls' signatures, not by a rank waiting it out).
const BOUND: Duration = Duration::from_secs(3);

/// What every output holds before a call (bits compared after it).
const UNWRITTEN: u32 = 0xA5A5_A5A5;

/// What a rank calls.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// reduce_scatter_many with no lanes.
    NoLanes,
    /// reduce_scatter_many of this many lanes, every one empty.
    EmptyLanes(usize),
    /// reduce_scatter_many of lanes whose shards have these sizes (some may be 0).
    Many(&'static [usize]),
    AllReduce(usize),
    ReduceScatter(usize),
    AllGather(usize),
}

fn config() -> Config {
    Config::new().with_capacity(1 << 16).with_timeout(BOUND)
}

/// Rank `rank`'s input `lane` of `len` elements for call `seed`.
fn input(rank: usize, len: usize, seed: u64, lane: usize) -> Vec<f32> {
    let bytes = finite_values(collective_core::DType::F32, len, seed * 10_000 + rank as u64 * 100 + lane as u64);
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `fixed-tree`'s sums of every rank's input `lane` of `len` elements, as bits.
fn tree(world: usize, len: usize, seed: u64, lane: usize) -> Vec<u32> {
    let all: Vec<Vec<u8>> = (0..world).map(|r| to_bytes(&input(r, len, seed, lane))).collect();
    reference_reduce(&all, collective_core::DType::F32)
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The lanes' shard sizes of a `reduce_scatter_many` call (`None`: another op).
fn lanes_of(call: Call) -> Option<Vec<usize>> {
    match call {
        Call::NoLanes => Some(vec![]),
        Call::EmptyLanes(n) => Some(vec![0; n]),
        Call::Many(ks) => Some(ks.to_vec()),
        _ => None,
    }
}

/// `comm` makes `call` (inputs of call `seed`): its result and its outputs' bits.
fn make(comm: &CpuCollective, call: Call, seed: u64) -> (Result<(), Error>, Vec<Vec<u32>>) {
    let (w, me) = (comm.world_size(), comm.rank());
    let unwritten = |n: usize| vec![f32::from_bits(UNWRITTEN); n];
    if let Some(ks) = lanes_of(call) {
        let ins: Vec<Vec<f32>> = ks.iter().enumerate().map(|(j, &k)| input(me, w * k, seed, j)).collect();
        let mut outs: Vec<Vec<f32>> = ks.iter().map(|&k| unwritten(k)).collect();
        let lanes: Vec<Io<'_>> = ins
            .iter()
            .zip(outs.iter_mut())
            .map(|(x, y)| Io::OutOfPlace { input: RawRef::host(x), output: RawMut::host(y) })
            .collect();
        let r = comm.reduce_scatter_many(&lanes, &());
        drop(lanes);
        return (r, outs.iter().map(|y| bits(y)).collect());
    }
    let (len_in, len_out) = match call {
        Call::AllReduce(n) => (n, n),
        Call::ReduceScatter(k) => (w * k, k),
        Call::AllGather(k) => (k, w * k),
        _ => unreachable!("reduce_scatter_many is handled above"),
    };
    let x = input(me, len_in, seed, 0);
    let mut y = unwritten(len_out);
    let io = Io::host(&x, &mut y);
    let r = match call {
        Call::AllReduce(_) => comm.all_reduce(io, &()),
        Call::ReduceScatter(_) => comm.reduce_scatter(io, &()),
        _ => comm.all_gather(io, &()),
    };
    (r, vec![bits(&y)])
}

/// What rank `me` of `world` must hold after `call` (inputs of call `seed`): `fixed-tree`'s bits.
fn want(world: usize, me: usize, call: Call, seed: u64) -> Vec<Vec<u32>> {
    if let Some(ks) = lanes_of(call) {
        return ks
            .iter()
            .enumerate()
            .map(|(j, &k)| tree(world, world * k, seed, j)[me * k..(me + 1) * k].to_vec())
            .collect();
    }
    match call {
        Call::AllReduce(n) => vec![tree(world, n, seed, 0)],
        Call::ReduceScatter(k) => vec![tree(world, world * k, seed, 0)[me * k..(me + 1) * k].to_vec()],
        Call::AllGather(k) => vec![(0..world).flat_map(|r| bits(&input(r, k, seed, 0))).collect()],
        _ => unreachable!("reduce_scatter_many is handled above"),
    }
}

/// Close is collective: every rank at once (errors of a poisoned group are not the test's).
fn close(ranks: &[CpuCollective]) {
    std::thread::scope(|s| {
        for c in ranks {
            s.spawn(move || {
                let _ = c.close();
            });
        }
    });
}

/// Every call below is routed to the hierarchical route, empty ones too.
fn assert_hierarchical(ranks: &[CpuCollective]) {
    for op in Op::ALL {
        for bytes in [0, 64] {
            assert_eq!(ranks[0].route(op, bytes), Route::Hierarchical, "{op} of {bytes} bytes: the route under test");
        }
    }
}

#[test]
fn ranks_that_all_make_the_empty_call_return_ok_and_stay_in_step() {
    // Empty calls of every kind between calls that move data (an empty lane between non-empty
    // ones among them): each rank's every call `Ok`, every output fixed-tree's bits.
    const SEQUENCE: [Call; 11] = [
        Call::NoLanes,
        Call::Many(&[4, 7]),
        Call::EmptyLanes(3),
        Call::AllReduce(8 * 3 + 1),
        Call::Many(&[0, 5, 0, 3]),
        Call::AllReduce(0),
        Call::ReduceScatter(0),
        Call::AllGather(0),
        Call::NoLanes,
        Call::ReduceScatter(6),
        Call::AllGather(5),
    ];
    for (nodes, local) in [(2, 2), (2, 4), (3, 2)] {
        let ranks = cpu::virtual_nodes(nodes, local, &config()).expect("virtual nodes");
        assert_hierarchical(&ranks);
        let world = ranks.len();
        std::thread::scope(|s| {
            for comm in &ranks {
                s.spawn(move || {
                    let me = comm.rank();
                    for (i, &call) in SEQUENCE.iter().enumerate() {
                        let seed = i as u64 + 1;
                        let what = format!("{nodes} x {local}: rank {me}, call {i} ({call:?})");
                        let t = Instant::now();
                        let (r, got) = make(comm, call, seed);
                        assert!(r.is_ok(), "{what}: {r:?} after {:?}", t.elapsed());
                        assert!(got == want(world, me, call, seed), "{what}: not fixed-tree's bits");
                    }
                });
            }
        });
        close(&ranks);
        println!("{nodes} x {local}: every rank Ok on every empty call, every output fixed-tree's bits");
    }
}

/// Whether a failed `call` on the hierarchical route leaves its outputs as they were: the
/// reduce_scatters stage the node step in a scratch row and write the output only in the step
/// across nodes. An all_reduce's and an all_gather's node step writes the output itself (their
/// shard, their node's block), so where the node step succeeds and the step across fails the
/// output holds that step's result: a failed call's output is unspecified
/// (`Collective::check`), and that is no part of what an empty call changes.
fn stages_its_output(call: Call) -> bool {
    !matches!(call, Call::AllReduce(n) | Call::AllGather(n) if n > 0)
}

/// On 2 x 2 virtual nodes, the ranks `empty_ranks` make `empty` while the others make `other`:
/// every rank's call must fail (a typed error, never `Ok`) before the peer bound, write
/// nothing (where [`stages_its_output`]), and leave the handle poisoned (its next call
/// `Poisoned`).
fn expect_every_rank_to_fail(empty: Call, other: Call, empty_ranks: &[usize]) {
    let ranks = cpu::virtual_nodes(2, 2, &config()).expect("2 x 2 virtual nodes");
    assert_hierarchical(&ranks);
    let case = format!("{empty:?} on ranks {empty_ranks:?}, {other:?} on the others");
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let me = comm.rank();
                    let call = if empty_ranks.contains(&me) { empty } else { other };
                    let t = Instant::now();
                    let (first, outs) = make(comm, call, 1);
                    let waited = t.elapsed();
                    let next = if first.is_ok() {
                        // A rank that wrongly returned `Ok` leaves the group now, so its peers
                        // fail at once instead of at the bootstrap's bound.
                        let _ = comm.close();
                        None
                    } else {
                        Some(make(comm, Call::AllReduce(8), 2).0)
                    };
                    (me, call, first, waited, outs, next)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    close(&ranks);
    for (me, call, first, waited, outs, next) in results {
        let what = format!("{case}: rank {me} making {call:?}");
        println!("{what}: {first:?} after {waited:?}, then {next:?}");
        assert!(first.is_err(), "{what}: returned Ok while its peers made another call");
        assert!(waited < BOUND, "{what}: failed only after {waited:?} (bound {BOUND:?})");
        if stages_its_output(call) {
            assert!(outs.iter().flatten().all(|&b| b == UNWRITTEN), "{what}: an output was written: {outs:?}");
        }
        assert!(matches!(next, Some(Err(Error::Poisoned { .. }))), "{what}: next call {next:?}, expected Poisoned");
    }
}

#[test]
fn reduce_scatter_many_with_no_lanes_against_another_call_fails_every_rank() {
    // One rank of node 0: its node peer sees the disagreement inside the node; node 1's ranks
    // fail across nodes when node 0's ranks leave.
    expect_every_rank_to_fail(Call::NoLanes, Call::Many(&[4, 7]), &[0]);
    expect_every_rank_to_fail(Call::NoLanes, Call::AllReduce(16), &[0]);
    // A whole node: only the step across nodes can tell.
    expect_every_rank_to_fail(Call::NoLanes, Call::Many(&[4, 7]), &[0, 1]);
}

#[test]
fn reduce_scatter_many_with_empty_lanes_against_another_call_fails_every_rank() {
    expect_every_rank_to_fail(Call::EmptyLanes(2), Call::Many(&[4, 7]), &[0]);
    expect_every_rank_to_fail(Call::EmptyLanes(1), Call::NoLanes, &[3]);
    expect_every_rank_to_fail(Call::EmptyLanes(2), Call::Many(&[4, 7]), &[2, 3]);
    // An empty lane beside a non-empty one: the same data as one lane, another call.
    expect_every_rank_to_fail(Call::Many(&[4, 0]), Call::Many(&[4]), &[1]);
}

#[test]
fn empty_single_lane_calls_against_another_call_fail_every_rank() {
    expect_every_rank_to_fail(Call::AllReduce(0), Call::AllReduce(16), &[0]);
    expect_every_rank_to_fail(Call::ReduceScatter(0), Call::ReduceScatter(4), &[1]);
    expect_every_rank_to_fail(Call::AllGather(0), Call::AllGather(4), &[2]);
    expect_every_rank_to_fail(Call::AllReduce(0), Call::NoLanes, &[0, 1]);
}
