//! Ranks that come after the rendezvous failed are told why even when rank 0's process exits
//! on the error, as the usual `TcpBootstrap::from_env()?` in `main` does. Rank 0's thread that
//! answers late ranks dies with its process, so ranks started together with rank 0 but a few
//! milliseconds after its failure waited out their connect timeout and failed with
//! `ConnectTimeout` (an outside probe: ranks 2 and 3 of 4 waited 60 s after a duplicate rank 1)
//! where running.md promises every rank the same error. Rank 0's constructor now tells them for
//! up to `LATE_RANKS_GRACE` before it returns.
//!
//! Rank 0 runs in a child process (this test binary again, with [`CHILD`] set) that exits the
//! moment its constructor returns; the duplicate rank 1s and the late ranks run in the parent.

use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use detcoll_bootstrap::{BootstrapError, LATE_RANKS_GRACE, TcpBootstrap, TcpConfig};

const ADDR: &str = "127.0.0.1";
const TOKEN: &str = "late-ranks-job";
/// The child's `port`.
const CHILD: &str = "DETCOLL_LATE_RANKS_CHILD";
const WORLD: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(20);

fn cfg(rank: usize, port: u16, timeout: Duration) -> TcpConfig {
    TcpConfig::single_host(rank, WORLD, ADDR, port).with_timeout(timeout).with_job_token(TOKEN)
}

/// In the child: rank 0's rendezvous, `RESULT <error or ok> elapsed_ms=<ms>` printed, then the
/// process exits at once, as a `main` that returns the error does.
fn child_rank_0() {
    let Ok(port) = std::env::var(CHILD) else { return };
    let start = Instant::now();
    let what = match TcpBootstrap::new(cfg(0, port.parse().unwrap(), TIMEOUT)) {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("{e:?}"),
    };
    println!("RESULT {what} elapsed_ms={}", start.elapsed().as_millis());
    std::io::stdout().flush().unwrap();
    std::process::exit(0);
}

#[test]
fn late_ranks_are_told_of_a_duplicate_rank_when_rank_0_exits_on_it() {
    child_rank_0();
    let port = TcpListener::bind((ADDR, 0)).unwrap().local_addr().unwrap().port();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["late_ranks_are_told_of_a_duplicate_rank_when_rank_0_exits_on_it", "--exact", "--nocapture"])
        .env(CHILD, port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rank 0");
    // Two processes' worth of rank 1: rank 0 fails on the second.
    let ones: Vec<_> =
        (0..2).map(|_| thread::spawn(move || TcpBootstrap::new(cfg(1, port, TIMEOUT)).map(|_| ()))).collect();
    for h in ones {
        let e = h.join().unwrap().unwrap_err();
        assert!(matches!(e, BootstrapError::DuplicateRank { rank: 1 }), "a rank 1: {e}");
    }
    // Ranks 2 and 3 start a little later, when rank 0's constructor has failed (and, before,
    // had returned and its process exited).
    thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let late: Vec<_> =
        (2..WORLD).map(|r| thread::spawn(move || TcpBootstrap::new(cfg(r, port, Duration::from_secs(10))))).collect();
    for (r, h) in (2..).zip(late) {
        let e = h.join().unwrap().map(|_| ()).unwrap_err();
        assert!(matches!(e, BootstrapError::DuplicateRank { rank: 1 }), "late rank {r}: {e}");
    }
    assert!(start.elapsed() < Duration::from_secs(5), "the late ranks took {:?}", start.elapsed());
    let out = child.wait_with_output().expect("rank 0's output");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let result = text.lines().find_map(|l| l.find("RESULT ").map(|i| l[i..].to_owned())).unwrap_or(text);
    assert!(result.contains("DuplicateRank { rank: 1 }"), "rank 0: {result}");
    // Every rank was told: rank 0 returned then, without waiting out its grace.
    let ms: u64 = result.rsplit("elapsed_ms=").next().unwrap().trim().parse().unwrap();
    assert!(Duration::from_millis(ms) < LATE_RANKS_GRACE, "rank 0: {result}");
}
