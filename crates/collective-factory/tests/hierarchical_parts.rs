//! Ranks making different calls on the hierarchical route fail, even where the calls' parts
//! have the same sizes. The route runs a call as smaller collectives (inside the node by IPC,
//! across nodes by the transport); signed as calls of their own, the parts of two different
//! calls could agree: at 12 ranks in nodes of 4, an all_reduce of 100 elements then one of 1
//! against one of 101 is the same in-node reduce_scatter of 100 then an all_reduce of 1, and
//! every rank returned `Ok` with sums mixed across the calls (found by a probe written as a
//! user would call). Each IPC part is now signed with the whole call
//! (`Signature::part_split`): `SignatureMismatch` on every rank, then `Poisoned` — and so is
//! each part across nodes on the host transport, which also signs a fused call's norm on the
//! flat transport route.
#![cfg(feature = "cpu")]

use collective_factory::{Collective, Config, CpuCollective, Error, Io, Op, RawMut, RawRef, RmsNorm, Route, cpu};
use std::time::{Duration, Instant};

/// The peer bound; a mismatch must be reported well before it.
const BOUND: Duration = Duration::from_secs(20);

/// What a rank calls, in order.
#[derive(Debug, Clone, Copy)]
enum Call {
    AllReduce(usize),
    Fused {
        rows: usize,
        hidden: usize,
    },
    ReduceScatter(usize),
    /// Two lanes of reduce_scatter_many, `[a, b]` elements per rank's shard.
    Many(usize, usize),
}

fn make(comm: &CpuCollective, call: Call) -> Result<(), Error> {
    let w = comm.world_size();
    match call {
        Call::AllReduce(n) => {
            let x: Vec<f32> = (0..n).map(|i| (comm.rank() * 1000 + i) as f32).collect();
            let mut y = vec![0f32; n];
            comm.all_reduce(Io::host(&x, &mut y), &())
        }
        Call::Fused { rows, hidden } => {
            let n = rows * hidden;
            let x = vec![1.0f32; n];
            let mut y = vec![0f32; n];
            let mut h = vec![0.5f32; n];
            let weight = vec![1.0f32; hidden];
            let norm =
                RmsNorm { residual: Io::host_in_place(&mut h), weight: RawRef::host(&weight), hidden, eps: 1e-6 };
            comm.all_reduce_residual_rmsnorm(Io::host(&x, &mut y), norm, &())
        }
        Call::ReduceScatter(k) => {
            let x = vec![1.0f32; w * k];
            let mut y = vec![0f32; k];
            comm.reduce_scatter(Io::host(&x, &mut y), &())
        }
        Call::Many(a, b) => {
            let (xa, xb) = (vec![1.0f32; w * a], vec![2.0f32; w * b]);
            let (mut ya, mut yb) = (vec![0f32; a], vec![0f32; b]);
            let lanes = [
                Io::OutOfPlace { input: RawRef::host(&xa), output: RawMut::host(&mut ya) },
                Io::OutOfPlace { input: RawRef::host(&xb), output: RawMut::host(&mut yb) },
            ];
            comm.reduce_scatter_many(&lanes, &())
        }
    }
}

fn config() -> Config {
    Config::new().with_capacity(1 << 16).with_timeout(BOUND)
}

/// A thread group of 12 ranks (nodes of 4 on one host), even ranks making `even`, odd ranks
/// `odd`: so ranks of one node disagree, and the IPC parts inside the node must say so.
fn expect_mismatch(even: &[Call], odd: &[Call], routed_as: (Op, usize)) {
    let ranks = cpu::thread_group(12, &config()).expect("thread group of 12");
    expect_mismatch_on(&ranks, |r| if r % 2 == 0 { even } else { odd }, routed_as, Route::Hierarchical);
}

/// Each rank of `ranks` making `calls(rank)`: each rank's first call must be
/// `SignatureMismatch`, within the bound, and its next call (if it has one) `Poisoned`.
/// `routed_as` is the op and bytes whose route must be `route` (the route under test).
fn expect_mismatch_on<'c>(
    ranks: &[CpuCollective],
    calls: impl Fn(usize) -> &'c [Call] + Sync,
    routed_as: (Op, usize),
    route: Route,
) {
    assert_eq!(ranks[0].route(routed_as.0, routed_as.1), route, "the route under test");
    let calls = &calls;
    let world = ranks.len();
    std::thread::scope(|s| {
        for comm in ranks {
            s.spawn(move || {
                let me = comm.rank();
                let calls = calls(me);
                let what = format!("rank {me} of {world} making {calls:?}");
                let t = Instant::now();
                match make(comm, calls[0]) {
                    Err(Error::SignatureMismatch { .. }) => {}
                    other => panic!("{what}: expected SignatureMismatch, got {other:?}"),
                }
                assert!(t.elapsed() < BOUND / 2, "{what}: the mismatch took {:?}", t.elapsed());
                if let Some(&next) = calls.get(1) {
                    match make(comm, next) {
                        Err(Error::Poisoned { .. }) => {}
                        other => panic!("{what}: expected Poisoned after the mismatch, got {other:?}"),
                    }
                }
            });
        }
    });
}

#[test]
fn all_reduces_whose_parts_have_the_same_sizes_fail_on_every_rank() {
    // 100 then 1 against 101: the same parts in nodes of 4 (reduce_scatter of 100, all_gather,
    // then an all_reduce of the 1-element tail).
    expect_mismatch(&[Call::AllReduce(100), Call::AllReduce(1)], &[Call::AllReduce(101)], (Op::AllReduce, 400));
}

#[test]
fn fused_calls_of_another_hidden_fail_on_the_hierarchical_route() {
    // The same elements, rows of another hidden: the parts of the all_reduce are signed with
    // the norm too. (Before, both returned `Ok`, each rank with its own `y`.)
    let fused = |rows, hidden| Call::Fused { rows, hidden };
    expect_mismatch(&[fused(8, 512), fused(1, 64)], &[fused(4, 1024)], (Op::AllReduce, 8 * 512 * 4));
    // One rank fusing, the other making the plain all_reduce of the same size.
    expect_mismatch(&[fused(8, 512)], &[Call::AllReduce(8 * 512)], (Op::AllReduce, 8 * 512 * 4));
}

#[test]
fn reduce_scatter_many_against_its_lanes_one_by_one_fails() {
    // Lanes [8, 16] in one call against reduce_scatter(8) then reduce_scatter(16): the same
    // parts lane by lane.
    expect_mismatch(
        &[Call::Many(8, 16), Call::ReduceScatter(4)],
        &[Call::ReduceScatter(8), Call::ReduceScatter(16)],
        (Op::ReduceScatterMany, 12 * 24 * 4),
    );
}

#[test]
fn whole_nodes_making_different_calls_fail_on_the_host_transport() {
    // Nodes agree inside, disagree with each other: the step across nodes (the host transport)
    // signs its parts with the whole call too. (The NCCL/RCCL transport signs nothing.)
    let ranks = cpu::virtual_nodes(2, 4, &config()).expect("2 x 4 virtual nodes");
    let (first, second) = ([Call::AllReduce(100), Call::AllReduce(1)], [Call::AllReduce(101)]);
    expect_mismatch_on(&ranks, |r| if r < 4 { &first } else { &second }, (Op::AllReduce, 400), Route::Hierarchical);
}

#[test]
fn fused_calls_of_another_hidden_fail_on_the_host_transport_route() {
    // Nodes of 3 (not a power of two): the flat transport route, signed with the norm.
    let ranks = cpu::virtual_nodes(2, 3, &config()).expect("2 x 3 virtual nodes");
    let (a, b) = ([Call::Fused { rows: 8, hidden: 512 }], [Call::Fused { rows: 4, hidden: 1024 }]);
    expect_mismatch_on(&ranks, |r| if r % 2 == 0 { &a } else { &b }, (Op::AllReduce, 8 * 512 * 4), Route::Transport);
}

#[test]
fn a_poisoned_step_across_nodes_fails_the_next_call_before_any_work() {
    // Nodes agree inside and disagree across: the host transport is poisoned, the IPC
    // collective inside each node is not. The next call (the same on every rank) must fail
    // before its step inside the node writes the output. Before, that step ran (every rank's
    // output got its node's reduce_scatter shard) and only the step across refused.
    let ranks = cpu::virtual_nodes(2, 2, &config()).expect("2 x 2 virtual nodes");
    assert_eq!(ranks[0].route(Op::AllReduce, 64), Route::Hierarchical, "the route under test");
    std::thread::scope(|s| {
        for comm in &ranks {
            s.spawn(move || {
                let me = comm.rank();
                let n = if me < 2 { 100 } else { 101 };
                assert!(make(comm, Call::AllReduce(n)).is_err(), "rank {me}: the disagreeing call");
                let x = vec![1.0f32; 16];
                let mut y = vec![-7.25f32; 16];
                match comm.all_reduce(Io::host(&x, &mut y), &()) {
                    Err(Error::Poisoned { .. }) => {}
                    other => panic!("rank {me}: expected Poisoned, got {other:?}"),
                }
                assert!(y.iter().all(|v| v.to_bits() == (-7.25f32).to_bits()), "rank {me}: output written: {y:?}");
            });
        }
    });
}

#[test]
fn errors_of_the_hierarchical_route_name_the_worlds_ranks() {
    // Two virtual nodes of 4; rank 5 makes an all_reduce of one element more. Node 1 fails in
    // its step inside the node, node 0 in the step across nodes when node 1's ranks drop their
    // handles. The steps' collectives have ranks of their own (local rank 1 of node 1, node 1
    // of local rank 0's transport); the errors must name the world's: rank 5's node peers blame
    // 5, and rank `r` of node 0 blames its partner `r + 4`. (Before, node 1's ranks blamed
    // "rank 1" and node 0's "rank 1": the node index.)
    let ranks = cpu::virtual_nodes(2, 4, &config()).expect("2 x 4 virtual nodes");
    assert_eq!(ranks[0].route(Op::AllReduce, 4096 * 4), Route::Hierarchical, "the route under test");
    std::thread::scope(|s| {
        for comm in ranks {
            s.spawn(move || {
                let me = comm.rank();
                let t = Instant::now();
                let first = make(&comm, Call::AllReduce(if me == 5 { 4097 } else { 4096 }));
                assert!(t.elapsed() < BOUND / 2, "rank {me}: the error took {:?}", t.elapsed());
                let first = first.expect_err("a disagreeing world");
                let culprit = first.culprit();
                match me {
                    5 => assert!(
                        matches!(first, Error::SignatureMismatch { peer: 4 | 6 | 7, .. }),
                        "rank 5 blames a rank of its node: {first:?}"
                    ),
                    4 | 6 | 7 => assert!(
                        matches!(first, Error::SignatureMismatch { peer: 5, .. }),
                        "rank {me} blames rank 5: {first:?}"
                    ),
                    _ => assert_eq!(culprit, Some(me + 4), "rank {me} blames its partner across: {first:?}"),
                }
                // The next call reports the first failure, in the world's ranks.
                match make(&comm, Call::AllReduce(16)) {
                    Err(Error::Poisoned { cause }) => {
                        let named = format!("rank {}", culprit.expect("a blamed rank"));
                        assert!(cause.contains(&named), "rank {me}: the poison names {named}: {cause}");
                    }
                    other => panic!("rank {me}: expected Poisoned, got {other:?}"),
                }
                // Closed, the poisoned handle says so, as the flat routes do (before: Poisoned).
                let t = Instant::now();
                let _ = comm.close();
                assert!(t.elapsed() < BOUND / 2, "rank {me}: close took {:?}", t.elapsed());
                assert!(matches!(comm.check(), Err(Error::Closed)), "rank {me}: check after close: {:?}", comm.check());
                drop(comm);
            });
        }
    });
}
