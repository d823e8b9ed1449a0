//! Launcher tests with `sh -c` ranks.
#![cfg(unix)]

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use detcoll_launch::{LaunchError, LaunchSpec, launch, launch_captured, prefix_line};

fn sh(nproc: usize, script: &str) -> LaunchSpec {
    LaunchSpec::new(nproc, "sh").args(["-c", script])
}

#[test]
fn all_ranks_succeed() {
    let (outcome, out) = launch_captured(&sh(4, "echo hello from $RANK")).unwrap();
    assert!(outcome.success(), "{outcome:?}");
    assert_eq!(outcome.statuses.len(), 4);
    assert_eq!(outcome.first_failure, None);
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o, &format!("hello from {r}\n"));
    }
}

#[test]
fn printing_launch_succeeds() {
    // (Output of the printing path is checked through the binary below.)
    let outcome = launch(&sh(2, "exit 0")).unwrap();
    assert!(outcome.success());
    let mut spec = sh(2, "true");
    spec.prefix_output = false;
    assert!(launch(&spec).unwrap().success());
}

#[test]
fn children_see_torchrun_variables() {
    let script = "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $EXTRA";
    let mut spec = sh(3, script).env("EXTRA", "x y");
    spec.master_port = Some(29555);
    let (outcome, out) = launch_captured(&spec).unwrap();
    assert!(outcome.success());
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o, &format!("{r} 3 {r} 3 127.0.0.1 29555 x y\n"));
    }

    // Without a port, one free port is picked and given to every rank.
    let (outcome, out) = launch_captured(&sh(2, "echo $MASTER_PORT")).unwrap();
    assert!(outcome.success());
    let port: u16 = out[0].trim().parse().unwrap();
    assert!(port > 0);
    assert_eq!(out[0], out[1]);

    // spec.env overrides the launcher's variables.
    let (_, out) = launch_captured(&sh(1, "echo $MASTER_ADDR").env("MASTER_ADDR", "node7")).unwrap();
    assert_eq!(out[0], "node7\n");
}

/// MASTER_ADDR as an IPv6 address in brackets (what the bootstrap accepts) also when the
/// launcher picks the port: it binds the address without the brackets.
#[test]
fn a_bracketed_ipv6_master_addr_gets_a_free_port() {
    if std::net::TcpListener::bind(("::1", 0)).is_err() {
        eprintln!("skipped: this host has no IPv6 loopback (::1)");
        return;
    }
    let mut spec = sh(2, "echo $MASTER_ADDR $MASTER_PORT");
    spec.master_addr = "[::1]".into();
    let (outcome, out) = launch_captured(&spec).unwrap();
    assert!(outcome.success(), "{outcome:?}");
    let port: u16 = out[0].split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(port > 0);
    assert_eq!(out[0], format!("[::1] {port}\n"));
    assert_eq!(out[0], out[1]);
}

#[test]
fn failing_rank_stops_the_others() {
    let start = Instant::now();
    let spec = sh(4, r#"if [ "$RANK" = 1 ]; then echo bye; exit 3; fi; sleep 30"#);
    let (outcome, out) = launch_captured(&spec).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert!(!outcome.success());
    let (rank, status) = outcome.first_failure.unwrap();
    assert_eq!(rank, 1);
    assert_eq!(status.code(), Some(3));
    assert_eq!(out[1], "bye\n");
    for (r, st) in outcome.statuses.iter().enumerate() {
        if r != 1 {
            assert!(st.signal().is_some(), "rank {r}: {st}");
        }
    }
}

#[test]
fn rank_killed_by_signal_is_a_failure() {
    let start = Instant::now();
    let spec = sh(3, r#"if [ "$RANK" = 2 ]; then kill -9 $$; fi; sleep 30"#);
    let (outcome, _) = launch_captured(&spec).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    let (rank, status) = outcome.first_failure.unwrap();
    assert_eq!(rank, 2);
    assert_eq!(status.signal(), Some(9));
}

#[test]
fn grandchildren_holding_pipes_are_stopped_too() {
    // The background sleep keeps the output pipes open; it is in the rank's process group.
    let start = Instant::now();
    let spec = sh(2, r#"sleep 30 & if [ "$RANK" = 1 ]; then exit 5; fi; wait"#);
    let (outcome, _) = launch_captured(&spec).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert_eq!(outcome.first_failure.map(|(r, s)| (r, s.code())), Some((1, Some(5))));
}

#[test]
fn stdout_and_stderr_are_captured_line_by_line() {
    let (outcome, out) = launch_captured(&sh(2, r#"echo out $RANK; echo err $RANK >&2; printf 'no newline'"#)).unwrap();
    assert!(outcome.success());
    for (r, o) in out.iter().enumerate() {
        let lines: Vec<&str> = o.lines().collect();
        assert_eq!(lines.len(), 3, "{o:?}");
        assert!(lines.contains(&format!("out {r}").as_str()));
        assert!(lines.contains(&format!("err {r}").as_str()));
        assert!(lines.contains(&"no newline"));
        assert!(o.ends_with('\n'));
    }
}

#[test]
fn launch_errors() {
    assert!(matches!(launch_captured(&sh(0, "true")), Err(LaunchError::NoProcesses)));
    match launch_captured(&LaunchSpec::new(2, "/nonexistent/detcoll-test-program")) {
        Err(LaunchError::Spawn { rank: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn prefix_format() {
    assert_eq!(prefix_line(3, "hello"), "[rank 3] hello\n");
}

// ---- the binary ----

const BIN: &str = env!("CARGO_BIN_EXE_detcoll-run");

#[test]
fn binary_prefixes_output() {
    let out = Command::new(BIN)
        .args(["--nproc", "2", "--", "sh", "-c", "echo hi $RANK; echo warn $RANK >&2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    for r in 0..2 {
        assert!(stdout.contains(&format!("[rank {r}] hi {r}\n")), "{stdout}");
        assert!(stderr.contains(&format!("[rank {r}] warn {r}\n")), "{stderr}");
    }
}

/// A rank's output that is not UTF-8 is printed as its bytes, behind the prefix.
#[test]
fn binary_passes_bytes_that_are_not_utf8_through() {
    let out = Command::new(BIN).args(["--nproc", "1", "--", "sh", "-c", r"printf 'a\377\376b\n'"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"[rank 0] a\xff\xfeb\n");
}

#[test]
fn binary_reports_the_failed_rank() {
    let start = Instant::now();
    let out = Command::new(BIN)
        .args([
            "--nproc",
            "3",
            "--master-port",
            "29556",
            "--",
            "sh",
            "-c",
            r#"if [ "$RANK" = 1 ]; then exit 7; fi; sleep 30"#,
        ])
        .output()
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("rank 1 failed"), "{stderr}");
}

/// A rank that exits with status 0 while the others still run, then a peer fails (as a peer
/// of a rank that left mid-collective does): the report names the one that left, too.
#[test]
fn binary_names_a_rank_that_left_early() {
    let out = Command::new(BIN)
        .args(["--nproc", "3", "--", "sh", "-c", r#"case $RANK in 1) exit 0;; 0) sleep 0.5; exit 12;; esac; sleep 30"#])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(12), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("detcoll-run: rank 0 failed first (exit status: 12)"), "{stderr}");
    assert!(stderr.contains("rank 1 had already exited (exit status: 0) while other ranks were running"), "{stderr}");
    assert!(stderr.contains("rank 2 was stopped by the launcher"), "{stderr}");
}

/// A launch error with a cause prints the cause once (the library's message already ends
/// with it; it is also its `source()`).
#[test]
fn binary_prints_a_cause_once() {
    let out = Command::new(BIN).args(["--nproc", "2", "--", "/nonexistent/detcoll-prog"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("detcoll-run: launching /nonexistent/detcoll-prog: cannot start rank 0"), "{stderr}");
    assert_eq!(stderr.matches("No such file or directory").count(), 1, "{stderr}");
}

/// A consumer that reads the launcher's output late (a pager, a slow terminal, ssh) still gets
/// every line, on success and on failure. Before, the launcher gave its readers 1 s after the
/// last rank exited and returned: about 64 KiB a pipe was dropped, with exit status 0.
#[test]
fn binary_forwards_every_line_to_a_slow_consumer() {
    for (script, code) in [("seq 1 20000", 0), ("seq 1 20000; exit 3", 3), ("seq 1 20000 >&2", 0)] {
        let mut child = Command::new(BIN)
            .args(["--nproc", "1", "--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Nothing read for longer than the launcher's grace for idle readers.
        std::thread::sleep(Duration::from_millis(2500));
        let mut err = child.stderr.take().unwrap();
        let errs = std::thread::spawn(move || {
            let mut s = String::new();
            err.read_to_string(&mut s).unwrap();
            s
        });
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        let status = child.wait().unwrap();
        let err = errs.join().unwrap();
        assert_eq!(status.code(), Some(code), "{script}: {err}");
        let lines = if script.contains(">&2") { &err } else { &out };
        let got: Vec<&str> = lines.lines().filter(|l| l.starts_with("[rank 0] ")).collect();
        assert_eq!(got.len(), 20000, "{script}: lines forwarded");
        assert_eq!(got[19999], "[rank 0] 20000", "{script}: the last line");
    }
}

/// A grandchild that keeps writing after the ranks exited does not hold the launcher (it
/// forwards at most about a pipe's worth more), nor does one holding a pipe open in silence.
#[test]
fn binary_returns_despite_a_grandchild_writing_on() {
    for script in ["(yes &); echo hi", "(sleep 30 &); echo hi"] {
        let start = Instant::now();
        let out = Command::new(BIN).args(["--nproc", "1", "--", "sh", "-c", script]).output().unwrap();
        assert!(out.status.success(), "{script}: {out:?}");
        assert!(start.elapsed() < Duration::from_secs(10), "{script}: took {:?}", start.elapsed());
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("[rank 0] hi\n"), "{script}");
    }
    // The writing grandchild dies of SIGPIPE now that the launcher is gone.
}

/// `--master-port 0` is any free port, as for a socket (before, the ranks got port 0).
#[test]
fn binary_master_port_0_picks_a_free_port() {
    let out = Command::new(BIN)
        .args(["--nproc", "1", "--master-port", "0", "--", "sh", "-c", "echo $MASTER_PORT"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let port: u16 = String::from_utf8(out.stdout).unwrap().trim().trim_start_matches("[rank 0] ").parse().unwrap();
    assert_ne!(port, 0);
}

#[test]
fn binary_rejects_bad_arguments() {
    let out = Command::new(BIN).args(["--nproc", "0", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    let out = Command::new(BIN).args(["--nproc", "2"]).output().unwrap();
    assert!(!out.status.success());
}

#[cfg(target_os = "linux")]
#[test]
fn binary_stops_ranks_when_terminated() {
    let mut child = Command::new(BIN)
        .args(["--nproc", "2", "--", "sh", "-c", "echo pid $$; exec sleep 30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) on our own child process; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let pids: Vec<&str> = stdout.lines().filter_map(|l| l.split("pid ").nth(1)).collect();
    assert_eq!(pids.len(), 2, "{stdout}");
    for p in pids {
        assert!(!std::path::Path::new(&format!("/proc/{p}")).exists(), "rank process {p} survived");
    }
}

// ---- job token, culprit, death with the launcher ----

#[test]
fn ranks_get_one_fresh_job_token_per_launch() {
    let (outcome, out) = launch_captured(&sh(3, "echo $DETCOLL_JOB_TOKEN")).unwrap();
    assert!(outcome.success());
    let token = out[0].trim().to_owned();
    assert_eq!(token.len(), 32, "{token:?}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token:?}");
    assert!(out.iter().all(|o| o.trim() == token), "{out:?}");
    let (_, again) = launch_captured(&sh(1, "echo $DETCOLL_JOB_TOKEN")).unwrap();
    assert_ne!(again[0].trim(), token, "two launches share a token");
    // An explicit token in spec.env is passed through as is.
    let (_, out) = launch_captured(&sh(2, "echo $DETCOLL_JOB_TOKEN").env("DETCOLL_JOB_TOKEN", "mine")).unwrap();
    assert_eq!(out, ["mine\n", "mine\n"]);
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("detcoll-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Rank 2 fails (exit 3) after a delay; ranks 0 and 1 fail (exit 1) 20 ms after they see it
/// exit (its /proc state turns to zombie, before the launcher reaps it); rank 3 hangs. The
/// failures of ranks 0 and 1 come a few tens of ms after rank 2's, within a couple of polls of
/// the launcher, where a rank-order sweep would have blamed rank 0. (Without the 20 ms, on a
/// loaded 2-core CI machine rank 1's exit watcher once ran before rank 2's: exits closer than
/// the scheduling delay are not ordered, see `LaunchOutcome::first_failure`.)
const CASCADE: &str = r#"
d=$SCRATCH
if [ "$RANK" = 2 ]; then echo $$ > $d/pid2.tmp; mv $d/pid2.tmp $d/pid2; sleep 0.3; exit 3; fi
if [ "$RANK" = 3 ]; then exec sleep 30; fi
while [ ! -e $d/pid2 ]; do sleep 0.01; done
p=$(cat $d/pid2)
while read -r _ _ st _ < /proc/$p/stat; do [ "$st" = Z ] && break; sleep 0.002; done 2>/dev/null
sleep 0.02
exit 1
"#;

#[cfg(target_os = "linux")]
#[test]
fn culprit_is_the_rank_that_failed_first_not_the_first_seen() {
    for round in 0..3 {
        let dir = scratch_dir(&format!("cascade{round}"));
        let start = Instant::now();
        let (outcome, out) = launch_captured(&sh(4, CASCADE).env("SCRATCH", &dir)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(6), "{:?}", start.elapsed());
        let (rank, status) = outcome.first_failure.unwrap();
        assert_eq!((rank, status.code()), (2, Some(3)), "round {round}: {outcome:?}\n{out:?}");
        assert!(!outcome.stopped_by_launcher[2]);
        assert!(outcome.stopped_by_launcher[3], "the hanging rank was stopped: {outcome:?}");
        assert!(outcome.statuses[3].signal().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(target_os = "linux")]
#[test]
fn binary_names_the_rank_that_failed_first_and_the_stopped_ones() {
    let dir = scratch_dir("cascade-bin");
    let out =
        Command::new(BIN).args(["--nproc", "4", "--", "sh", "-c", CASCADE]).env("SCRATCH", &dir).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("detcoll-run: rank 2 failed first (exit status: 3)"), "{stderr}");
    assert!(stderr.contains("rank 3 was stopped by the launcher"), "{stderr}");
}

/// The state letter of /proc/<pid>/stat, `None` when the process is gone.
#[cfg(target_os = "linux")]
fn proc_state(pid: &str) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next())
}

#[cfg(target_os = "linux")]
#[test]
fn ranks_die_when_the_launcher_is_killed() {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["--nproc", "2", "--", "sh", "-c", "echo pid $$; exec sleep 30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut pids = Vec::new();
    while pids.len() < 2 {
        let line = lines.next().expect("the launcher printed both pids").unwrap();
        pids.extend(line.split("pid ").nth(1).map(str::to_owned));
    }
    for p in &pids {
        assert_eq!(proc_state(p).map(|s| s != 'Z'), Some(true), "rank {p} should be running");
    }
    // SIGKILL: the launcher gets no chance to stop its ranks itself.
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    for p in &pids {
        // Gone, or a zombie waiting for its new parent to reap it.
        while proc_state(p).is_some_and(|s| s != 'Z') {
            assert!(start.elapsed() < Duration::from_secs(3), "rank {p} outlived the launcher");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
