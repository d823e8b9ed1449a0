//! What an outside probe of `detcoll-run` found (2026-12-06), as users meet it: lines of more
//! than 4 KiB split mid-line where stdout and stderr share one pipe (`2>&1 | tee`); a `\r`
//! before the newline dropped; a line without end held whole in memory; exit status 101 (a
//! panic) instead of the failed rank's when stderr is a closed pipe; a launcher told to stop
//! (`SIGTERM`) that never exits while its consumer does not read; a mistyped option taken as the
//! program; `GROUP_RANK` passed through from the environment instead of torchrun's.
#![cfg(unix)]

use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use detcoll_launch::MAX_LINE_BYTES;

const BIN: &str = env!("CARGO_BIN_EXE_detcoll-run");

/// A pipe: (read end, write end), close-on-exec (so the other tests' children, started
/// meanwhile, do not hold it open; a child's stdout or stderr made of it is its own copy).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) writes two new descriptors into `fds`, which we then own (each wrapped
    // once in a File).
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: as above: fresh descriptors owned by nothing else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// Runs the launcher with stdout and stderr on one pipe; returns its status and what it wrote.
fn run_on_one_pipe(args: &[&str]) -> (std::process::ExitStatus, Vec<u8>) {
    let (mut reader, writer) = pipe();
    let mut child = Command::new(BIN).args(args).stdout(writer.try_clone().unwrap()).stderr(writer).spawn().unwrap();
    let mut out = Vec::new();
    reader.read_to_end(&mut out).unwrap();
    (child.wait().unwrap(), out)
}

#[test]
fn long_lines_stay_whole_when_stdout_and_stderr_share_a_pipe() {
    // Two ranks, each writing 5000-byte lines to stdout and stderr by turns.
    let script = "i=0; while [ $i -lt 100 ]; do printf '%05000d\\n' $i; printf '%05000d\\n' $i >&2; i=$((i+1)); done";
    let (status, out) = run_on_one_pipe(&["--nproc", "2", "--", "sh", "-c", script]);
    assert!(status.success(), "{status}");
    let text = String::from_utf8(out).unwrap();
    let mut lines = 0;
    for line in text.lines() {
        let body = line.strip_prefix("[rank 0] ").or_else(|| line.strip_prefix("[rank 1] "));
        let body = body.unwrap_or_else(|| panic!("a line not from a rank: {:?}", &line[..line.len().min(80)]));
        assert!(body.len() == 5000 && body.bytes().all(|b| b.is_ascii_digit()), "a broken line of {}", body.len());
        lines += 1;
    }
    assert_eq!(lines, 400);
}

#[test]
fn a_carriage_return_before_the_newline_is_kept() {
    let out = Command::new(BIN).args(["--nproc", "1", "--", "sh", "-c", r"printf 'a\r\nb\n'"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"[rank 0] a\r\n[rank 0] b\n");
}

#[test]
fn a_line_longer_than_the_limit_is_forwarded_in_pieces() {
    // 2.5 pieces' worth without a newline, then the end of the output.
    let n = MAX_LINE_BYTES * 5 / 2;
    let script = format!("head -c {n} /dev/zero | tr '\\0' x");
    let out = Command::new(BIN).args(["--nproc", "1", "--", "sh", "-c", &script]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let pieces: Vec<&str> = text.lines().map(|l| l.strip_prefix("[rank 0] ").expect("a prefixed piece")).collect();
    assert_eq!(
        pieces.iter().map(|p| p.len()).collect::<Vec<_>>(),
        [MAX_LINE_BYTES, MAX_LINE_BYTES, n - 2 * MAX_LINE_BYTES]
    );
    assert!(pieces.iter().all(|p| p.bytes().all(|b| b == b'x')));
}

/// A line of exactly one or two pieces: its newline ends the last piece, rather than following
/// as an empty line of its own (it did until 2026-12-06).
#[test]
fn a_line_of_whole_pieces_ends_with_its_last_piece() {
    for k in [1, 2] {
        let n = MAX_LINE_BYTES * k;
        let script = format!("head -c {n} /dev/zero | tr '\\0' x; echo; echo next");
        let out = Command::new(BIN).args(["--nproc", "1", "--", "sh", "-c", &script]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().map(|l| l.strip_prefix("[rank 0] ").expect("a prefixed line")).collect();
        let mut expected = vec![MAX_LINE_BYTES; k];
        expected.push(4);
        assert_eq!(lines.iter().map(|l| l.len()).collect::<Vec<_>>(), expected, "a line of {k} pieces");
        assert_eq!(lines[k], "next");
    }
}

#[test]
fn a_closed_stderr_keeps_the_failed_ranks_exit_status() {
    let (reader, writer) = pipe();
    drop(reader); // every write to the launcher's stderr fails (EPIPE)
    let status = Command::new(BIN)
        .args(["--nproc", "2", "--", "sh", "-c", "echo oops >&2; [ $RANK = 1 ] && exit 5; sleep 10"])
        .stdout(Stdio::null())
        .stderr(writer)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(5), "{status}");
}

#[test]
fn a_terminated_launcher_exits_although_its_consumer_does_not_read() {
    // The ranks flood stdout; nobody reads the launcher's stdout.
    let (reader, writer) = pipe();
    let mut child = Command::new(BIN)
        .args(["--nproc", "2", "--", "sh", "-c", "while :; do echo flood flood flood flood flood; done"])
        .stdout(writer)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700)); // the pipe is full by now
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    let start = Instant::now();
    // SAFETY: kill(2) on our own child process; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = start + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the launcher did not exit within 15 s of SIGTERM while its stdout was not read");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(start.elapsed() < Duration::from_secs(8), "{:?}", start.elapsed());
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    drop(reader);
}

#[test]
fn a_mistyped_option_is_a_usage_error_not_the_program() {
    let out = Command::new(BIN).args(["--nproc", "2", "--bogus", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--bogus") && stderr.contains("--"), "{stderr}");
}

#[test]
fn group_rank_is_the_node_rank_whatever_the_environment_says() {
    let out = Command::new(BIN)
        .args(["--nproc", "2", "--", "sh", "-c", "echo group $GROUP_RANK"])
        .env("GROUP_RANK", "5")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.matches("group 0\n").count(), 2, "{stdout}");
}
