//! A call one rank refuses (its own bad argument) while its peers make it. Before 2026-12-06
//! the refusing rank simply did not take part, so the peers' call paired with its *next*
//! call — of the same size, so of the same signature — and both returned `Ok` with sums of
//! two different calls (an outside probe: rank 0's inputs 100, 1, 5 against rank 1's 1, 5 got
//! 101 and 6, rank 1's 101 and 6; every call but the last `Ok`). Now every front-door call is
//! numbered, refused or made, and signed with its number: the peers' call and the refusing
//! rank's next one fail (`SignatureMismatch`), and no call returns another call's sums. Ranks
//! that all refuse the same call stay in step, as refusals promise ("they do not poison").
//!
//! Every op, on the CPU twin's IPC routes and its host transport route, and the fused call;
//! each scenario fails on the old code (the peers' call returns `Ok`).
#![cfg(feature = "cpu")]

use collective_factory::{Collective, Config, CpuCollective, Error, Io, RawRef, RmsNorm, Routing, cpu};
use std::time::Duration;

const N: usize = 64;

/// A table sending every op of every size to `route`.
fn every_call_on(route: &str) -> Routing {
    let rule = |op: &str| format!(r#"{{"op":"{op}","min_bytes":0,"max_bytes":null,"route":"{route}"}}"#);
    let json = format!(
        r#"{{"platform":"cpu","source":"test: every call on {route}","rules":[{},{},{},{}]}}"#,
        rule("all_reduce"),
        rule("all_gather"),
        rule("reduce_scatter"),
        rule("reduce_scatter_many")
    );
    Routing::from_json(&json).expect("table")
}

fn group(route: Option<&str>) -> Vec<CpuCollective> {
    let mut config = Config::new().with_timeout(Duration::from_secs(20));
    if let Some(r) = route {
        config = config.with_routing(every_call_on(r));
    }
    cpu::thread_group(2, &config).unwrap()
}

/// One call of `op` with every input `v`; `bad`: with an output of the wrong length (refused
/// by the front door before any work). Returns the output's first element.
fn call(c: &CpuCollective, op: &str, v: f32, bad: bool) -> Result<f32, Error> {
    let w = c.world_size();
    let x = vec![v; N];
    let out_len = match op {
        "all_gather" => N * w,
        "reduce_scatter" | "reduce_scatter_many" => N / w,
        _ => N,
    } + usize::from(bad);
    let mut out = vec![0f32; out_len];
    match op {
        "all_reduce" => c.all_reduce(Io::host(&x, &mut out), &())?,
        "all_gather" => c.all_gather(Io::host(&x, &mut out), &())?,
        "reduce_scatter" => c.reduce_scatter(Io::host(&x, &mut out), &())?,
        "reduce_scatter_many" => c.reduce_scatter_many(&[Io::host(&x, &mut out)], &())?,
        "fused" => {
            let mut residual = vec![0f32; N];
            // A weight of the wrong length: refused by the fused call's own checks.
            let weight = vec![1f32; 8 + usize::from(bad)];
            let norm = RmsNorm {
                residual: Io::host_in_place(&mut residual),
                weight: RawRef::host(&weight),
                hidden: 8,
                eps: 0.0,
            };
            c.all_reduce_residual_rmsnorm(Io::host(&x, &mut out), norm, &())?;
            return Ok(residual[0]);
        }
        _ => unreachable!(),
    }
    Ok(out[0])
}

/// Rank 0 makes calls of 100 then 1; rank 1 refuses the first (a bad argument), then makes
/// one of 1. Neither may return `Ok` with a value that mixes the two calls.
fn one_rank_refuses(route: Option<&str>, op: &str) {
    let ranks = group(route);
    let what = format!("{op} on {}", route.unwrap_or("the default table"));
    std::thread::scope(|s| {
        let (r0, r1) = (&ranks[0], &ranks[1]);
        let zero = s.spawn(move || (call(r0, op, 100.0, false), call(r0, op, 1.0, false)));
        let one = s.spawn(move || {
            let refused = call(r1, op, 7.0, true);
            (refused, call(r1, op, 1.0, false))
        });
        let (a, b) = zero.join().unwrap();
        let (refused, d) = one.join().unwrap();
        assert!(refused.is_err(), "{what}: the bad call was not refused: {refused:?}");
        // The only right Ok values: 100 + 1 would be no call's result at all.
        assert!(a.is_err(), "{what}: rank 0's call, which rank 1 refused, returned Ok({:?})", a.unwrap());
        assert!(d.is_err(), "{what}: rank 1's call after its refusal returned Ok({:?})", d.unwrap());
        let mismatch =
            |r: &Result<f32, Error>| matches!(r, Err(Error::SignatureMismatch { .. } | Error::Poisoned { .. }));
        assert!(mismatch(&a) && mismatch(&d), "{what}: expected SignatureMismatch, got {a:?} and {d:?}");
        let _ = b;
    });
}

/// Both ranks refuse the same call: they stay in step, the next call is exact.
fn every_rank_refuses(route: Option<&str>, op: &str) {
    let ranks = group(route);
    let what = format!("{op} on {}", route.unwrap_or("the default table"));
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(r, c)| {
                s.spawn(move || {
                    assert!(call(c, op, 7.0, true).is_err());
                    call(c, op, 1.0 + r as f32, false)
                })
            })
            .collect();
        for h in handles {
            let v = h.join().unwrap().unwrap_or_else(|e| panic!("{what}: the call after a refusal all made: {e}"));
            // all_gather: rank 0's piece first; the others 1 + 2 (the fused call's h: residual 0 +
            // the sum).
            let expected: f32 = if op == "all_gather" { 1.0 } else { 3.0 };
            assert_eq!(v.to_bits(), expected.to_bits(), "{what}");
        }
    });
}

const OPS: [&str; 5] = ["all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_many", "fused"];

#[test]
fn a_call_one_rank_refused_fails_on_every_rank_instead_of_pairing_with_the_next() {
    for route in [None, Some("ipc_one_shot"), Some("ipc_push"), Some("transport")] {
        for op in OPS {
            one_rank_refuses(route, op);
        }
    }
}

#[test]
fn a_call_every_rank_refused_leaves_them_in_step() {
    for route in [None, Some("ipc_one_shot"), Some("transport")] {
        for op in OPS {
            every_rank_refuses(route, op);
        }
    }
}
