//! Agreement across real processes: ranks that disagree all get the same error, none hangs;
//! ranks on "different hosts" all move to the transport together.
#![cfg(feature = "cpu")]
use collective_core::bootstrap::{Bootstrap, TcpBootstrap};
use collective_core::conformance::memory::{Flaw, MemoryCollective};
use collective_core::{Collective, Error, Io, Op, Route};
use collective_factory::{Config, cpu};
use detcoll_launch::{LaunchSpec, launch_captured};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCENARIO: &str = "DETCOLL_TEST_SCENARIO";

/// Parent: launches 4 ranks of `test` with `scenario`; returns every rank's output (all must
/// exit 0 and print a verdict).
fn launch(test: &str, scenario: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let mut spec =
        LaunchSpec::new(4, exe).args([test, "--exact", "--nocapture", "--test-threads=1"]).env(SCENARIO, scenario);
    spec.stop_on_failure = false;
    let t = Instant::now();
    let (outcome, outputs) = launch_captured(&spec).expect("launch");
    assert!(t.elapsed() < Duration::from_secs(60), "agreement took {:?}", t.elapsed());
    for (r, (s, out)) in outcome.statuses.iter().zip(&outputs).enumerate() {
        assert!(s.success() && out.contains("VERDICT"), "rank {r} ({scenario}) failed:\n{out}");
    }
    outputs
}

/// Child: builds the CPU collective with a test transport, varying by scenario and rank.
fn build(
    scenario: &str,
) -> (usize, Result<collective_factory::Routed<shm_ipc::ShmCollective, MemoryCollective>, Error>) {
    let boot = Arc::new(TcpBootstrap::from_env().expect("bootstrap"));
    let rank = boot.rank();
    let capacity = if scenario == "capacity" && rank == 2 { 1 << 15 } else { 1 << 16 };
    let tb = boot.clone();
    let r = cpu::with_transport(
        &*boot,
        &Config::new().with_capacity(capacity),
        Some(move || Ok::<_, Error>(MemoryCollective::new(tb, capacity, Flaw::None))),
    );
    (rank, r)
}

#[test]
fn disagreeing_capacity_fails_on_every_rank() {
    if let Ok(s) = std::env::var(SCENARIO) {
        let (rank, r) = build(&s);
        let err = r.expect_err("ranks with different capacities must not build");
        assert!(matches!(err, Error::ConfigMismatch { .. }) && err.to_string().contains("rank 2"), "{err}");
        println!("VERDICT rank {rank}: {err}");
        return;
    }
    let outs = launch("disagreeing_capacity_fails_on_every_rank", "capacity");
    // One clear error, the same everywhere.
    let msgs: Vec<&str> =
        outs.iter().map(|o| o.lines().find(|l| l.contains("VERDICT")).unwrap().split_once(": ").unwrap().1).collect();
    assert!(msgs.iter().all(|m| *m == msgs[0]), "{msgs:?}");
}

#[test]
fn a_rank_on_another_platform_fails_everyone() {
    if let Ok(s) = std::env::var(SCENARIO) {
        // Rank 1 claims to be on NVIDIA (its detection differs): nobody may fall back alone.
        let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
        if rank == 1 {
            // SAFETY: single-threaded at this point of the child (before any bootstrap thread).
            unsafe { std::env::set_var("DETCOLL_PLATFORM", "nvidia") };
        }
        let (rank, r) = build(&s);
        let err = r.expect_err("must fail");
        assert!(err.to_string().contains("platform"), "{err}");
        println!("VERDICT rank {rank}: {err}");
        return;
    }
    launch("a_rank_on_another_platform_fails_everyone", "platform");
}

#[test]
fn ranks_on_several_hosts_all_take_the_transport() {
    if let Ok(s) = std::env::var(SCENARIO) {
        let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
        if rank == 3 {
            // SAFETY: single-threaded at this point of the child.
            unsafe { std::env::set_var("DETCOLL_HOST_ID", "another-host") };
        }
        let (rank, r) = build(&s);
        let c = r.expect("a transport makes several hosts possible");
        assert_eq!(c.route(Op::AllReduce, 4096), Route::Transport);
        assert!(c.ipc().is_none());
        let input: Vec<f32> = (0..64).map(|i| (i + rank) as f32 * 0.25).collect();
        let mut out = vec![0f32; 64];
        c.all_reduce(Io::host(&input, &mut out), &()).unwrap();
        let want: Vec<u32> = (0..64)
            .map(|i| {
                let x = |r: usize| (i + r) as f32 * 0.25;
                ((x(0) + x(1)) + (x(2) + x(3))).to_bits()
            })
            .collect();
        assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        c.close().unwrap();
        println!("VERDICT rank {rank}: transport, bitwise");
        return;
    }
    let outs = launch("ranks_on_several_hosts_all_take_the_transport", "hosts");
    assert!(outs.iter().all(|o| o.contains("transport, bitwise")));
}
