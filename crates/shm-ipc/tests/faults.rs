//! Fault tests across real processes: a dead rank, mismatched calls, close ordering.
//!
//! Each test is its own parent and children: the parent launches the test binary once per rank
//! (survivors are not torn down when a rank dies: `stop_on_failure = false`), each child runs its
//! role and prints `VERDICT ok ...` or fails; the parent checks every rank's verdict.
use collective_core::bootstrap::TcpBootstrap;
use collective_core::{Collective, Error, Io};
use detcoll_launch::{LaunchSpec, launch_captured};
use detcoll_protocol::{TIMEOUT_ENV, Timeouts};
use shm_ipc::{ShmCollective, ShmConfig};
use std::sync::{RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

const ROLE: &str = "DETCOLL_FAULT_CHILD";
const BOUND: Duration = Duration::from_secs(3);

fn config() -> ShmConfig {
    let mut c = ShmConfig::new(1 << 16);
    c.timeouts = Some(Timeouts { peer: BOUND, close: BOUND });
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
    launch_with(world, test, &[])
}

/// Held (shared) by every launch, and exclusively by a test whose children must be the only
/// ones running: every construction sweeps stale `/dev/shm` objects of dead processes, so a
/// concurrent test's children could remove the object a test is about to look for.
static CHILDREN: RwLock<()> = RwLock::new(());

/// Runs no other test's children until the guard is dropped; launch with [`launch_alone`].
fn exclusive() -> RwLockWriteGuard<'static, ()> {
    CHILDREN.write().unwrap_or_else(|e| e.into_inner())
}

/// [`launch`] with extra environment variables for the children.
fn launch_with(world: usize, test: &str, env: &[(&str, &str)]) -> Vec<(bool, String)> {
    let _shared = CHILDREN.read().unwrap_or_else(|e| e.into_inner());
    launch_alone(world, test, env)
}

/// [`launch_with`] for a test that holds [`exclusive`].
fn launch_alone(world: usize, test: &str, env: &[(&str, &str)]) -> Vec<(bool, String)> {
    let exe = std::env::current_exe().unwrap();
    let mut spec =
        LaunchSpec::new(world, exe).args([test, "--exact", "--nocapture", "--test-threads=1"]).env(ROLE, "1");
    for (k, v) in env {
        spec = spec.env(*k, *v);
    }
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

/// Which variant of a fault test a child runs.
const MODE: &str = "DETCOLL_FAULT_MODE";
/// Bits no correct call writes: a failed call must leave outputs holding exactly this.
const SENTINEL: u32 = 0x7fc0_dead;
/// Construction failures must reach every rank well before the bootstrap's 30 s exchange bound.
const CONSTRUCTION_BOUND: Duration = Duration::from_secs(5);

fn assert_all_ok(results: &[(bool, String)]) {
    for (r, (ok, out)) in results.iter().enumerate() {
        assert!(*ok && out.contains("VERDICT ok"), "rank {r} failed:\n{out}");
    }
}

/// One all_reduce into a sentinel-filled output that must fail: returns the error and the time
/// it took, after checking that nothing was written.
fn failing_all_reduce(c: &ShmCollective, n: usize) -> (Error, Duration) {
    let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut out = vec![f32::from_bits(SENTINEL); n];
    let t = Instant::now();
    let err = c.all_reduce(Io::host(&input, &mut out), &()).expect_err("the call must fail");
    let elapsed = t.elapsed();
    assert!(out.iter().all(|x| x.to_bits() == SENTINEL), "a failed call wrote its output");
    (err, elapsed)
}

/// Capacity of the full-/dev/shm test: one rank's region (about 772 KiB) fits a 1 MiB tmpfs,
/// two do not.
const TMPFS_CAPACITY: usize = 384 << 10;
const IN_SMALL_TMPFS: &str = "DETCOLL_FAULT_IN_SMALL_TMPFS";

/// In a fresh child (between fork and exec, single-threaded): a new user and mount namespace
/// with a 1 MiB tmpfs over `/dev/shm`. Only async-signal-safe calls on buffers built before.
fn small_tmpfs_pre_exec(uid_map: Vec<u8>, gid_map: Vec<u8>) -> impl FnMut() -> std::io::Result<()> {
    move || {
        let fail = || Err(std::io::Error::last_os_error());
        let write = |path: &core::ffi::CStr, data: &[u8]| -> std::io::Result<()> {
            // SAFETY: valid path; a plain open/write/close of our own /proc files.
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, data.as_ptr().cast(), data.len());
                libc::close(fd);
                if n != data.len() as isize { Err(std::io::Error::last_os_error()) } else { Ok(()) }
            }
        };
        // SAFETY: unshare in a single-threaded child affects only it and what it execs.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
            return fail();
        }
        write(c"/proc/self/setgroups", b"deny")?;
        write(c"/proc/self/uid_map", &uid_map)?;
        write(c"/proc/self/gid_map", &gid_map)?;
        // SAFETY: mount calls on static C strings, in our own new mount namespace.
        unsafe {
            if libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                core::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                core::ptr::null(),
            ) != 0
            {
                return fail();
            }
            if libc::mount(c"tmpfs".as_ptr(), c"/dev/shm".as_ptr(), c"tmpfs".as_ptr(), 0, c"size=1m".as_ptr().cast())
                != 0
            {
                return fail();
            }
        }
        Ok(())
    }
}

#[test]
fn full_dev_shm_fails_construction_on_every_rank() {
    const TEST: &str = "full_dev_shm_fails_construction_on_every_rank";
    if let Some((rank, boot)) = child() {
        if std::env::var(MODE).as_deref() == Ok("inject") && rank == 1 {
            shm_ipc::testing::inject(&[shm_ipc::testing::Fault::FailAllocation]);
        }
        let t = Instant::now();
        let err = ShmCollective::new(&boot, {
            let mut c = config();
            c.capacity = TMPFS_CAPACITY;
            c
        })
        .expect_err("a region that does not fit /dev/shm must fail construction");
        let elapsed = t.elapsed();
        match &err {
            Error::OutOfMemory { what, bytes, .. } => {
                assert!(what.contains("/dev/shm") && what.contains("--shm-size"), "{what}");
                assert!(*bytes > TMPFS_CAPACITY * 2, "bytes needed: {bytes}");
            }
            other => panic!("expected OutOfMemory, got {other}"),
        }
        assert!(elapsed < CONSTRUCTION_BOUND, "took {elapsed:?}");
        println!("VERDICT ok rank {rank}: {err} after {elapsed:?}");
        return;
    }
    if std::env::var_os(IN_SMALL_TMPFS).is_some() {
        // The launcher inside the namespace: its ranks inherit the 1 MiB /dev/shm.
        assert_all_ok(&launch_with(2, TEST, &[(MODE, "tmpfs")]));
        println!("VERDICT ok: both ranks failed in a 1 MiB /dev/shm");
        return;
    }
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([TEST, "--exact", "--nocapture", "--test-threads=1"]).env(IN_SMALL_TMPFS, "1");
    let pre = small_tmpfs_pre_exec(format!("0 {uid} 1").into_bytes(), format!("0 {gid} 1").into_bytes());
    // SAFETY: the hook only makes async-signal-safe calls on buffers allocated before the fork.
    unsafe { std::os::unix::process::CommandExt::pre_exec(&mut cmd, pre) };
    match cmd.output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("VERDICT ok"), "in a 1 MiB tmpfs:\n{text}");
            println!("full /dev/shm: ran with a real 1 MiB tmpfs over /dev/shm (user + mount namespace)");
        }
        Err(e) => {
            println!("full /dev/shm: no namespace ({e}); ran with an injected allocation failure on rank 1");
            assert_all_ok(&launch_with(2, TEST, &[(MODE, "inject")]));
        }
    }
}

#[test]
fn truncated_peer_object_fails_construction_on_every_rank() {
    if let Some((rank, boot)) = child() {
        if rank == 1 {
            shm_ipc::testing::inject(&[shm_ipc::testing::Fault::TruncateAfterCreate]);
        }
        let t = Instant::now();
        let err = ShmCollective::new(&boot, config()).expect_err("a truncated peer object must fail construction");
        let elapsed = t.elapsed();
        match &err {
            Error::ConfigMismatch { detail } => {
                assert!(
                    detail.contains("rank 1's shared-memory object") && detail.contains("is 4096 bytes"),
                    "{detail}"
                )
            }
            other => panic!("expected ConfigMismatch, got {other}"),
        }
        assert!(elapsed < CONSTRUCTION_BOUND, "took {elapsed:?}");
        println!("VERDICT ok rank {rank}: {err} after {elapsed:?}");
        return;
    }
    assert_all_ok(&launch(4, "truncated_peer_object_fails_construction_on_every_rank"));
}

/// `/dev/shm` entries left by process `pid`.
fn leftovers(pid: &str) -> Vec<String> {
    let prefix = format!("detcoll-{pid}-");
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

#[test]
fn a_rank_killed_during_construction_leaks_nothing() {
    const TEST: &str = "a_rank_killed_during_construction_leaks_nothing";
    if let Some((rank, boot)) = child() {
        let mode = std::env::var(MODE).unwrap_or_default();
        if rank == 1 && mode != "sweep" {
            println!("PID {}", std::process::id());
            let mut faults = vec![shm_ipc::testing::Fault::KillAfterCreate];
            if mode == "named" {
                // The fallback for hosts where /proc/<pid>/fd cannot be opened: a named object.
                faults.push(shm_ipc::testing::Fault::NoProcFd);
            }
            shm_ipc::testing::inject(&faults);
        } else if mode == "named" {
            // Rank 0 may start after rank 1 died: its sweep would remove what the test looks for.
            shm_ipc::testing::inject(&[shm_ipc::testing::Fault::NoSweep]);
        }
        let t = Instant::now();
        let r = ShmCollective::new(&boot, config());
        if mode == "sweep" {
            r.expect("a construction after the kill");
        } else {
            let err = r.expect_err("construction with a killed peer must fail");
            assert!(t.elapsed() < CONSTRUCTION_BOUND, "took {:?}", t.elapsed());
            println!("VERDICT ok rank {rank}: {err}");
            return;
        }
        println!("VERDICT ok rank {rank}: built");
        return;
    }
    let pid_of = |out: &str| out.lines().find_map(|l| l.split("PID ").nth(1)).map(str::trim).map(String::from);
    let _alone = exclusive();
    let results = launch_alone(2, TEST, &[]);
    assert!(!results[1].0, "rank 1 should have been killed:\n{}", results[1].1);
    assert!(results[0].0 && results[0].1.contains("VERDICT ok"), "rank 0:\n{}", results[0].1);
    let pid = pid_of(&results[1].1).unwrap_or_else(|| panic!("rank 1 printed no pid:\n{}", results[1].1));
    assert_eq!(leftovers(&pid), Vec::<String>::new(), "a killed rank left objects in /dev/shm");
    // The named fallback leaves its object behind on a kill; the next construction sweeps it.
    let results = launch_alone(2, TEST, &[(MODE, "named")]);
    assert!(!results[1].0 && results[0].0, "rank 0:\n{}", results[0].1);
    let pid = pid_of(&results[1].1).expect("rank 1 printed its pid");
    assert_eq!(leftovers(&pid).len(), 1, "the injected kill left no named object: the test tests nothing");
    assert_all_ok(&launch_alone(2, TEST, &[(MODE, "sweep")]));
    assert_eq!(leftovers(&pid), Vec::<String>::new(), "the next construction did not sweep the stale object");
}

/// A free TCP port on the loopback interface for a rendezvous the test starts itself.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_zombie_peer_is_dead_at_once() {
    const TEST: &str = "a_zombie_peer_is_dead_at_once";
    // A longer bound than the others: noticing the zombie only at the timeout must fail.
    let bound = Duration::from_secs(6);
    if let Some((rank, boot)) = child() {
        let c = ShmCollective::new(&boot, config().with_timeouts(Timeouts { peer: bound, close: bound })).unwrap();
        all_reduce(&c, 64).unwrap();
        if rank == 1 {
            // Exit without closing (no destructors run): the parent does not reap us yet.
            std::process::exit(0);
        }
        std::thread::sleep(Duration::from_millis(300));
        let (err, elapsed) = failing_all_reduce(&c, 64);
        assert!(matches!(err, Error::PeerDied { peer: 1, .. }), "{err}");
        assert!(elapsed < Duration::from_secs(1), "the zombie was noticed only after {elapsed:?}");
        println!("VERDICT ok rank {rank}: {err} after {elapsed:?}");
        return;
    }
    // The launcher reaps its children: start the ranks here and wait on rank 1 only at the end.
    let _shared = CHILDREN.read().unwrap_or_else(|e| e.into_inner());
    let port = free_port().to_string();
    let spawn = |rank: usize| {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, "1")
            .envs([("RANK", rank.to_string()), ("LOCAL_RANK", rank.to_string())])
            .envs([("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")])
            .env("MASTER_PORT", &port)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (r0, mut r1) = (spawn(0), spawn(1));
    let out = r0.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let status1 = r1.wait().unwrap();
    assert!(out.status.success() && text.contains("VERDICT ok"), "rank 0:\n{text}");
    assert!(status1.success(), "rank 1: {status1}");
}

#[test]
fn a_stopped_peer_times_out_within_the_bound() {
    if let Some((rank, boot)) = child() {
        let c = ShmCollective::new(&boot, config()).unwrap();
        let pids =
            collective_core::bootstrap::Bootstrap::all_gather_bytes(&boot, &std::process::id().to_le_bytes()).unwrap();
        all_reduce(&c, 64).unwrap();
        if rank == 1 {
            // SAFETY: stopping ourselves; rank 0 continues us after its check.
            unsafe { libc::raise(libc::SIGSTOP) };
            println!("VERDICT ok rank 1: continued");
            std::process::exit(0);
        }
        let (err, elapsed) = failing_all_reduce(&c, 64);
        let peer1 = u32::from_le_bytes(pids[1][..4].try_into().unwrap());
        // SAFETY: continuing the stopped rank 1, a process of this test.
        unsafe { libc::kill(peer1 as libc::pid_t, libc::SIGCONT) };
        assert!(matches!(err, Error::PeerTimeout { peer: 1, .. }), "{err}");
        assert!(elapsed >= BOUND && elapsed < BOUND + Duration::from_secs(1), "took {elapsed:?}");
        println!("VERDICT ok rank {rank}: {err} after {elapsed:?}");
        return;
    }
    assert_all_ok(&launch(2, "a_stopped_peer_times_out_within_the_bound"));
}

#[test]
fn bad_timeout_environment_is_invalid_config_naming_the_variable() {
    const TEST: &str = "bad_timeout_environment_is_invalid_config_naming_the_variable";
    let expect = |what: &str, r: Result<(), Error>| match r {
        Err(Error::InvalidConfig { detail }) => assert!(detail.contains(TIMEOUT_ENV), "{what}: {detail}"),
        other => panic!("{what}: expected InvalidConfig, got {other:?}"),
    };
    if let Some((rank, boot)) = child() {
        let t = Instant::now();
        expect("group", ShmCollective::group(2, ShmConfig::new(4096)).map(drop));
        expect("new", ShmCollective::new(&boot, ShmConfig::new(4096)).map(drop));
        assert!(t.elapsed() < CONSTRUCTION_BOUND, "took {:?}", t.elapsed());
        println!("VERDICT ok rank {rank}");
        return;
    }
    for value in ["abc", "0", "-1"] {
        assert_all_ok(&launch_with(2, TEST, &[(TIMEOUT_ENV, value)]));
    }
}

#[test]
fn huge_capacities_are_invalid_config_on_every_rank() {
    if let Some((rank, boot)) = child() {
        for capacity in [1usize << 63, usize::MAX] {
            let t = Instant::now();
            match ShmCollective::new(&boot, {
                let mut c = config();
                c.capacity = capacity;
                c
            }) {
                Err(Error::InvalidConfig { .. }) => {}
                other => panic!("capacity {capacity}: expected InvalidConfig, got {other:?}"),
            }
            assert!(t.elapsed() < CONSTRUCTION_BOUND, "took {:?}", t.elapsed());
        }
        println!("VERDICT ok rank {rank}");
        return;
    }
    assert_all_ok(&launch(2, "huge_capacities_are_invalid_config_on_every_rank"));
}

/// A peer that failed (it timed out waiting for this rank) and then exited is gone: this rank's
/// next wait for it says `PeerDied`, not `PeerFailed` (which says the peer is alive; found by
/// an outside probe: the peer had exited seconds before).
#[test]
fn a_peer_that_failed_then_exited_is_dead() {
    const TEST: &str = "a_peer_that_failed_then_exited_is_dead";
    if let Some((rank, boot)) = child() {
        let c = ShmCollective::new(&boot, config()).unwrap();
        all_reduce(&c, 64).unwrap();
        if rank == 1 {
            // Rank 0 comes after the bound: time out, then leave without closing.
            let err = all_reduce(&c, 64).expect_err("rank 0 is late");
            assert!(matches!(err, Error::PeerTimeout { peer: 0, .. }), "{err}");
            println!("VERDICT ok rank {rank}: {err}, exiting");
            std::process::exit(0);
        }
        std::thread::sleep(BOUND + Duration::from_secs(1));
        // The late call may complete (rank 1's input was published); the next cannot.
        let err = match all_reduce(&c, 64) {
            Ok(_) => all_reduce(&c, 64).expect_err("rank 1 is gone"),
            Err(e) => e,
        };
        assert!(matches!(err, Error::PeerDied { peer: 1, .. }), "{err}");
        println!("VERDICT ok rank {rank}: {err}");
        return;
    }
    for (r, (ok, out)) in launch(2, TEST).into_iter().enumerate() {
        assert!(ok && out.contains("VERDICT ok"), "rank {r}:\n{out}");
    }
}
