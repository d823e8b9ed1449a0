//! A shared object truncated after construction (issue 25): the honest rank's next access to
//! it must end in a typed error within a bounded time — never a `SIGBUS` that kills it (exit
//! status 135, which is what every scenario here did before the guard).
//!
//! Each test is its own parent and children, as in `faults.rs`: the parent launches the test
//! binary once per rank, rank 1 plays the dishonest peer. It gets a descriptor of the object
//! it will truncate the way any process of the job could: during construction, while the
//! owner still keeps its object reachable for the peers, it opens it from the handle the owner
//! announced (a wrapping bootstrap sees the construction messages).
use collective_core::bootstrap::{Bootstrap, BootstrapError, TcpBootstrap};
use collective_core::{Collective, Error, Io};
use detcoll_launch::{LaunchSpec, launch_captured};
use detcoll_protocol::{Layout, Timeouts};
use shm_ipc::{ShmCollective, ShmConfig};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const ROLE: &str = "DETCOLL_TRUNCATION_CHILD";
const MODE: &str = "DETCOLL_TRUNCATION_MODE";
/// The wait bound: every failure below must come well before it (the guard, not the timeout).
const BOUND: Duration = Duration::from_secs(5);
const CAP: usize = 1 << 16;
const N: usize = 4096;
/// Bits no correct call writes.
const SENTINEL: u32 = 0x7fc0_dead;

fn config() -> ShmConfig {
    ShmConfig::new(CAP).with_ll_capacity(0).with_timeouts(Timeouts { peer: BOUND, close: BOUND })
}

/// A bootstrap that, as the ranks report having mapped every region (the second exchange of
/// construction, while every owner still keeps its object reachable), opens rank `target`'s
/// object from the handle in its construction message — what a dishonest peer can do.
#[derive(Debug)]
struct Spy {
    inner: TcpBootstrap,
    target: Option<usize>,
    hellos: Mutex<Vec<Vec<u8>>>,
    fd: Mutex<Option<OwnedFd>>,
    calls: AtomicUsize,
}

impl Spy {
    /// Opens the object named by a rank's message of the engine's handle exchange (a status
    /// byte, the owner's pid and the object's length, then `proc <pid> <fd> <dev> <ino>` or
    /// `name <name>`: `HostDevice::export_staging`).
    fn open(message: &[u8]) -> OwnedFd {
        let text = String::from_utf8_lossy(message.get(13..).unwrap_or_default());
        let handle = text.as_ref();
        let words: Vec<&str> = handle.split(' ').collect();
        let (path, named) = match words.as_slice() {
            ["proc", pid, fd, _, _] => (format!("/proc/{pid}/fd/{fd}"), false),
            ["name", name] => (name.to_string(), true),
            _ => panic!("the construction message's handle changed: {handle:?}"),
        };
        let c = std::ffi::CString::new(path.clone()).unwrap();
        // SAFETY: a valid NUL-terminated path; a fresh descriptor that nothing else owns.
        let raw = unsafe {
            if named { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) } else { libc::open(c.as_ptr(), libc::O_RDWR) }
        };
        assert!(raw >= 0, "open {path}: {}", std::io::Error::last_os_error());
        // SAFETY: as above.
        unsafe { OwnedFd::from_raw_fd(raw) }
    }
}

impl Bootstrap for Spy {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn local_world_size(&self) -> usize {
        self.inner.local_world_size()
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        // The engine's construction exchanges: 0 the configuration, 1 the staging handles,
        // 2 "every peer mapped". The target object is opened between 1 and 2.
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if let (2, Some(t)) = (n, self.target) {
            let fd = Self::open(&self.hellos.lock().unwrap()[t]);
            *self.fd.lock().unwrap() = Some(fd);
        }
        let all = self.inner.all_gather_bytes(mine)?;
        if n == 1 {
            *self.hellos.lock().unwrap() = all.clone();
        }
        Ok(all)
    }
}

fn input(rank: usize, call: usize) -> Vec<f32> {
    (0..N).map(|i| ((i * 7 + rank * 131 + call * 17) % 1000) as f32 * 0.013 - 3.1).collect()
}

fn all_reduce(c: &ShmCollective, rank: usize, call: usize) -> (Result<(), Error>, Vec<f32>, Duration) {
    let x = input(rank, call);
    let mut out = vec![f32::from_bits(SENTINEL); N];
    let t = Instant::now();
    let r = c.all_reduce(Io::host(&x, &mut out), &());
    (r, out, t.elapsed())
}

fn truncate(fd: &OwnedFd, len: usize) {
    // SAFETY: our descriptor; shrinking the object under its mappings is the fault under test.
    let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
    assert_eq!(rc, 0, "ftruncate: {}", std::io::Error::last_os_error());
}

/// The child's part of scenario `mode` (see [`scenario`]).
fn child(mode: &str) {
    let boot = TcpBootstrap::from_env().expect("bootstrap");
    let rank = boot.rank();
    if mode == "named" {
        // The fallback for hosts without /proc/<pid>/fd: a named object, the same guard.
        shm_ipc::testing::inject(&[shm_ipc::testing::Fault::NoProcFd]);
    }
    let target = match (rank, mode) {
        (1, "victim") => Some(0),
        (1, _) => Some(1),
        _ => None,
    };
    let spy = Spy { inner: boot, target, hellos: Mutex::default(), fd: Mutex::default(), calls: AtomicUsize::new(0) };
    let c = ShmCollective::new(&spy, config()).expect("construction");
    for call in 0..3 {
        let (a, b) = (input(0, call), input(1, call));
        let mut want = vec![0f32; N];
        fixed_tree::reduce(&[&a[..], &b[..]], &mut want).unwrap();
        let (r, out, _) = all_reduce(&c, rank, call);
        r.unwrap_or_else(|e| panic!("call {call} before the truncation: {e}"));
        assert!(out.iter().zip(&want).all(|(o, w)| o.to_bits() == w.to_bits()), "call {call}");
    }
    // Both ranks are done with the good calls before anything shrinks.
    spy.barrier().unwrap();
    if rank == 1 {
        let fd = spy.fd.lock().unwrap().take().expect("rank 1 opened the object it truncates");
        match mode {
            "waiting" => {
                // Rank 0 is already waiting in its call for ours when the object shrinks.
                spy.barrier().unwrap();
                std::thread::sleep(Duration::from_millis(300));
                truncate(&fd, 0);
            }
            "frames" => {
                // Keep the control block: flags still work, the staging frames are gone, and
                // this rank makes the call too (its own writes into its frames fault here).
                truncate(&fd, Layout::with_ll(CAP, 1, 2, 0).unwrap().frame(0));
                spy.barrier().unwrap();
                let (r, _, elapsed) = all_reduce(&c, rank, 3);
                let e = r.expect_err("a call over a truncated own object must fail");
                assert!(matches!(&e, Error::Backend { detail, .. } if detail.contains("truncated")), "{e}");
                println!("rank 1 (truncated its own frames): {e} after {elapsed:?}");
            }
            _ => {
                truncate(&fd, 0);
                spy.barrier().unwrap();
            }
        }
        // Stay alive until rank 0 checked (a dead peer would be noticed by its pid instead).
        spy.barrier().unwrap();
        println!("VERDICT ok rank 1 ({mode})");
        return;
    }
    spy.barrier().unwrap();
    let (r, _, elapsed) = all_reduce(&c, rank, 3);
    let err = r.expect_err("a call meeting a truncated object must fail");
    match (mode, &err) {
        ("victim", Error::Backend { detail, .. }) if detail.contains("own shared-memory object was truncated") => {}
        (m, Error::PeerDied { peer: 1, detail }) if m != "victim" && detail.contains("truncated") => {}
        _ => panic!("{mode}: unexpected error {err:?}"),
    }
    let started = if mode == "waiting" { Duration::from_millis(300) } else { Duration::ZERO };
    assert!(elapsed < started + Duration::from_secs(1), "{mode}: noticed only after {elapsed:?}");
    let (again, _, _) = all_reduce(&c, rank, 4);
    assert!(matches!(again, Err(Error::Poisoned { .. })), "{again:?}");
    spy.barrier().unwrap();
    println!("VERDICT ok rank 0 ({mode}): {err} after {elapsed:?}");
}

/// Runs scenario `mode` with two ranks (rank 1 truncates after three good calls):
/// * `idle`: rank 1 truncates its own object to 0 bytes between calls;
/// * `waiting`: the same while rank 0 already waits inside its call;
/// * `frames`: rank 1 truncates its own object to its control block and calls too;
/// * `victim`: rank 1 truncates rank 0's object, rank 0's own writes fault;
/// * `named`: as `idle`, with the named fallback objects.
fn scenario(test: &str, mode: &str) {
    if std::env::var_os(ROLE).is_some() {
        return child(&std::env::var(MODE).unwrap());
    }
    let exe = std::env::current_exe().unwrap();
    let mut spec = LaunchSpec::new(2, exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .env(MODE, mode);
    spec.stop_on_failure = false;
    let t = Instant::now();
    let (outcome, outputs) = launch_captured(&spec).expect("launch");
    for (r, (status, out)) in outcome.statuses.iter().zip(&outputs).enumerate() {
        assert_ne!(status.signal(), Some(libc::SIGBUS), "{mode}: rank {r} was killed by SIGBUS:\n{out}");
        assert!(status.success() && out.contains("VERDICT ok"), "{mode}: rank {r} ({status}):\n{out}");
        for l in out.lines().filter_map(|l| l.find("VERDICT").or(l.find("rank 1 (")).map(|i| &l[i..])) {
            println!("{l}");
        }
    }
    assert!(t.elapsed() < Duration::from_secs(30), "{mode}: took {:?}", t.elapsed());
}

#[test]
fn a_peer_truncating_its_object_between_calls_is_a_typed_error() {
    scenario("a_peer_truncating_its_object_between_calls_is_a_typed_error", "idle");
}

#[test]
fn a_peer_truncating_its_object_during_a_call_is_a_typed_error() {
    scenario("a_peer_truncating_its_object_during_a_call_is_a_typed_error", "waiting");
}

#[test]
fn a_peer_truncating_its_frames_under_a_call_is_a_typed_error_on_both_ranks() {
    scenario("a_peer_truncating_its_frames_under_a_call_is_a_typed_error_on_both_ranks", "frames");
}

#[test]
fn a_peer_truncating_this_ranks_object_is_a_typed_error() {
    scenario("a_peer_truncating_this_ranks_object_is_a_typed_error", "victim");
}

#[test]
fn a_truncated_named_fallback_object_is_a_typed_error() {
    scenario("a_truncated_named_fallback_object_is_a_typed_error", "named");
}
