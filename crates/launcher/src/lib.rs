//! A `torchrun --standalone`-like launcher for detcoll ranks.
//!
//! [`launch`] starts `nproc` copies of a program on this host with the torchrun variables set
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` = `nproc`, `MASTER_ADDR`,
//! `MASTER_PORT`, and `GROUP_RANK`), so `collective_core::bootstrap::TcpBootstrap::from_env`
//! joins them. Each line a rank writes is re-printed with a `[rank N] ` prefix (stdout to
//! stdout, stderr to stderr; one line at a time under one lock for both, so lines stay whole
//! where both go to one pipe; a line longer than [`MAX_LINE_BYTES`] in pieces of that size).
//! Every line a rank wrote before it exited is forwarded before [`launch`] returns, however
//! slowly the launcher's own output is read (a pager, ssh); what a rank's background children
//! write after every rank exited is forwarded only while they keep writing and for at most
//! about a pipe's worth (1 MiB), so they cannot hold the launcher. A closed output (`| head`)
//! discards the lines and the ranks run on.
//!
//! Every rank gets a fresh random `DETCOLL_JOB_TOKEN` (128 bits from the OS, unless
//! [`LaunchSpec::env`] sets one), so ranks of this launch only rendezvous with each other: a
//! process of another job that reaches the same `MASTER_PORT` cannot join.
//!
//! When a rank exits with a non-zero status or is killed by a signal, the others are sent
//! `SIGTERM`, then `SIGKILL` after [`KILL_GRACE`]; every rank is waited for. The launcher
//! records when each rank exited (a watcher thread per rank wakes at its exit without reaping
//! it), and [`LaunchOutcome::first_failure`] is the failure that happened *first* before the
//! launcher began stopping ranks — the rank that failed for a reason of its own, not one that
//! failed because of it or was stopped ([`LaunchOutcome::stopped_by_launcher`]). Each rank runs
//! in its own process group, so the signals also reach whatever it started (e.g. the program
//! behind `sh -c`).
//!
//! On Linux every rank is started with `PR_SET_PDEATHSIG = SIGKILL`: if the launcher dies
//! (even by `SIGKILL`), its ranks die with it instead of running on as orphans. (The kernel
//! sends it when the *thread* that spawned the rank exits; [`launch`] spawns and waits on the
//! calling thread, which lives until the ranks are gone. It reaches the rank process itself,
//! not processes the rank started.)
//! While a launch is running, `SIGINT`, `SIGTERM` and `SIGHUP` sent to the launcher stop every
//! rank the same way and the launch returns [`LaunchError::Interrupted`] (signals the launcher
//! ignored when it started stay ignored).
//!
//! [`launch_captured`] does the same but collects each rank's output instead of printing it
//! (for tests).

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long ranks get between `SIGTERM` and `SIGKILL` once the group is being torn down.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long an idle output reader may keep the launcher after every rank exited (a grandchild
/// that keeps a pipe open and silent does not hold it). A reader still forwarding what the
/// ranks wrote (blocked on a slow consumer of the launcher's output, or reading on) is waited
/// for: the ranks' last lines are never dropped.
const READER_GRACE: Duration = Duration::from_secs(1);
/// After every rank exited, a reader is waited for only while it has forwarded at most this
/// many more bytes: the most a pipe holds (Linux's `pipe-max-size` default, 1 MiB) plus the
/// reader's buffer, so everything the ranks wrote before they exited is forwarded, and a
/// grandchild that keeps writing does not hold the launcher.
const READER_TAIL_BYTES: u64 = (1 << 20) + (64 << 10);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Once a signal stopped the launch, how long the ranks' last output is forwarded at most: a
/// consumer that does not read (a stalled terminal or ssh) must not keep the launcher alive
/// after it was told to end (the lines not forwarded by then are dropped).
pub const SIGNAL_DRAIN: Duration = Duration::from_secs(2);

/// What to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// Number of ranks (>= 1).
    pub nproc: usize,
    /// The program every rank runs.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment (applied after the launcher variables, so it can override them).
    pub env: Vec<(OsString, OsString)>,
    /// `MASTER_ADDR` (default `127.0.0.1`).
    pub master_addr: String,
    /// `MASTER_PORT`; `None` (or 0) picks a free port on `master_addr`.
    pub master_port: Option<u16>,
    /// Re-print each output line with a `[rank N] ` prefix; when false, ranks write straight
    /// to the launcher's stdout/stderr. ([`launch_captured`] always captures.)
    pub prefix_output: bool,
    /// Stop the other ranks as soon as one fails (torchrun's behaviour; default). Fault tests
    /// that kill a rank on purpose turn it off to see how the survivors react.
    pub stop_on_failure: bool,
    /// Simulate this many hosts ("virtual nodes") on this one: rank `r` of `L = nproc / n`
    /// per node gets `DETCOLL_HOST_ID=virtual-node-<r / L>`, `LOCAL_RANK = r % L`,
    /// `LOCAL_WORLD_SIZE = L` and `GROUP_RANK = r / L` — what torchrun gives the ranks of `n`
    /// nodes — so detcoll routes the world as it would across hosts. For tests and benchmarks;
    /// `nproc` must divide by it. `None`: one host.
    pub virtual_nodes: Option<usize>,
}

impl LaunchSpec {
    /// `nproc` ranks of `program`, no arguments, `127.0.0.1`, a free port, prefixed output.
    pub fn new(nproc: usize, program: impl Into<PathBuf>) -> Self {
        Self {
            nproc,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            master_addr: "127.0.0.1".to_owned(),
            master_port: None,
            prefix_output: true,
            stop_on_failure: true,
            virtual_nodes: None,
        }
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// How the ranks ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// Exit status of every rank, in rank order (ranks stopped by the launcher show the signal).
    pub statuses: Vec<ExitStatus>,
    /// The rank that failed first (non-zero exit or killed by a signal, earliest exit time)
    /// before the launcher started stopping ranks: the one that made the launcher stop the
    /// others. Ranks that failed later, e.g. because this one was gone, are not it. Exit times
    /// are taken when a watcher thread sees the exit, so two exits closer together than the
    /// host's scheduling delay (a few ms on a loaded machine) may be ordered either way.
    pub first_failure: Option<(usize, ExitStatus)>,
    /// Per rank: it was still running when the launcher began stopping the group (after a
    /// failure or a signal), so its status is the launcher's doing (or a consequence of it).
    pub stopped_by_launcher: Vec<bool>,
}

impl LaunchOutcome {
    /// Every rank exited with status 0.
    pub fn success(&self) -> bool {
        self.first_failure.is_none() && self.statuses.iter().all(ExitStatus::success)
    }
}

/// Why a launch could not run to the end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// `nproc` was 0.
    #[error("nproc must be at least 1")]
    NoProcesses,
    /// `virtual_nodes` is 0 or does not divide `nproc`.
    #[error("{nproc} ranks cannot be spread evenly over {nodes} virtual nodes")]
    VirtualNodes {
        /// `nproc`.
        nproc: usize,
        /// `virtual_nodes`.
        nodes: usize,
    },
    /// No free port could be picked for `MASTER_PORT`.
    #[error("cannot pick a free MASTER_PORT on {addr}: {source}")]
    Port {
        /// `master_addr`.
        addr: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A rank could not be started (the already started ranks were stopped).
    #[error("cannot start rank {rank} ({program}): {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program.
        program: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// No thread could be started to forward a rank's output (the started ranks were stopped).
    #[error("cannot start a thread to forward rank {rank}'s output: {source}")]
    Reader {
        /// The rank.
        rank: usize,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Waiting for a rank failed (the others were stopped).
    #[error("cannot wait for rank {rank}: {source}")]
    Wait {
        /// The rank.
        rank: usize,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// No random job token could be drawn from the OS.
    #[error("cannot draw a random DETCOLL_JOB_TOKEN: {source}")]
    JobToken {
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The launcher received a signal; every rank was stopped.
    #[error("interrupted by signal {signal}; all ranks were stopped")]
    Interrupted {
        /// The signal number.
        signal: i32,
        /// How the ranks ended.
        outcome: LaunchOutcome,
    },
}

/// Starts the ranks, prints their output (prefixed when `spec.prefix_output`), and waits for
/// all of them; see the crate documentation.
pub fn launch(spec: &LaunchSpec) -> Result<LaunchOutcome, LaunchError> {
    let sink = if spec.prefix_output { Sink::Print } else { Sink::Inherit };
    run(spec, sink)
}

/// Like [`launch`], but captures each rank's output: element `r` of the returned vector is rank
/// `r`'s stdout and stderr lines, unprefixed, in the order they were read, each ending in `\n`
/// (bytes that are not UTF-8 become U+FFFD here; [`launch`] prints them unchanged).
pub fn launch_captured(spec: &LaunchSpec) -> Result<(LaunchOutcome, Vec<String>), LaunchError> {
    let bufs: Arc<Vec<Mutex<String>>> = Arc::new((0..spec.nproc).map(|_| Mutex::new(String::new())).collect());
    let outcome = run(spec, Sink::Capture(Arc::clone(&bufs)))?;
    let out = bufs.iter().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect();
    Ok((outcome, out))
}

/// The line a rank's output line is re-printed as (`line` without its newline).
pub fn prefix_line(rank: usize, line: &str) -> String {
    String::from_utf8_lossy(&prefixed(rank, line.as_bytes())).into_owned()
}

/// [`prefix_line`] of any bytes (a rank's output need not be UTF-8).
fn prefixed(rank: usize, line: &[u8]) -> Vec<u8> {
    let mut text = format!("[rank {rank}] ").into_bytes();
    text.extend_from_slice(line);
    text.push(b'\n');
    text
}

#[derive(Clone)]
enum Sink {
    Inherit,
    Print,
    Capture(Arc<Vec<Mutex<String>>>),
}

/// Held while a line is written to the launcher's stdout or stderr: one lock for both, so
/// that lines stay whole where both go to one pipe (`2>&1 | ...`), whose writes of more than
/// `PIPE_BUF` (4 KiB) bytes are not atomic.
static OUTPUT: Mutex<()> = Mutex::new(());

impl Sink {
    /// One line of a rank's output, without its newline: printed as its bytes (not
    /// necessarily UTF-8: a rank's output passes through unchanged), captured as text.
    fn emit(&self, rank: usize, is_stderr: bool, line: &[u8]) {
        match self {
            Sink::Inherit => {}
            Sink::Print => {
                let text = prefixed(rank, line);
                // One write per line under the lock keeps lines from interleaving. Errors
                // (e.g. a closed pipe) are ignored: the ranks keep running.
                let _one = OUTPUT.lock().unwrap_or_else(|e| e.into_inner());
                if is_stderr {
                    let _ = io::stderr().lock().write_all(&text);
                } else {
                    let mut out = io::stdout().lock();
                    let _ = out.write_all(&text);
                    let _ = out.flush();
                }
            }
            Sink::Capture(bufs) => {
                let mut b = bufs[rank].lock().unwrap_or_else(|e| e.into_inner());
                b.push_str(&String::from_utf8_lossy(line));
                b.push('\n');
            }
        }
    }
}

/// What the launcher knows of one output reader while it drains the ranks' last output.
#[derive(Default)]
struct Reader {
    /// Bytes read from the pipe so far.
    read: std::sync::atomic::AtomicU64,
    /// Inside `Sink::emit` (a write to the launcher's output, which may block on its consumer).
    emitting: std::sync::atomic::AtomicBool,
    /// Reached the end of the pipe (or an error).
    done: std::sync::atomic::AtomicBool,
}

/// The longest line forwarded whole: a longer one (or output that never ends a line) is
/// forwarded in pieces of this many bytes, each as a line of its own, so a rank cannot make the
/// launcher hold an unbounded line in memory.
pub const MAX_LINE_BYTES: usize = 64 << 10;

fn pump(rank: usize, is_stderr: bool, pipe: impl Read, sink: Sink, state: &Reader) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut r = BufReader::new(pipe);
    let mut line = Vec::new();
    // The last piece was cut at MAX_LINE_BYTES, its line not yet ended.
    let mut cut = false;
    loop {
        line.clear();
        // At most MAX_LINE_BYTES (the newline included), whatever the rank writes.
        match (&mut r).take(MAX_LINE_BYTES as u64).read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(n) => {
                state.read.fetch_add(n as u64, Relaxed);
                let ended = line.last() == Some(&b'\n');
                // The newline of a line of whole pieces: the last piece already ended the
                // line; not an empty line of its own.
                let rest_of_cut = cut && n == 1 && ended;
                cut = !ended;
                if rest_of_cut {
                    continue;
                }
                // The bytes pass through unchanged (a `\r` before the newline included).
                if ended {
                    line.pop();
                }
                state.emitting.store(true, Relaxed);
                sink.emit(rank, is_stderr, &line);
                state.emitting.store(false, Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    state.done.store(true, Relaxed);
}

/// Waits for the readers to forward what the ranks wrote (every rank has exited): while a
/// reader is writing a line out (its consumer may be slow) or read something within
/// [`READER_GRACE`], up to [`READER_TAIL_BYTES`] more bytes each. Returns when every reader is
/// done, or only idle readers (a grandchild holding a pipe open) or chatty ones (a grandchild
/// still writing) are left, or at `deadline` (a launch stopped by a signal: the user asked it
/// to end, so a consumer that stopped reading does not hold it).
fn drain(readers: &[Arc<Reader>], deadline: Option<Instant>) {
    use std::sync::atomic::Ordering::Relaxed;
    let start: Vec<u64> = readers.iter().map(|r| r.read.load(Relaxed)).collect();
    let mut seen = start.clone();
    // Per reader: when it last read something.
    let mut progress = vec![Instant::now(); readers.len()];
    loop {
        let mut waiting = false;
        for (i, r) in readers.iter().enumerate() {
            if r.done.load(Relaxed) {
                continue;
            }
            let read = r.read.load(Relaxed);
            if read != seen[i] {
                seen[i] = read;
                progress[i] = Instant::now();
            }
            let owed = read - start[i] <= READER_TAIL_BYTES;
            waiting |= owed && (r.emitting.load(Relaxed) || progress[i].elapsed() < READER_GRACE);
        }
        if !waiting || deadline.is_some_and(|d| Instant::now() >= d) {
            return;
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// The variable the ranks read their job token from (see `collective_core::bootstrap::env`).
pub const JOB_TOKEN_ENV: &str = "DETCOLL_JOB_TOKEN";

/// A fresh job token: 128 random bits from the OS (`getrandom(2)`, else `/dev/urandom`), as 32
/// hex digits. It is what keeps two launches on one port apart, so no weaker fallback.
pub fn random_job_token() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    fill_random(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let mut filled = 0usize;
        while filled < buf.len() {
            let rest = &mut buf[filled..];
            // SAFETY: `rest` is a live, exclusively borrowed buffer of `rest.len()` writable
            // bytes for the whole call; getrandom(2) writes at most that many.
            let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            filled += n.unsigned_abs();
        }
        if filled == buf.len() {
            return Ok(());
        }
    }
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

fn free_port(addr: &str) -> Result<u16, LaunchError> {
    // The host as the bootstrap reads MASTER_ADDR: an IPv6 address may come in brackets.
    let trimmed = addr.trim();
    let host = trimmed.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(trimmed);
    TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| LaunchError::Port { addr: addr.to_owned(), source })
}

struct Rank {
    child: Child,
    status: Option<ExitStatus>,
    /// When it exited (its watcher's wake-up, else when the poll saw it).
    exited_at: Option<Instant>,
    /// Its watcher could not wait for it: poll it with `try_wait`.
    poll: bool,
}

fn run(spec: &LaunchSpec, sink: Sink) -> Result<LaunchOutcome, LaunchError> {
    if spec.nproc == 0 {
        return Err(LaunchError::NoProcesses);
    }
    let per_node = match spec.virtual_nodes {
        None => spec.nproc,
        Some(nodes) if nodes > 0 && spec.nproc.is_multiple_of(nodes) => spec.nproc / nodes,
        Some(nodes) => return Err(LaunchError::VirtualNodes { nproc: spec.nproc, nodes }),
    };
    // Port 0 is "any free port", as for a socket.
    let port = match spec.master_port {
        Some(p) if p != 0 => p,
        _ => free_port(&spec.master_addr)?,
    };
    let token = if spec.env.iter().any(|(k, _)| k == JOB_TOKEN_ENV) {
        None // spec.env sets it (applied below)
    } else {
        Some(random_job_token().map_err(|source| LaunchError::JobToken { source })?)
    };
    let _signals = signals::Guard::install();
    let (exit_tx, exit_rx) = mpsc::channel::<(usize, Option<Instant>)>();
    let mut readers: Vec<Arc<Reader>> = Vec::new();
    // Not `with_capacity(nproc)`: a huge `nproc` fails at the rank that cannot start, with the
    // others stopped, not at an allocation.
    let mut ranks: Vec<Rank> = Vec::new();

    for rank in 0..spec.nproc {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", spec.nproc.to_string())
            .env("LOCAL_RANK", (rank % per_node).to_string())
            .env("LOCAL_WORLD_SIZE", per_node.to_string())
            .env("MASTER_ADDR", &spec.master_addr)
            .env("MASTER_PORT", port.to_string());
        // torchrun's node rank (0 on one host, whatever the environment had).
        cmd.env("GROUP_RANK", (rank / per_node).to_string());
        if spec.virtual_nodes.is_some() {
            cmd.env("DETCOLL_HOST_ID", format!("virtual-node-{}", rank / per_node));
        }
        if let Some(t) = &token {
            cmd.env(JOB_TOKEN_ENV, t);
        }
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null());
        if matches!(sink, Sink::Inherit) {
            cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
        } else {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        die_with_launcher(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(source) => {
                stop_all(&mut ranks);
                return Err(LaunchError::Spawn { rank, program: spec.program.clone(), source });
            }
        };
        let pipes = [
            child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
            child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
        ];
        let poll = !watch_exit(rank, &child, exit_tx.clone());
        ranks.push(Rank { child, status: None, exited_at: None, poll });
        for (is_stderr, pipe) in [false, true].into_iter().zip(pipes) {
            let Some(pipe) = pipe else { continue };
            let (sink, state) = (sink.clone(), Arc::new(Reader::default()));
            let mine = state.clone();
            let started = thread::Builder::new()
                .name(format!("rank-{rank}-{}", if is_stderr { "err" } else { "out" }))
                .spawn(move || pump(rank, is_stderr, pipe, sink, &mine));
            if let Err(source) = started {
                // No thread to forward its output: stop every rank (this one too).
                stop_all(&mut ranks);
                return Err(LaunchError::Reader { rank, source });
            }
            readers.push(state);
        }
    }
    drop(exit_tx);

    let mut wait_error: Option<LaunchError> = None;
    // When the launcher began tearing the group down.
    let mut stop_started: Option<Instant> = None;
    // Set once the group is being torn down: when SIGKILL is due.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        // Exits reported by the watchers (they only observe; the rank is reaped here, so its
        // pid stays valid for the signals below until then).
        let mut woke = match exit_rx.recv_timeout(POLL_INTERVAL) {
            Ok(m) => vec![m],
            Err(_) => Vec::new(),
        };
        woke.extend(exit_rx.try_iter());
        for (r, at) in woke {
            match at {
                Some(at) => ranks[r].exited_at = Some(at),
                None => ranks[r].poll = true,
            }
        }
        for (r, rank) in ranks.iter_mut().enumerate() {
            if rank.status.is_some() || (rank.exited_at.is_none() && !rank.poll) {
                continue;
            }
            match rank.child.try_wait() {
                Ok(Some(st)) => {
                    rank.status = Some(st);
                    rank.exited_at.get_or_insert_with(Instant::now);
                }
                Ok(None) => {
                    // A watcher woke without an exit (cannot normally happen): poll instead.
                    rank.exited_at = None;
                    rank.poll = true;
                }
                Err(source) => {
                    if wait_error.is_none() {
                        wait_error = Some(LaunchError::Wait { rank: r, source });
                    }
                    // Cannot observe it any more: kill it and reap it blocking.
                    let _ = rank.child.kill();
                    rank.status = rank.child.wait().ok();
                    if rank.status.is_none() {
                        rank.status = Some(failed_status());
                    }
                    rank.exited_at.get_or_insert_with(Instant::now);
                }
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        let now = Instant::now();
        match kill_at {
            None => {
                let failed = ranks.iter().any(|r| r.status.is_some_and(|st| !st.success()));
                if (failed && spec.stop_on_failure) || wait_error.is_some() || signals::received() != 0 {
                    for rank in ranks.iter_mut().filter(|r| r.status.is_none()) {
                        signal_group(&mut rank.child, Sig::Term);
                    }
                    stop_started = Some(now);
                    kill_at = Some(now + KILL_GRACE);
                }
            }
            Some(at) if !killed && now >= at => {
                for rank in ranks.iter_mut().filter(|r| r.status.is_none()) {
                    signal_group(&mut rank.child, Sig::Kill);
                }
                killed = true;
            }
            Some(_) => {}
        }
    }
    if kill_at.is_some() {
        // Whatever the ranks started (their process groups) goes too.
        for rank in &mut ranks {
            signal_group(&mut rank.child, Sig::Kill);
        }
    }

    // Let the readers forward what the ranks wrote; do not wait for grandchildren that keep a
    // pipe open, nor, after a signal, longer than SIGNAL_DRAIN for a consumer that stopped
    // reading.
    let deadline = (signals::received() != 0).then(|| Instant::now() + SIGNAL_DRAIN);
    drain(&readers, deadline);

    let exits: Vec<(ExitStatus, Instant)> = ranks
        .iter()
        .map(|r| (r.status.expect("every rank was reaped"), r.exited_at.expect("reaped ranks have an exit time")))
        .collect();
    let outcome = outcome_of(&exits, stop_started);
    if let Some(e) = wait_error {
        return Err(e);
    }
    let signal = signals::received();
    if signal != 0 {
        return Err(LaunchError::Interrupted { signal, outcome });
    }
    Ok(outcome)
}

/// The outcome of ranks that exited with `exits` (status, time), the launcher having begun to
/// stop them at `stop_started`: the culprit is the earliest failure before that moment; ranks
/// that exited at or after it were stopped by the launcher.
fn outcome_of(exits: &[(ExitStatus, Instant)], stop_started: Option<Instant>) -> LaunchOutcome {
    let before_stop = |at: Instant| stop_started.is_none_or(|s| at < s);
    let first_failure = exits
        .iter()
        .enumerate()
        .filter(|(_, (st, at))| !st.success() && before_stop(*at))
        .min_by_key(|(r, (_, at))| (*at, *r))
        .map(|(r, (st, _))| (r, *st));
    LaunchOutcome {
        statuses: exits.iter().map(|(st, _)| *st).collect(),
        first_failure,
        stopped_by_launcher: exits.iter().map(|(_, at)| !before_stop(*at)).collect(),
    }
}

/// Starts a thread that wakes when rank `rank` exits and reports when, without reaping it
/// (`waitid(WNOWAIT)`): the exit times order failures, and the main loop stays the only reaper.
/// Returns false when no watcher could be started (the rank is then polled).
#[cfg(unix)]
fn watch_exit(rank: usize, child: &Child, tx: mpsc::Sender<(usize, Option<Instant>)>) -> bool {
    let pid = libc::id_t::from(child.id());
    thread::Builder::new()
        .name(format!("rank-{rank}-exit"))
        .spawn(move || {
            loop {
                // SAFETY: siginfo_t is plain old data; all-zero is a valid value for waitid to
                // overwrite.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: `info` is a live, writable siginfo_t; WNOWAIT leaves the child
                // unreaped, so its pid cannot be recycled while the main loop may signal it.
                let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
                if r == 0 {
                    let _ = tx.send((rank, Some(Instant::now())));
                    return;
                }
                if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    let _ = tx.send((rank, None));
                    return;
                }
            }
        })
        .is_ok()
}

#[cfg(not(unix))]
fn watch_exit(_rank: usize, _child: &Child, _tx: mpsc::Sender<(usize, Option<Instant>)>) -> bool {
    false
}

/// Linux: the rank gets `SIGKILL` when the launcher (the spawning thread) dies, so killing the
/// launcher, even with `SIGKILL`, does not leave ranks running.
#[cfg(target_os = "linux")]
fn die_with_launcher(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let launcher = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls (prctl, getppid) on values it owns; it allocates nothing (the error is built
    // from a raw errno) and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The launcher may have died between fork and prctl: then the signal will never
            // come (we were reparented), so do not start.
            if u32::try_from(libc::getppid()).ok() != Some(launcher) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_launcher(_cmd: &mut Command) {}

/// Stops and reaps the ranks started so far (a later rank failed to start).
fn stop_all(ranks: &mut [Rank]) {
    for r in ranks.iter_mut() {
        signal_group(&mut r.child, Sig::Kill);
    }
    for r in ranks.iter_mut() {
        let _ = r.child.wait();
    }
}

#[derive(Clone, Copy)]
enum Sig {
    Term,
    Kill,
}

/// Sends `sig` to the child's process group (the child and whatever it started).
#[cfg(unix)]
fn signal_group(child: &mut Child, sig: Sig) {
    let signo = match sig {
        Sig::Term => libc::SIGTERM,
        Sig::Kill => libc::SIGKILL,
    };
    // The child was spawned with process_group(0), so its pid is its process group id; the
    // group cannot be recycled while the child is unreaped, and after reaping a stale group id
    // only yields ESRCH (a pid still in use as a group id is not reassigned).
    signal_process_group(child.id(), signo);
    if matches!(sig, Sig::Kill) {
        let _ = child.kill();
    }
}

/// Sends `signo` to the process group `pgid` (a process spawned with `process_group(0)` and
/// whatever it started). `pgid` 0 and 1 are ignored: kill(2) reads -0 as the caller's own group
/// and -1 as every process it may signal (group 1 is init's, never a child's). Public so that other tools that run children in their own groups (xtask's
/// `gpu-test`) kill them the same way. It makes one kill(2) call and nothing else, so a signal
/// handler may call it (async-signal-safe).
#[cfg(unix)]
pub fn signal_process_group(pgid: u32, signo: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else { return };
    if pgid > 1 {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid below -1
        // addresses exactly that process group.
        unsafe {
            libc::kill(-pgid, signo);
        }
    }
}

#[cfg(not(unix))]
fn signal_group(child: &mut Child, _sig: Sig) {
    let _ = child.kill();
}

#[cfg(unix)]
fn failed_status() -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw(1 << 8)
}

#[cfg(not(unix))]
fn failed_status() -> ExitStatus {
    use std::os::windows::process::ExitStatusExt;
    ExitStatus::from_raw(1)
}

/// Launcher signal handling: while at least one launch runs, SIGINT/SIGTERM/SIGHUP set a flag
/// that makes every running launch stop its ranks.
mod signals {
    use std::sync::atomic::{AtomicI32, Ordering};

    static RECEIVED: AtomicI32 = AtomicI32::new(0);

    /// The signal received during the current launches (0: none).
    pub(crate) fn received() -> i32 {
        RECEIVED.load(Ordering::SeqCst)
    }

    #[cfg(unix)]
    pub(crate) use unix::Guard;

    #[cfg(unix)]
    mod unix {
        use super::RECEIVED;
        use std::sync::Mutex;
        use std::sync::atomic::Ordering;

        const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

        struct Installed {
            launches: usize,
            previous: Vec<(libc::c_int, libc::sigaction)>,
        }

        static STATE: Mutex<Installed> = Mutex::new(Installed { launches: 0, previous: Vec::new() });

        extern "C" fn on_signal(sig: libc::c_int) {
            // Async-signal-safe: one atomic store.
            RECEIVED.store(sig, Ordering::SeqCst);
        }

        /// Installs the handlers for the first concurrent launch and restores the previous
        /// ones when the last one ends.
        pub(crate) struct Guard(());

        impl Guard {
            pub(crate) fn install() -> Guard {
                let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
                if st.launches == 0 {
                    RECEIVED.store(0, Ordering::SeqCst);
                    for sig in SIGNALS {
                        // SAFETY: sigaction is plain old data; all-zero is a valid value that
                        // is fully overwritten below or by sigaction(2).
                        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
                        // SAFETY: a null new action only queries the current one into `old`.
                        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
                            continue;
                        }
                        if old.sa_sigaction == libc::SIG_IGN {
                            continue; // e.g. nohup: keep ignoring
                        }
                        // SAFETY: as above.
                        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
                        new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                        new.sa_flags = libc::SA_RESTART;
                        // SAFETY: `new.sa_mask` is a valid sigset_t owned by us; `new` is a
                        // fully initialised sigaction whose handler is async-signal-safe, and
                        // `old` is writable.
                        let ok = unsafe {
                            libc::sigemptyset(&mut new.sa_mask);
                            libc::sigaction(sig, &new, &mut old)
                        } == 0;
                        if ok {
                            st.previous.push((sig, old));
                        }
                    }
                }
                st.launches += 1;
                Guard(())
            }
        }

        impl Drop for Guard {
            fn drop(&mut self) {
                let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
                st.launches -= 1;
                if st.launches == 0 {
                    for (sig, old) in std::mem::take(&mut st.previous) {
                        // SAFETY: `old` is the action sigaction(2) returned for `sig`.
                        unsafe {
                            libc::sigaction(sig, &old, std::ptr::null_mut());
                        }
                    }
                }
            }
        }
    }

    #[cfg(not(unix))]
    pub(crate) struct Guard(());

    #[cfg(not(unix))]
    impl Guard {
        pub(crate) fn install() -> Guard {
            Guard(())
        }
    }
}
