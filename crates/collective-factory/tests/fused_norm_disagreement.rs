//! Ranks that disagree on a fused call get an error, never different `y`: on every IPC route,
//! in the one-kernel form (8 rows) and with the norm a launch of its own (100 rows), a fused
//! call whose peer normalises rows of another `hidden` with the same element count, uses
//! another `eps`, or makes a plain all_reduce of the same size fails with `SignatureMismatch`
//! on both ranks (the all_reduce is signed with the norm's `hidden` and `eps`,
//! `Signature::norm_split`), the peer named, within the peer bound, and the next call is
//! `Poisoned`. Before, every one of these calls returned `Ok`, each rank with its own `y`.
#![cfg(feature = "cpu")]
mod norm_data;

use collective_factory::{Collective, Config, CpuCollective, Error, Io, RawRef, RmsNorm, cpu};
use norm_data::every_size_by;
use std::time::{Duration, Instant};

/// The peer bound: a mismatch must be reported well before it.
const BOUND: Duration = Duration::from_secs(20);

/// What rank `r` calls: a fused call of `rows x hidden` with `eps`, or a plain all_reduce of
/// `n` elements.
#[derive(Debug, Clone, Copy)]
enum Call {
    Fused { rows: usize, hidden: usize, eps: f32 },
    Plain { n: usize },
}

fn make(comm: &CpuCollective, call: Call) -> Result<(), Error> {
    match call {
        Call::Fused { rows, hidden, eps } => {
            let n = rows * hidden;
            let x = vec![1.0f32; n];
            let mut y = vec![0f32; n];
            let mut h = vec![0.5f32; n];
            let weight = vec![1.0f32; hidden];
            let norm = RmsNorm { residual: Io::host_in_place(&mut h), weight: RawRef::host(&weight), hidden, eps };
            comm.all_reduce_residual_rmsnorm(Io::host(&x, &mut y), norm, &())
        }
        Call::Plain { n } => {
            let x = vec![1.0f32; n];
            let mut y = vec![0f32; n];
            comm.all_reduce(Io::host(&x, &mut y), &())
        }
    }
}

/// Both ranks' calls on a fresh group by `route`; each must be `SignatureMismatch` naming the
/// other, then `Poisoned`.
fn expect_mismatch(route: &str, calls: [Call; 2]) {
    let config = Config::new().with_capacity(1 << 20).with_timeout(BOUND).with_routing(every_size_by("cpu", route));
    let ranks = cpu::thread_group(2, &config).expect("thread group");
    std::thread::scope(|s| {
        for (me, comm) in ranks.iter().enumerate() {
            s.spawn(move || {
                let what = format!("{route}, rank {me} of {calls:?}");
                let t = Instant::now();
                let got = make(comm, calls[me]);
                let took = t.elapsed();
                match got {
                    Err(Error::SignatureMismatch { peer, ours, theirs }) => {
                        assert_eq!(peer, 1 - me, "{what}: the peer named");
                        println!("{what}: mismatch after {took:?}: ours {ours}, theirs {theirs}");
                    }
                    other => panic!("{what}: expected SignatureMismatch, got {other:?}"),
                }
                assert!(took < BOUND / 2, "{what}: the mismatch took {took:?}");
                match make(comm, Call::Plain { n: 64 }) {
                    Err(Error::Poisoned { .. }) => {}
                    other => panic!("{what}: expected Poisoned after the mismatch, got {other:?}"),
                }
            });
        }
    });
}

#[test]
fn fused_calls_that_disagree_on_hidden_eps_or_the_norm_fail_on_both_ranks() {
    for route in ["ipc_push_ll", "ipc_one_shot", "ipc_push", "ipc_rs_ag"] {
        for rows in [8, 100] {
            let fused = |rows, hidden, eps| Call::Fused { rows, hidden, eps };
            // The same elements, rows of another hidden.
            expect_mismatch(route, [fused(rows, 512, 1e-6), fused(rows / 2, 1024, 1e-6)]);
            // Another eps.
            expect_mismatch(route, [fused(rows, 512, 1e-6), fused(rows, 512, 1e-5)]);
            // A plain all_reduce of the same size against the fused call.
            expect_mismatch(route, [fused(rows, 512, 1e-6), Call::Plain { n: rows * 512 }]);
        }
    }
}

/// Agreeing ranks are unaffected: the same fused call on both, on every route and form, `Ok`
/// with the same bits (the norm's signature is the same on both).
#[test]
fn agreeing_fused_calls_still_run() {
    for route in ["ipc_push_ll", "ipc_one_shot", "ipc_push", "ipc_rs_ag"] {
        let config = Config::new().with_capacity(1 << 20).with_routing(every_size_by("cpu", route));
        let ranks = cpu::thread_group(2, &config).expect("thread group");
        for rows in [8, 100] {
            std::thread::scope(|s| {
                for comm in &ranks {
                    s.spawn(move || {
                        make(comm, Call::Fused { rows, hidden: 512, eps: 1e-6 }).expect("agreeing fused call")
                    });
                }
            });
        }
    }
}
