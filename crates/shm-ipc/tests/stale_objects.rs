//! The sweep of stale named fallback objects (`/dev/shm/detcoll-…`, left by a rank killed
//! between creating its object and every peer mapping it) removes only what it can prove dead.
//!
//! Jobs in different pid namespaces share one `/dev/shm`: a pid in another job's name means
//! another process here (or none), so a sweep that trusted the pid alone unlinked live jobs'
//! objects (issue 25). Names carry the owner's pid namespace and start time; the sweep runs at
//! every process-mode construction (ranks as threads of this process with `LocalBootstrap`).
use collective_core::bootstrap::LocalBootstrap;
use shm_ipc::{ShmCollective, ShmConfig};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command};

/// The inode of this process's pid namespace.
fn our_ns() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").unwrap().ino()
}

/// Field 22 of `/proc/<pid>/stat`: the start time in clock ticks after boot.
fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    after.split_ascii_whitespace().nth(19).unwrap().parse().unwrap()
}

/// A process that lives until killed.
fn sleeper() -> Child {
    Command::new("sleep").arg("600").spawn().expect("spawn sleep")
}

/// The pid and start time of a process that has exited and been reaped.
fn dead_process() -> (u32, u64) {
    let mut c = sleeper();
    let id = (c.id(), start_time(c.id()));
    c.kill().unwrap();
    c.wait().unwrap();
    id
}

/// `/dev/shm/<name>`, created as a one-page object (what `shm_open` makes).
struct Object(PathBuf);

impl Object {
    fn new(name: String) -> Object {
        let path = PathBuf::from("/dev/shm").join(name);
        std::fs::write(&path, [0u8; 4096]).unwrap();
        Object(path)
    }
    fn exists(&self) -> bool {
        self.0.exists()
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A name of the current format for an owner `(pid, start, ns)`, unique to this test run.
fn name(pid: u32, start: u64, ns: u64, what: &str) -> String {
    format!("detcoll-{pid}-s{start}-n{ns}-0-test{}{what}", std::process::id())
}

/// One process-mode construction (it sweeps first); two ranks as threads of this process.
fn construct() {
    let boots = LocalBootstrap::group(2);
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || ShmCollective::new(b, ShmConfig::new(4096)).expect("construction"));
        }
    });
}

#[test]
fn the_sweep_never_removes_what_it_cannot_prove_dead() {
    let ns = our_ns();
    let (dead, dead_start) = dead_process();
    let mut live = sleeper();
    let live_start = start_time(live.id());

    // Another pid namespace's job: its pid means nothing here (before the fix: unlinked because
    // no process here has that pid).
    let other_ns = Object::new(name(dead, dead_start, ns ^ 1, "other-ns"));
    // A name without an owner identity (an older version's): nothing proves its owner dead.
    let legacy = Object::new(format!("detcoll-{dead}-0-test{}legacy", std::process::id()));
    // A live process of our namespace.
    let alive = Object::new(name(live.id(), live_start, ns, "alive"));
    // Our namespace, owner gone: swept.
    let gone = Object::new(name(dead, dead_start, ns, "gone"));
    // Our namespace, the pid now belongs to another process (another start time): swept.
    let reused = Object::new(name(live.id(), live_start + 1, ns, "reused"));

    construct();
    assert!(other_ns.exists(), "the sweep removed another pid namespace's object");
    assert!(legacy.exists(), "the sweep removed an object whose owner it cannot identify");
    assert!(alive.exists(), "the sweep removed a live process's object");
    assert!(!gone.exists(), "the sweep left the object of a dead owner of this namespace");
    assert!(!reused.exists(), "the sweep left the object of an owner whose pid was reused");

    // The live owner dies: now its object goes.
    live.kill().unwrap();
    live.wait().unwrap();
    construct();
    assert!(!alive.exists(), "the object of an owner that died is not swept");
    assert!(other_ns.exists() && legacy.exists());
}
