//! Fault tests across real processes: a dead rank, mismatched calls, close ordering.
//!
//! Each test is its own parent and children: the parent launches the test binary once per rank
//! (survivors are not torn down when a rank dies: `stop_on_failure = false`), each child runs its
//! role and prints `VERDICT ok ...` or fails; the parent checks every rank's verdict.
use collective_core::bootstrap::TcpBootstrap;
use collective_core::{Collective, Error, Io};
use detcoll_launch::{LaunchSpec, launch_captured};
use shm_ipc::{ShmCollective, ShmConfig};
use std::time::{Duration, Instant};

const ROLE: &str = "DETCOLL_FAULT_CHILD";
const BOUND: Duration = Duration::from_secs(3);

fn config() -> ShmConfig {
    let mut c = ShmConfig::new(1 << 16);
    c.timeouts = Some(collective_core::protocol::Timeouts { peer: BOUND, close: BOUND });
    c
}

/// In a child: `Some(rank)` after joining; in the parent: `None`.
fn child() -> Option<(usize, TcpBootstrap)> {
    std::env::var_os(ROLE)?;
    let boot = TcpBootstrap::from_env().expect("bootstrap");
    Some((collective_core::bootstrap::Bootstrap::rank(&boot), boot))
}

/// Launches `world` children running `test`; returns (exit success per rank, output per rank).
fn launch(world: usize, test: &str) -> Vec<(bool, String)> {
    let exe = std::env::current_exe().unwrap();
    let mut spec =
        LaunchSpec::new(world, exe).args([test, "--exact", "--nocapture", "--test-threads=1"]).env(ROLE, "1");
    spec.stop_on_failure = false;
    let (outcome, outputs) = launch_captured(&spec).expect("launch");
    outcome.statuses.iter().map(|s| s.success()).zip(outputs).collect()
}

fn all_reduce(c: &ShmCollective, n: usize) -> Result<Vec<f32>, Error> {
    let input: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let mut out = vec![0f32; n];
    c.all_reduce(Io::host(&input, &mut out), &()).map(|()| out)
}

#[test]
fn killed_rank_is_named_within_the_bound() {
    if let Some((rank, boot)) = child() {
        let c = ShmCollective::new(&boot, config()).unwrap();
        for _ in 0..3 {
            all_reduce(&c, 256).unwrap();
        }
        if rank == 2 {
            // Die mid-run without closing: the survivors are about to wait for us.
            std::process::abort();
        }
        let t = Instant::now();
        let err = all_reduce(&c, 256).expect_err("a call with a dead peer must fail");
        let elapsed = t.elapsed();
        let named = matches!(err, Error::PeerDied { peer: 2, .. } | Error::PeerTimeout { peer: 2, .. });
        assert!(named, "error does not name rank 2: {err}");
        assert!(elapsed <= BOUND + Duration::from_secs(1), "took {elapsed:?}");
        let later = all_reduce(&c, 256).expect_err("poisoned");
        assert!(matches!(later, Error::Poisoned { .. }), "{later}");
        println!("VERDICT ok rank {rank}: {err} after {elapsed:?}");
        return;
    }
    let results = launch(4, "killed_rank_is_named_within_the_bound");
    for (r, (ok, out)) in results.iter().enumerate() {
        if r == 2 {
            assert!(!*ok, "rank 2 should have died");
        } else {
            assert!(*ok && out.contains("VERDICT ok"), "rank {r} failed:\n{out}");
        }
    }
}

#[test]
fn mismatched_counts_fail_on_every_rank() {
    if let Some((rank, boot)) = child() {
        let c = ShmCollective::new(&boot, config()).unwrap();
        all_reduce(&c, 64).unwrap();
        let n = if rank == 1 { 65 } else { 64 };
        let t = Instant::now();
        let err = all_reduce(&c, n).expect_err("mismatched counts must fail");
        assert!(matches!(err, Error::SignatureMismatch { .. }), "{err}");
        assert!(t.elapsed() < BOUND, "mismatch detected only after {:?}", t.elapsed());
        println!("VERDICT ok rank {rank}: {err}");
        return;
    }
    for (r, (ok, out)) in launch(4, "mismatched_counts_fail_on_every_rank").iter().enumerate() {
        assert!(*ok && out.contains("VERDICT ok"), "rank {r} failed:\n{out}");
    }
}

#[test]
fn mismatched_dtypes_fail_on_every_rank() {
    if let Some((rank, boot)) = child() {
        let c = ShmCollective::new(&boot, config()).unwrap();
        let err = if rank == 3 {
            let input = vec![half::f16::ONE; 64];
            let mut out = vec![half::f16::ZERO; 64];
            c.all_reduce(Io::host(&input, &mut out), &()).expect_err("mismatched dtypes must fail")
        } else {
            all_reduce(&c, 64).expect_err("mismatched dtypes must fail")
        };
        assert!(matches!(err, Error::SignatureMismatch { .. }), "{err}");
        println!("VERDICT ok rank {rank}: {err}");
        return;
    }
    for (r, (ok, out)) in launch(4, "mismatched_dtypes_fail_on_every_rank").iter().enumerate() {
        assert!(*ok && out.contains("VERDICT ok"), "rank {r} failed:\n{out}");
    }
}

#[test]
fn close_waits_for_every_acknowledgement() {
    if let Some((rank, boot)) = child() {
        let c = ShmCollective::new(&boot, config()).unwrap();
        all_reduce(&c, 1024).unwrap();
        if rank == 1 {
            // Still "reading": acknowledge only later.
            std::thread::sleep(Duration::from_millis(700));
        }
        let t = Instant::now();
        c.close().unwrap();
        let waited = t.elapsed();
        if rank != 1 {
            assert!(
                waited >= Duration::from_millis(400),
                "rank {rank} freed its staging after {waited:?}, before rank 1 acknowledged"
            );
        }
        assert!(matches!(all_reduce(&c, 8), Err(Error::Closed)));
        println!("VERDICT ok rank {rank}: close waited {waited:?}");
        return;
    }
    for (r, (ok, out)) in launch(2, "close_waits_for_every_acknowledgement").iter().enumerate() {
        assert!(*ok && out.contains("VERDICT ok"), "rank {r} failed:\n{out}");
    }
}

#[test]
fn close_with_a_dead_peer_is_bounded() {
    if let Some((rank, boot)) = child() {
        let c = ShmCollective::new(&boot, config()).unwrap();
        all_reduce(&c, 16).unwrap();
        if rank == 0 {
            std::process::abort();
        }
        // Let rank 0 die first.
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let r = c.close();
        assert!(t.elapsed() <= BOUND + Duration::from_secs(1), "close took {:?}", t.elapsed());
        println!("VERDICT ok rank {rank}: close -> {r:?}");
        return;
    }
    let results = launch(2, "close_with_a_dead_peer_is_bounded");
    assert!(results[1].0 && results[1].1.contains("VERDICT ok"), "{}", results[1].1);
}
