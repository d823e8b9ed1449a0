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
