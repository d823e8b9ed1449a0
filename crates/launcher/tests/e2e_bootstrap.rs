//! End to end: ranks started by the launcher (this test binary, re-executed) join through
//! `TcpBootstrap::from_env`, exchange bytes, and notice a rank that went away.
#![cfg(unix)]

use collective_core::bootstrap::{Bootstrap, TcpBootstrap};
use detcoll_launch::{LaunchSpec, launch_captured};

const ROLE: &str = "DETCOLL_E2E_ROLE";

/// Re-executes this test binary as `nproc` ranks running only `test_name`.
fn ranks(nproc: usize, test_name: &str, role: &str) -> LaunchSpec {
    LaunchSpec::new(nproc, std::env::current_exe().unwrap())
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("DETCOLL_BOOTSTRAP_TIMEOUT_MS", "3000")
}

#[test]
fn ranks_gather_across_processes() {
    if std::env::var_os(ROLE).is_some() {
        let b = TcpBootstrap::from_env().unwrap();
        let got = b.all_gather_bytes(format!("r{}", b.rank()).as_bytes()).unwrap();
        let got: Vec<String> = got.into_iter().map(|v| String::from_utf8(v).unwrap()).collect();
        b.barrier().unwrap();
        println!("GATHERED {} {}", b.rank(), got.join(","));
        return;
    }
    let (outcome, out) = launch_captured(&ranks(4, "ranks_gather_across_processes", "gather")).unwrap();
    assert!(outcome.success(), "{outcome:?}\n{out:#?}");
    for (r, o) in out.iter().enumerate() {
        assert!(o.contains(&format!("GATHERED {r} r0,r1,r2,r3")), "rank {r}: {o}");
    }
}

#[test]
fn ranks_notice_a_process_that_left() {
    if std::env::var_os(ROLE).is_some() {
        let b = TcpBootstrap::from_env().unwrap();
        b.barrier().unwrap();
        if b.rank() == 2 {
            // Leaves without error: the launcher does not tear the group down, the bootstrap
            // must notice on its own.
            std::process::exit(0);
        }
        let e = b.barrier().unwrap_err();
        println!("CULPRIT {} {:?} {e}", b.rank(), e.culprit());
        return;
    }
    let (outcome, out) = launch_captured(&ranks(3, "ranks_notice_a_process_that_left", "leave")).unwrap();
    assert!(outcome.success(), "{outcome:?}\n{out:#?}");
    for r in [0, 1] {
        assert!(out[r].contains(&format!("CULPRIT {r} Some(2)")), "rank {r}: {}", out[r]);
    }
}
