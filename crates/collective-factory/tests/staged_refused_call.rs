//! A call one rank refused, on the host-staged transport (`StagedTransport`: the GPU
//! platforms' transport where NCCL/RCCL cannot serve, ranks sharing a GPU) behind the front
//! door. The front door numbers every call, refused or made, and signs it with its number
//! (`Signature::call_split`), so the peers' call and the refusing rank's next one fail with
//! `SignatureMismatch` instead of pairing. Until the fix the host-staged transport dropped
//! that number from a `reduce_scatter_many` of no lane or of several lanes: ranks one refused
//! call apart paired and returned `Ok` with sums of two different calls (rank 0's 100 against
//! rank 1's 1: 101 on both). `refused_on_one_rank` covers the CPU twin's own transport (the
//! host transport, which always signed them) with one lane.
//!
//! The factory builds the host-staged transport on GPU platforms only, so this composes the
//! front door by hand over the CPU host device (`shm_ipc::HostDevice`), every call on the
//! transport route, ranks as threads.
#![cfg(feature = "cpu")]

use collective_factory::bootstrap::LocalBootstrap;
use collective_factory::{Collective, Error, Io, Routed, Routing};
use detcoll_host_transport::StagedTransport;
use shm_ipc::{HostDevice, ShmCollective};
use std::sync::Arc;
use std::time::Duration;

type Staged = Routed<ShmCollective, StagedTransport<HostDevice>>;

const WORLD: usize = 2;
/// Elements of lane `l`'s input: lanes of different lengths.
fn len(l: usize) -> usize {
    WORLD * (4 + 3 * l)
}

/// A front door of `WORLD` ranks (one per thread, `body(rank, handle)`) whose every call takes
/// the host-staged transport.
fn ranks<R: Send>(body: impl Fn(usize, Staged) -> R + Sync) -> Vec<R> {
    let rule = |op: &str| format!(r#"{{"op":"{op}","min_bytes":0,"max_bytes":null,"route":"transport"}}"#);
    let rules = ["all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_many"].map(rule).join(",");
    let json = format!(r#"{{"platform":"cpu","source":"test: every call host-staged","rules":[{rules}]}}"#);
    std::thread::scope(|s| {
        let body = &body;
        let json = &json;
        let hs: Vec<_> = LocalBootstrap::group_with_timeout(WORLD, Duration::from_secs(20))
            .into_iter()
            .enumerate()
            .map(|(rank, boot)| {
                s.spawn(move || {
                    let staged = StagedTransport::new(HostDevice::threads(), Arc::new(boot)).expect("staged transport");
                    let routing = Routing::from_json(json).expect("table");
                    let comm = Routed::new(rank, WORLD, 1 << 20, routing, None::<ShmCollective>, Some(staged))
                        .expect("front door");
                    body(rank, comm)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

/// A `reduce_scatter_many` of `lanes` lanes, every input `v`, into outputs of -7; `bad`: lane
/// 0's output one too long (refused before any work; with no lane the refusal is counted
/// as a layer counts its own, `Collective::count_refused_call`). The outputs' bits after.
fn many(c: &Staged, lanes: usize, v: f32, bad: bool) -> (Result<(), Error>, Vec<Vec<u32>>) {
    if bad && lanes == 0 {
        let r = c.count_refused_call().and(Err(Error::InvalidConfig { detail: "refused".into() }));
        return (r, Vec::new());
    }
    let ins: Vec<Vec<f32>> = (0..lanes).map(|l| vec![v; len(l)]).collect();
    let mut outs: Vec<Vec<f32>> = (0..lanes).map(|l| vec![-7.0; len(l) / WORLD + usize::from(bad && l == 0)]).collect();
    let ios: Vec<Io<'_>> = ins.iter().zip(outs.iter_mut()).map(|(i, o)| Io::host(i, o)).collect();
    let r = c.reduce_scatter_many(&ios, &());
    drop(ios);
    (r, outs.iter().map(|o| o.iter().map(|x| x.to_bits()).collect()).collect())
}

/// The bits of `lanes` well-formed outputs every element of which is `v`.
fn filled(lanes: usize, v: f32) -> Vec<Vec<u32>> {
    (0..lanes).map(|l| vec![v.to_bits(); len(l) / WORLD]).collect()
}

/// Rank 0 makes calls of 100 then 1; rank 1 refuses the first, then makes one of 1. Rank 0's
/// first call and rank 1's second fail with `SignatureMismatch` (rank 0's second finds its
/// handle poisoned) and write nothing; none returns `Ok` with 101.
#[test]
fn a_reduce_scatter_many_one_rank_refused_fails_on_both_ranks_for_any_lane_count() {
    let mut wrong = Vec::new();
    for lanes in [0usize, 1, 2, 3] {
        let got = ranks(|rank, c| {
            if rank == 0 {
                [many(&c, lanes, 100.0, false), many(&c, lanes, 1.0, false)]
            } else {
                [many(&c, lanes, 7.0, true), many(&c, lanes, 1.0, false)]
            }
        });
        let [[a, b], [refused, d]] = <[[_; 2]; 2]>::try_from(got).expect("two ranks");
        let untouched = filled(lanes, -7.0);
        if refused.0.is_ok() {
            wrong.push(format!("{lanes} lanes: rank 1's bad call was not refused"));
        }
        for (what, (r, outs)) in
            [("rank 0's first call (refused by rank 1)", &a), ("rank 1's call after its refusal", &d)]
        {
            if !matches!(r, Err(Error::SignatureMismatch { .. })) {
                wrong.push(format!("{lanes} lanes, {what}: expected SignatureMismatch, got {r:?}"));
            }
            if *outs != untouched {
                let first = outs.first().and_then(|o| o.first()).map(|&b| f32::from_bits(b));
                wrong.push(format!("{lanes} lanes, {what}: wrote its outputs (lane 0 begins {first:?})"));
            }
        }
        if !matches!(b.0, Err(Error::Poisoned { .. }) | Err(Error::Bootstrap(_))) {
            wrong.push(format!("{lanes} lanes, rank 0's second call: expected a failure, got {:?}", b.0));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Both ranks refuse the same call: they stay in step, and the next call of any lane count is
/// `Ok` with `fixed-tree`'s bits (1 + 2 in every element).
#[test]
fn a_reduce_scatter_many_every_rank_refused_leaves_them_in_step() {
    for lanes in [0usize, 1, 2, 3] {
        for (rank, (refused, (r, outs))) in ranks(|rank, c| {
            let refused = many(&c, lanes, 7.0, true).0;
            (refused, many(&c, lanes, 1.0 + rank as f32, false))
        })
        .into_iter()
        .enumerate()
        {
            assert!(refused.is_err(), "{lanes} lanes, rank {rank}");
            r.unwrap_or_else(|e| panic!("{lanes} lanes, rank {rank}: the call after a refusal all made: {e}"));
            let mut want = [0.0f32];
            collective_factory::fixed_tree::reduce(&[&[1.0f32][..], &[2.0f32][..]], &mut want).expect("tree");
            assert_eq!(outs, filled(lanes, want[0]), "{lanes} lanes, rank {rank}");
        }
    }
}
