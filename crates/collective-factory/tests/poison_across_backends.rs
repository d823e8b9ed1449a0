//! A handle with two backends (a table sending small all_reduces to IPC and large ones to the
//! host transport, as the ROCm default table does): once one backend's call failed, every later
//! call through the *other* backend is `Poisoned` too, with nothing written, and returns at once
//! (the contract's "as `Poisoned` carrying it, by every later call"). Until 2026-12-07 a call
//! routed to the healthy backend returned `Ok`, and a rank whose IPC side had failed never
//! released its transport, so a peer waiting there waited out the bootstrap's 60 s.
#![cfg(feature = "cpu")]

use collective_factory::{Collective, Config, CpuCollective, Error, Io, RawRef, RmsNorm, Routing, cpu};
use std::time::{Duration, Instant};

/// All_reduce up to 4 KiB per rank on `small`, above on `large`; the other ops on one-shot.
fn split_table(small: &str, large: &str) -> Routing {
    let json = format!(
        r#"{{"platform":"cpu","source":"poison_across_backends","rules":[
        {{"op":"all_reduce","min_bytes":0,"max_bytes":4097,"route":"{small}"}},
        {{"op":"all_reduce","min_bytes":4097,"max_bytes":null,"route":"{large}"}},
        {{"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
        {{"op":"reduce_scatter","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
        {{"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}}]}}"#
    );
    Routing::from_json(&json).expect("table")
}

fn on_ranks<R: Send>(comms: &[CpuCollective], body: impl Fn(&CpuCollective) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| body(c))).collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

const SENTINEL: f32 = -7.25;

/// A plain all_reduce of `n` f32 on every rank: its result and whether `out` was left alone.
fn all_reduce(comm: &CpuCollective, n: usize) -> (Result<(), Error>, bool) {
    let x = vec![comm.rank() as f32 + 0.5; n];
    let mut out = vec![SENTINEL; n];
    let r = comm.all_reduce(Io::host(&x, &mut out), &());
    (r, out.iter().all(|v| v.to_bits() == SENTINEL.to_bits()))
}

/// A fused call of `rows` rows of 256 f32 (1 KiB a row): its result and whether `y` and `h`
/// were left alone.
fn fused(comm: &CpuCollective, rows: usize) -> (Result<(), Error>, bool) {
    let (hidden, n) = (256, rows * 256);
    let x = vec![1.0f32; n];
    let residual = vec![0.25f32; n];
    let weight = vec![2.0f32; hidden];
    let (mut y, mut h) = (vec![SENTINEL; n], vec![SENTINEL; n]);
    let norm = RmsNorm { residual: Io::host(&residual, &mut h), weight: RawRef::host(&weight), hidden, eps: 1e-6 };
    let r = comm.all_reduce_residual_rmsnorm(Io::host(&x, &mut y), norm, &());
    let untouched = y.iter().chain(&h).all(|v| v.to_bits() == SENTINEL.to_bits());
    (r, untouched)
}

/// Ranks fail a call on the `failing` side of the table (rank 0 calls a different length), then
/// every rank calls through the other side, plainly and fused: `Poisoned`, nothing written,
/// within a bound far below the bootstrap's 60 s; `check` says `Poisoned` as well.
fn a_failure_poisons_the_other_backend(small: &str, large: &str, fail_small: bool) {
    let config = Config::new().with_timeout(Duration::from_secs(2)).with_routing(split_table(small, large));
    let comms = cpu::thread_group(2, &config).expect("group");
    // Small: 4 or 8 f32 (16 / 32 bytes); large: 2048 or 4096 f32 (8 / 16 KiB).
    let (failing, other) = if fail_small { ((4, 8), 4096) } else { ((2048, 4096), 16) };
    let first = on_ranks(&comms, |c| all_reduce(c, if c.rank() == 0 { failing.0 } else { failing.1 }).0);
    for (rank, r) in first.iter().enumerate() {
        assert!(r.is_err(), "{small}/{large}: rank {rank}'s disagreeing call returned Ok");
    }
    let t = Instant::now();
    let plain = on_ranks(&comms, |c| all_reduce(c, other));
    let fused_rows = if fail_small { 16 } else { 1 }; // 16 KiB (large side) or 1 KiB (small side)
    let fused = on_ranks(&comms, |c| fused(c, fused_rows));
    let elapsed = t.elapsed();
    for rank in 0..2 {
        for (what, (r, untouched)) in [("all_reduce", &plain[rank]), ("fused call", &fused[rank])] {
            assert!(
                matches!(r, Err(Error::Poisoned { .. })),
                "{small}/{large}, the {} side failed first: rank {rank}'s later {what} on the other side: {r:?}",
                if fail_small { "small" } else { "large" }
            );
            assert!(untouched, "{small}/{large}: rank {rank}'s refused {what} wrote its output");
        }
        assert!(matches!(comms[rank].check(), Err(Error::Poisoned { .. })), "rank {rank}: check after the failure");
    }
    assert!(elapsed < Duration::from_secs(20), "{small}/{large}: the later calls took {elapsed:?}");
}

#[test]
fn an_ipc_failure_poisons_the_transport_calls() {
    a_failure_poisons_the_other_backend("ipc_one_shot", "transport", true);
    a_failure_poisons_the_other_backend("ipc_push_ll", "ipc_rs_transport_ag", true);
}

#[test]
fn a_transport_failure_poisons_the_ipc_calls() {
    a_failure_poisons_the_other_backend("ipc_one_shot", "transport", false);
    a_failure_poisons_the_other_backend("transport", "ipc_one_shot", true);
}

/// The failing call itself abandons the other backend: rank 1 waits in the transport (a large
/// all_reduce) while rank 0 makes a small one on IPC, which times out (2 s) waiting for rank 1
/// there. Rank 0 makes no further call, yet rank 1 fails at once after it, not at the
/// bootstrap's 60 s: before 2026-12-07 only rank 0's next call abandoned its transport.
#[test]
fn the_failing_call_itself_releases_the_peers_waiting_in_the_other_backend() {
    let config =
        Config::new().with_timeout(Duration::from_secs(2)).with_routing(split_table("ipc_one_shot", "transport"));
    let comms = cpu::thread_group(2, &config).expect("group");
    let t = Instant::now();
    let results = on_ranks(&comms, |c| {
        let r = all_reduce(c, if c.rank() == 0 { 16 } else { 4096 });
        (r, t.elapsed())
    });
    let ((r0, _), _) = &results[0];
    assert!(matches!(r0, Err(Error::Bootstrap(_) | Error::PeerTimeout { .. })), "rank 0's IPC call: {r0:?}");
    let ((r1, untouched), waited) = &results[1];
    assert!(r1.is_err(), "rank 1's transport call returned Ok without rank 0");
    assert!(untouched, "rank 1's failed call wrote its output");
    assert!(*waited < Duration::from_secs(20), "rank 1 waited {waited:?} in the transport for the failed rank");
    assert!(matches!(comms[0].check(), Err(Error::Poisoned { .. })), "rank 0: {:?}", comms[0].check());
}

/// A call refused on one rank only, on a handle whose table sends it to one backend and the
/// rank's next call to the other (an outside probe, 2026-12-07): the peers wait in different
/// backends, so neither sees the other's call number and no `SignatureMismatch` comes — the
/// contract's exception for such handles. What it promises instead: the peer's call fails at
/// its peer timeout (it never pairs with the refusing rank's next call), the refusing rank's
/// next call fails once the peer gives up, nothing is `Ok`, and the refused call wrote nothing.
fn a_call_refused_on_one_rank_across_backends(small: &str, large: &str, refuse_small: bool) {
    let config = Config::new().with_timeout(Duration::from_secs(2)).with_routing(split_table(small, large));
    let comms = cpu::thread_group(2, &config).expect("group");
    // Small: 16 f32 (64 bytes); large: 4096 f32 (16 KiB).
    let (refused, next) = if refuse_small { (16, 4096) } else { (4096, 16) };
    let t = Instant::now();
    let results = on_ranks(&comms, |c| {
        let x = vec![c.rank() as f32 + 0.5; refused];
        // Rank 0's output is one element too long: refused before any work.
        let mut out = vec![SENTINEL; if c.rank() == 0 { refused + 1 } else { refused }];
        let first = c.all_reduce(Io::host(&x, &mut out), &());
        let untouched = out.iter().all(|v| v.to_bits() == SENTINEL.to_bits());
        let (second, _) = all_reduce(c, next);
        (first, untouched, second)
    });
    let elapsed = t.elapsed();
    let side = if refuse_small { "small" } else { "large" };
    let (first0, untouched0, second0) = &results[0];
    assert!(matches!(first0, Err(Error::LengthMismatch { .. })), "{small}/{large}: rank 0's refused call: {first0:?}");
    assert!(untouched0, "{small}/{large}: rank 0's refused call wrote its output");
    let (first1, _, second1) = &results[1];
    assert!(first1.is_err(), "{small}/{large}: rank 1's {side} call returned Ok though rank 0 refused it");
    assert!(second0.is_err(), "{small}/{large}: rank 0's next call returned Ok with rank 1 failed: {second0:?}");
    assert!(second1.is_err(), "{small}/{large}: rank 1's next call returned Ok on a poisoned handle");
    // One peer timeout (2 s) and the abandon that follows it; far below the bootstrap's 60 s.
    assert!(elapsed < Duration::from_secs(15), "{small}/{large}: the calls took {elapsed:?}");
}

#[test]
fn a_call_refused_on_one_rank_fails_within_the_peer_timeout_across_backends() {
    a_call_refused_on_one_rank_across_backends("ipc_one_shot", "transport", true);
    a_call_refused_on_one_rank_across_backends("ipc_one_shot", "transport", false);
    a_call_refused_on_one_rank_across_backends("transport", "ipc_one_shot", true);
}
