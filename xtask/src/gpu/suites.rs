//! Running one suite: its environment (library path, kernel directory, [`SuiteVar`]s), its own
//! process group so a timeout or an interrupt kills it with everything it started (through the
//! launcher's [`detcoll_launch::signal_process_group`]), and its libtest output counted as it
//! streams.
use super::suite_env::SuiteVar;
use super::summary::{Counts, SuiteResult};
use super::workspace::Suite;
use crate::util::show;
use anyhow::Context;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// Where CUDA's libraries usually live.
const CUDA_LIB: &str = "/usr/local/cuda/lib64";

/// Environment variable telling GPU code where prebuilt kernels are (set by `gpu-test`).
pub const KERNEL_DIR_ENV: &str = "DETCOLL_KERNEL_DIR";

fn library_path() -> std::ffi::OsString {
    let mut parts: Vec<PathBuf> = Vec::new();
    if Path::new(CUDA_LIB).is_dir() {
        parts.push(PathBuf::from(CUDA_LIB));
    }
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        parts.extend(std::env::split_paths(&old).filter(|p| p != Path::new(CUDA_LIB)));
    }
    std::env::join_paths(parts).unwrap_or_default()
}

/// The signal that interrupted `gpu-test` (0: none yet).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);
/// The process group of the suite running now (0: none), killed by the signal handler.
static RUNNING_GROUP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only atomics and kill(2) (all the launcher's helper does) here: both are async-signal-safe.
    INTERRUPTED.store(sig, Ordering::SeqCst);
    let group = RUNNING_GROUP.load(Ordering::SeqCst);
    if group > 0 {
        detcoll_launch::signal_process_group(group as u32, libc::SIGKILL);
    }
}

/// On SIGINT, SIGTERM or SIGHUP: kill the running suite and let `gpu-test` stop after it, so
/// that MPS it started is stopped on the way out. The handler is reset by its first signal,
/// so a second one kills `gpu-test` at once. Signals ignored on entry (`nohup`, background
/// jobs) stay ignored.
pub(super) fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: plain sigaction(2) calls on zero-initialised structs; the handler only
        // touches atomics and calls kill(2).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                eprintln!("[gpu] warning: cannot handle signal {sig}: an interrupt may leave MPS running");
            }
        }
    }
}

/// The signal that interrupted `gpu-test`, if any.
pub(super) fn interrupted() -> Option<i32> {
    Some(INTERRUPTED.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// Kills the process group `pgid` (a suite and every process it started).
fn kill_group(pgid: u32) {
    detcoll_launch::signal_process_group(pgid, libc::SIGKILL);
}

pub(super) fn run_suite(
    s: &Suite,
    cwd: &Path,
    test_args: &[String],
    kernel_dir: Option<&Path>,
    vars: &[SuiteVar],
    timeout: Duration,
) -> anyhow::Result<SuiteResult> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(&s.path);
    cmd.arg("--test-threads=1")
        .args(test_args)
        .current_dir(cwd)
        .env("LD_LIBRARY_PATH", library_path())
        .envs(vars.iter().map(|v| (v.name, &v.value)));
    if let Some(k) = kernel_dir {
        cmd.env(KERNEL_DIR_ENV, k);
    }
    // Own process group: on timeout the suite and the processes it started are killed together.
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    eprintln!("[gpu] === {} ({})", s.name, show(&cmd));
    for v in vars {
        eprintln!("[gpu] {}={} ({})", v.name, v.value, v.why);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {}", s.path.display()))?;
    let pgid = child.id();
    RUNNING_GROUP.store(pgid as i32, Ordering::SeqCst);
    if interrupted().is_some() {
        // The signal came before the handler could see this group.
        kill_group(pgid);
    }
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let timed_out = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let timed_out = Arc::clone(&timed_out);
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(timeout) {
                timed_out.store(true, Ordering::SeqCst);
                eprintln!("[gpu] suite ran past {} s: killing it", timeout.as_secs());
                kill_group(pgid);
            }
        })
    };
    // stderr is forwarded as it comes, and its `skipped:` lines counted (a GPU test without
    // its GPU passes after saying so: it must not count as passed).
    let stderr = child.stderr.take().map(|e| {
        std::thread::spawn(move || {
            let mut counts = Counts::default();
            for line in BufReader::new(e).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                counts.add_stderr_line(&line);
            }
            counts.said_skipped
        })
    });
    let mut counts = Counts::default();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            println!("{line}");
            counts.add_line(&line);
        }
    }
    let status = child.wait();
    counts.said_skipped = stderr.map_or(0, |h| h.join().unwrap_or(0));
    RUNNING_GROUP.store(0, Ordering::SeqCst);
    let status = status?;
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let timed_out = timed_out.load(Ordering::SeqCst);
    let ok = status.success() && counts.failed() == 0 && !timed_out;
    let signal = interrupted();
    let ok = ok && signal.is_none();
    let status = if let Some(sig) = signal {
        format!("INTERRUPTED (signal {sig})")
    } else if timed_out {
        format!("TIMEOUT after {} s", timeout.as_secs())
    } else if ok && counts.totals().0 == 0 && counts.totals().2 > 0 {
        "ok (every test skipped)".to_owned()
    } else if ok && counts.results == 0 {
        "ok (no libtest summary)".to_owned()
    } else if ok {
        "ok".to_owned()
    } else {
        format!("FAILED ({status})")
    };
    Ok(SuiteResult { name: s.name.clone(), ok, status, counts, secs: start.elapsed().as_secs_f64() })
}
