//! One rank's protocol region: heap memory (threads) or a shared-memory file (processes).
//!
//! # How a region is shared between processes, and why
//!
//! The owner creates an *unnamed* tmpfs file in `/dev/shm` (`open(O_TMPFILE)`), reserves its
//! bytes (`posix_fallocate`) and keeps the descriptor open until every peer mapped it; peers
//! open it as `/proc/<owner pid>/fd/<fd>` (same uid, same host) and check its inode and size
//! before mapping. No name ever exists, so a rank SIGKILLed at any point of construction leaks
//! nothing: the kernel frees the file with the last descriptor or mapping. An unlink-early plus
//! sweep scheme would still leak between the kill and the next construction on that host, and a
//! sweep must guess from a pid whether an object is stale. `O_TMPFILE` in `/dev/shm` (rather
//! than `memfd_create`) keeps the memory accounted where administrators size it (`--shm-size`),
//! so a too small `/dev/shm` fails construction with a typed error instead of going unnoticed.
//!
//! Fallback: where `O_TMPFILE` is unsupported or `/proc/<pid>/fd` cannot be opened (no `/proc`,
//! a hardened kernel), the object is a named `shm_open` object, unlinked as soon as every rank
//! mapped it; every construction first sweeps `detcoll-<pid>-s<start>-n<pidns>-…` names whose owner
//! is provably gone (same pid namespace, and its pid is gone or now another process), so a rank
//! killed in that window leaks only until the next construction on the host.
use crate::guard::Guard;
use crate::testing::{self, Fault};
use collective_core::Error;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A zeroed, page-aligned, mapped region of `len` bytes.
#[derive(Debug)]
pub(crate) struct Region {
    base: *mut u8,
    len: usize,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Heap,
    /// A mapping of a shared object, registered with the SIGBUS guard while it exists.
    Mapped(Option<Guard>),
}

// SAFETY: the region is plain memory; all concurrent access goes through atomics or is
// ordered by the protocol's release/acquire flags.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

const PAGE: usize = 4096;
const SHM_DIR: &str = "/dev/shm";
const NAME_PREFIX: &str = "detcoll-";

fn os_err(what: &str, name: &str) -> Error {
    Error::Backend { backend: "shm-ipc", detail: format!("{what} {name}: {}", std::io::Error::last_os_error()) }
}

/// How peers find an owner's shared object (travels in the construction hello).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Handle {
    /// An unnamed file, reachable as `/proc/<pid>/fd/<fd>` while the owner keeps `fd` open;
    /// `dev`/`ino` identify it (a peer in another pid namespace must not map another file).
    Proc { pid: u32, fd: i32, dev: u64, ino: u64 },
    /// A named `shm_open` object (the fallback).
    Name(String),
}

impl Handle {
    pub(crate) fn encode(&self) -> String {
        match self {
            Handle::Proc { pid, fd, dev, ino } => format!("proc {pid} {fd} {dev} {ino}"),
            Handle::Name(n) => format!("name {n}"),
        }
    }
    pub(crate) fn decode(s: &str) -> Option<Handle> {
        let mut it = s.split(' ');
        match it.next()? {
            "proc" => Some(Handle::Proc {
                pid: it.next()?.parse().ok()?,
                fd: it.next()?.parse().ok()?,
                dev: it.next()?.parse().ok()?,
                ino: it.next()?.parse().ok()?,
            }),
            "name" => Some(Handle::Name(it.next()?.to_string())),
            _ => None,
        }
    }
}

/// What keeps an owner's object reachable by peers until they mapped it: the open descriptor
/// (unnamed file) or the name. Dropping it closes the descriptor and unlinks the name; existing
/// mappings stay valid.
#[derive(Debug)]
pub(crate) struct Share {
    _fd: Option<OwnedFd>,
    name: Option<String>,
    pub handle: Handle,
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some(n) = &self.name {
            Region::unlink(n);
        }
    }
}

fn fstat(fd: libc::c_int) -> Result<libc::stat, std::io::Error> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fd is a valid descriptor; `st` is writable.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Reserves `len` bytes of `fd` (tmpfs reserves nothing at `ftruncate`: the first touch of an
/// unbacked page would be a SIGBUS). A full `/dev/shm` is [`Error::OutOfMemory`] naming the
/// remedy.
fn reserve(fd: &OwnedFd, object: &str, len: usize) -> Result<(), Error> {
    let off = libc::off_t::try_from(len)
        .map_err(|_| Error::InvalidConfig { detail: format!("a region of {len} bytes exceeds the file size limit") })?;
    let injected = testing::has(Fault::FailAllocation);
    let rc = loop {
        if injected {
            break libc::ENOSPC;
        }
        // SAFETY: fd is a valid descriptor we own; the range is non-negative.
        let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, off) };
        if rc != libc::EINTR {
            break rc;
        }
    };
    match rc {
        0 => Ok(()),
        libc::ENOSPC | libc::ENOMEM | libc::EFBIG => Err(Error::OutOfMemory {
            what: format!(
                "the shared-memory object {object} in {SHM_DIR}{} (staging and control of one rank; {SHM_DIR} is \
                 full or too small: enlarge it, e.g. `docker run --shm-size=...`, or build the collective with a \
                 smaller capacity)",
                if injected { ", injected failure" } else { "" }
            ),
            bytes: len,
            source: std::io::Error::from_raw_os_error(rc),
        }),
        e => Err(Error::Backend {
            backend: "shm-ipc",
            detail: format!("posix_fallocate {object}: {}", std::io::Error::from_raw_os_error(e)),
        }),
    }
}

/// Applies the test-only faults that act right after an object was created.
fn after_create(fd: &OwnedFd) {
    if testing::has(Fault::KillAfterCreate) {
        // SAFETY: raising a signal on ourselves; SIGKILL does not return.
        unsafe { libc::raise(libc::SIGKILL) };
    }
    if testing::has(Fault::TruncateAfterCreate) {
        // SAFETY: fd is ours; shrinking the object is the fault being injected.
        unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE as libc::off_t) };
    }
}

impl Region {
    /// Heap memory for ranks that are threads of this process.
    pub(crate) fn heap(len: usize) -> Result<Region, Error> {
        let layout = std::alloc::Layout::from_size_align(len.max(PAGE), PAGE)
            .map_err(|e| Error::InvalidConfig { detail: format!("region of {len} bytes: {e}") })?;
        // SAFETY: the layout has non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(Error::OutOfMemory {
                what: "the heap region of one rank (staging and control)".into(),
                bytes: len,
                source: std::io::ErrorKind::OutOfMemory.into(),
            });
        }
        Ok(Region { base, len, kind: Kind::Heap })
    }

    /// Creates, reserves and maps this rank's shared object of `len` bytes (see the module
    /// doc); `stem` (e.g. `detcoll-<pid>-<rank>-<nonce>`) names the fallback object.
    pub(crate) fn create_shared(stem: &str, len: usize) -> Result<(Region, Share), Error> {
        sweep_stale();
        if !testing::has(Fault::NoProcFd)
            && let Some(fd) = open_tmpfile()
        {
            let pid = std::process::id();
            let raw = fd.as_raw_fd();
            if proc_open(pid, raw).is_ok() {
                let object = format!("(unnamed, {stem})");
                reserve(&fd, &object, len)?;
                let st = fstat(raw)
                    .map_err(|e| Error::Backend { backend: "shm-ipc", detail: format!("fstat {object}: {e}") })?;
                after_create(&fd);
                let region = Self::map(&fd, &object, len)?;
                let handle = Handle::Proc { pid, fd: raw, dev: st.st_dev, ino: st.st_ino };
                return Ok((region, Share { _fd: Some(fd), name: None, handle }));
            }
        }
        let name = fallback_name(stem);
        let c =
            CString::new(name.as_str()).map_err(|_| Error::InvalidConfig { detail: format!("bad shm name {name}") })?;
        // SAFETY: valid NUL-terminated name; flags create a new object only.
        let raw = unsafe { libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        if raw < 0 {
            return Err(os_err("shm_open (create)", &name));
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // From here on the name is removed on every exit path (Share's drop).
        let share = Share { _fd: None, name: Some(name.clone()), handle: Handle::Name(name.clone()) };
        reserve(&fd, &format!("{SHM_DIR}{name}"), len)?;
        after_create(&fd);
        let region = Self::map(&fd, &name, len)?;
        Ok((region, share))
    }

    /// Maps rank `q`'s object after checking it is the one announced and holds `len` bytes: a
    /// mapping past the end of a file would turn the first touch of those pages into a SIGBUS.
    pub(crate) fn open_shared(q: usize, handle: &Handle, len: usize) -> Result<Region, Error> {
        let (fd, what) = match handle {
            Handle::Proc { pid, fd, .. } => {
                let what = format!("/proc/{pid}/fd/{fd}");
                (proc_open(*pid, *fd).map_err(|e| backend_io("open", &what, e))?, what)
            }
            Handle::Name(name) => {
                let c = CString::new(name.as_str())
                    .map_err(|_| Error::InvalidConfig { detail: format!("bad shm name {name}") })?;
                // SAFETY: valid NUL-terminated name.
                let raw = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
                if raw < 0 {
                    return Err(os_err("shm_open (open)", name));
                }
                // SAFETY: a fresh descriptor that nothing else owns.
                (unsafe { OwnedFd::from_raw_fd(raw) }, name.clone())
            }
        };
        let st = fstat(fd.as_raw_fd()).map_err(|e| backend_io("fstat", &what, e))?;
        if let Handle::Proc { dev, ino, .. } = handle
            && (st.st_dev, st.st_ino) != (*dev, *ino)
        {
            return Err(Error::ConfigMismatch {
                detail: format!(
                    "{what} is not rank {q}'s shared object (inode {}:{} instead of {dev}:{ino}): is rank {q} \
                         in another pid namespace?",
                    st.st_dev, st.st_ino
                ),
            });
        }
        let found = u64::try_from(st.st_size).unwrap_or(0);
        if found < len as u64 {
            return Err(Error::ConfigMismatch {
                detail: format!(
                    "rank {q}'s shared-memory object {what} is {found} bytes but the layout needs {len} bytes \
                     (truncated, or created for another capacity)"
                ),
            });
        }
        Self::map(&fd, &what, len)
    }

    fn map(fd: &OwnedFd, name: &str, len: usize) -> Result<Region, Error> {
        // SAFETY: fd is valid; a fresh shared mapping of `len` bytes, which the caller checked
        // (or reserved) the object holds.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err("mmap", name));
        }
        // From here on a truncation of the object by any process is a recorded fault of this
        // region, not a SIGBUS that kills this one (crate::guard).
        let mut region = Region { base: p.cast(), len, kind: Kind::Mapped(None) };
        region.kind = Kind::Mapped(Some(Guard::register(region.base, len)?));
        Ok(region)
    }

    /// Whether an access to this region faulted because its shared object shrank (it was
    /// truncated after it was mapped): what was read from it since is zeros (crate::guard).
    pub(crate) fn faulted(&self) -> bool {
        matches!(&self.kind, Kind::Mapped(Some(g)) if g.faulted())
    }

    /// Removes the name of a shared-memory object; mappings stay valid.
    pub(crate) fn unlink(name: &str) {
        if let Ok(c) = CString::new(name) {
            // SAFETY: valid NUL-terminated name.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

fn backend_io(op: &str, what: &str, e: std::io::Error) -> Error {
    Error::Backend { backend: "shm-ipc", detail: format!("{op} {what}: {e}") }
}

/// An unnamed read-write tmpfs file in `/dev/shm`, or `None` where that is unsupported.
fn open_tmpfile() -> Option<OwnedFd> {
    let dir = CString::new(SHM_DIR).ok()?;
    // SAFETY: valid NUL-terminated path; O_TMPFILE creates an unnamed file in that directory.
    let raw = unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600) };
    // SAFETY: a fresh descriptor that nothing else owns.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Opens the file behind descriptor `fd` of process `pid` through `/proc`.
fn proc_open(pid: u32, fd: i32) -> Result<OwnedFd, std::io::Error> {
    let path = CString::new(format!("/proc/{pid}/fd/{fd}")).map_err(std::io::Error::other)?;
    // SAFETY: valid NUL-terminated path.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Who created a fallback object, written into its name (`detcoll-<pid>-s<start>-n<ns>-…`):
/// the pid alone cannot prove an owner dead, since jobs in other pid namespaces share
/// `/dev/shm` and their pids mean other processes here, and pids are reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    /// The pid in the owner's pid namespace.
    pid: u32,
    /// Its start time (field 22 of `/proc/<pid>/stat`, clock ticks after boot).
    start: u64,
    /// The inode of its pid namespace (`/proc/self/ns/pid`).
    ns: u64,
}

impl Owner {
    /// This process, or `None` when `/proc` cannot tell (not mounted, or mounted for another
    /// pid namespace): then names carry no identity and the sweep removes nothing.
    fn me() -> Option<Owner> {
        use std::os::unix::fs::MetadataExt;
        let pid = std::process::id();
        let (self_pid, start, _) = proc_stat("self")?;
        if self_pid != pid {
            return None;
        }
        let ns = std::fs::metadata("/proc/self/ns/pid").ok()?.ino();
        (ns != 0).then_some(Owner { pid, start, ns })
    }

    /// The owner of the object named `detcoll-<rest>`, when the name carries one.
    fn parse(rest: &str) -> Option<Owner> {
        let mut it = rest.split('-');
        let pid = it.next()?.parse().ok()?;
        let start = it.next()?.strip_prefix('s')?.parse().ok()?;
        let ns = it.next()?.strip_prefix('n')?.parse().ok()?;
        Some(Owner { pid, start, ns })
    }

    /// Whether this owner is provably gone, seen from `me`: it lived in our pid namespace and
    /// its pid no longer exists, is a zombie, or is now another process (another start time).
    /// Anything else (another namespace, an unreadable `/proc/<pid>`) is presumed alive.
    fn is_gone(&self, me: &Owner) -> bool {
        if self.ns != me.ns || *self == *me {
            return false;
        }
        // SAFETY: signal 0 only checks for existence and permission.
        if unsafe { libc::kill(self.pid as libc::pid_t, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            return true;
        }
        match proc_stat(&self.pid.to_string()) {
            Some((pid, start, state)) if pid == self.pid => start != self.start || matches!(state, b'Z' | b'X' | b'x'),
            _ => false,
        }
    }
}

/// `(pid, start time, state)` from `/proc/<which>/stat` (after the parenthesised command name,
/// which may itself contain spaces and parentheses).
fn proc_stat(which: &str) -> Option<(u32, u64, u8)> {
    let stat = std::fs::read_to_string(format!("/proc/{which}/stat")).ok()?;
    let pid = stat.split(' ').next()?.parse().ok()?;
    let close = stat.rfind(')')?;
    let mut fields = stat.get(close + 1..)?.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // Fields 4..=22 follow the state (field 3): the start time is the 19th after it.
    let start = fields.nth(18)?.parse().ok()?;
    Some((pid, start, state))
}

/// The name of the fallback object for `stem` (`detcoll-<pid>-<rank>-<nonce>`): the owner's
/// identity goes after the pid, so the sweep of any job on the host can tell whether we are
/// gone. Without `/proc`, the stem as is (which no sweep removes).
fn fallback_name(stem: &str) -> String {
    let Some(me) = Owner::me() else { return format!("/{stem}") };
    let tail = stem.strip_prefix(&format!("{NAME_PREFIX}{}-", me.pid)).unwrap_or(stem);
    format!("/{NAME_PREFIX}{}-s{}-n{}-{tail}", me.pid, me.start, me.ns)
}

/// Removes fallback objects `detcoll-<pid>-s<start>-n<ns>-…` in `/dev/shm` whose owner is
/// provably gone (it was killed between creating its object and every peer mapping it; see
/// [`Owner::is_gone`]). Names of another pid namespace, of a live process, or without an owner
/// identity (older versions) are never removed. Best effort.
fn sweep_stale() {
    if testing::has(Fault::NoSweep) {
        return;
    }
    let Some(me) = Owner::me() else { return };
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else { return };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(NAME_PREFIX)) else { continue };
        if Owner::parse(rest).is_some_and(|owner| owner.is_gone(&me)) {
            Region::unlink(&format!("/{NAME_PREFIX}{rest}"));
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        match &mut self.kind {
            // SAFETY: allocated in `heap` with this layout.
            Kind::Heap => unsafe {
                std::alloc::dealloc(self.base, std::alloc::Layout::from_size_align_unchecked(self.len.max(PAGE), PAGE))
            },
            Kind::Mapped(guard) => {
                // Released before the range is unmapped (and may be reused).
                drop(guard.take());
                // SAFETY: mapped in `map` with this length.
                unsafe { libc::munmap(self.base.cast(), self.len) };
            }
        }
    }
}
