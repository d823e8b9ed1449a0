//! The SIGBUS guard: a shared object truncated under a mapping of it is a typed error, not a
//! crash.
//!
//! # The hazard
//!
//! Every rank maps its own shared object and every peer's (`/dev/shm`, see `region`). Any
//! process that holds a descriptor of one (its owner, a peer that kept the one it mapped through,
//! any process of the same user while the owner's descriptor is reachable in `/proc`) can
//! `ftruncate` it after construction. The kernel then removes the pages past the new end from
//! every mapping, and the next access to one of them raises `SIGBUS`: without a guard the honest
//! rank is killed (exit status 135) in the middle of a call, with no error to report.
//!
//! # What does not work
//!
//! * `MAP_POPULATE` + `mlock`: truncation unmaps the removed pages from every mapping, locked or
//!   not (measured: a populated, mlocked mapping of a 1 MiB tmpfs file faults after an
//!   `ftruncate` to one page).
//! * Seals (`F_SEAL_SHRINK`): a tmpfs file in `/dev/shm` is created with `F_SEAL_SEAL`, so
//!   `F_ADD_SEALS` fails with `EPERM` (measured); only `memfd_create(MFD_ALLOW_SEALING)` files
//!   take seals, and they are not accounted in `/dev/shm` (see `region`), nor can the named
//!   fallback object be sealed.
//! * Checking the size (`fstat`) before each call: a truncation during the call still faults.
//!
//! # The design
//!
//! Every mapping of a shared object (the rank's own and every peer's) is registered here while
//! it exists: its base and length. A process-wide `SIGBUS` handler, installed once at the first
//! registration (`SA_SIGINFO | SA_ONSTACK`), looks the faulting address (`si_addr`) up among the
//! registered mappings. If it lies in one, the handler maps private anonymous zero pages over
//! that mapping from the faulting page to its end (`MAP_FIXED`: every page past the new end of
//! the file faults alike, the pages before it are still the file's), records the fault in the
//! mapping's slot and returns. The kernel restarts the faulting instruction on the zero page: a
//! read gets zeros, a write lands in private memory, and the code continues to its next check.
//! The engine checks its mappings' slots after every generation (before a call returns `Ok`)
//! and in the slow path of every wait (every millisecond), so the call that met the fault fails
//! with a typed error — [`collective_core::Error::PeerDied`] naming the rank whose object shrank
//! (a `Backend` error when it is the rank's own) — within about a millisecond, and poisons the
//! handle. The data read after the fault is zeros, so that call's output is garbage: a failed
//! call's output is unspecified, and it never returns `Ok`.
//!
//! A fault at any other address goes to the handler that was installed before this one (Rust's
//! stack-overflow handler, or the default action), so it ends the process as it would have.
//!
//! **Async-signal safety.** The handler takes no lock and allocates nothing: it reads a table of
//! slots through atomics, calls `mmap` (one system call) and saves and restores `errno`. Each
//! slot is a sequence lock: a slot being registered or released by another thread at that
//! moment is skipped — it cannot be the faulting mapping, which stays registered for as long as
//! anyone accesses it (a region is released from here before it is unmapped). Slots live in
//! chunks that are never freed (the table only grows), so the handler never reads freed memory.
//!
//! **Limits.** An application that installs its own `SIGBUS` handler later, without calling the
//! one it replaced, switches the guard off (a truncation then kills the process as before).
//! Ranks that are threads share heap memory and register nothing.
use collective_core::Error;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Mutex, OnceLock};

/// Slots per chunk of the table.
const SLOTS: usize = 64;

/// One registered mapping. `seq` is odd while the slot is being written; `base` is 0 when the
/// slot is free.
#[derive(Debug)]
struct Slot {
    seq: AtomicU64,
    base: AtomicUsize,
    len: AtomicUsize,
    /// The `seq` of the registration whose mapping faulted (0: none).
    faulted: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot { seq: AtomicU64::new(0), base: AtomicUsize::new(0), len: AtomicUsize::new(0), faulted: AtomicU64::new(0) }
    }

    /// Writes `(base, len)` (under [`REGISTRY`]); returns the slot's new, even sequence.
    fn publish(&self, base: usize, len: usize) -> u64 {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.base.store(base, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.seq.store(s + 2, Ordering::Release);
        s + 2
    }

    /// A consistent `(seq, base, len)` of a registered slot, `None` when free or being written.
    fn read(&self) -> Option<(u64, usize, usize)> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return None;
        }
        let (base, len) = (self.base.load(Ordering::Relaxed), self.len.load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1 && base != 0).then_some((s1, base, len))
    }
}

#[derive(Debug)]
struct Chunk {
    slots: [Slot; SLOTS],
    next: AtomicPtr<Chunk>,
}

/// The first chunk of the table; further chunks are leaked boxes linked from it.
static TABLE: Chunk = Chunk { slots: [const { Slot::new() }; SLOTS], next: AtomicPtr::new(core::ptr::null_mut()) };
/// Serialises registration and release (never taken by the handler).
static REGISTRY: Mutex<()> = Mutex::new(());
/// Faults the handler has absorbed in this process (a fast check before the slots).
static FAULTS: AtomicU64 = AtomicU64::new(0);
/// The system page size, set before the handler is installed.
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The `SIGBUS` disposition found at installation, called for faults outside every mapping.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
/// Whether the handler is installed (set once).
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Every chunk of the table, in order.
fn chunks() -> impl Iterator<Item = &'static Chunk> {
    let mut next: Option<&'static Chunk> = Some(&TABLE);
    core::iter::from_fn(move || {
        let c = next?;
        let p = c.next.load(Ordering::Acquire);
        // SAFETY: chunks are leaked boxes, never freed; a non-null link was published (release)
        // after the chunk was initialised.
        next = (!p.is_null()).then(|| unsafe { &*p });
        Some(c)
    })
}

/// A registered mapping: while it lives, a `SIGBUS` inside `[base, base + len)` is absorbed
/// (see the module doc). Drop it before unmapping the range.
#[derive(Debug)]
pub(crate) struct Guard {
    slot: &'static Slot,
    seq: u64,
}

impl Guard {
    /// Registers the mapping `[base, base + len)` (installing the handler on first use).
    pub(crate) fn register(base: *mut u8, len: usize) -> Result<Guard, Error> {
        install()?;
        let _lock = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        let free = chunks().flat_map(|c| c.slots.iter()).find(|s| s.base.load(Ordering::Relaxed) == 0);
        let slot = match free {
            Some(s) => s,
            None => {
                let fresh: &'static Chunk = Box::leak(Box::new(Chunk {
                    slots: [const { Slot::new() }; SLOTS],
                    next: AtomicPtr::new(core::ptr::null_mut()),
                }));
                let last = chunks().last().unwrap_or(&TABLE);
                last.next.store((fresh as *const Chunk).cast_mut(), Ordering::Release);
                &fresh.slots[0]
            }
        };
        let seq = slot.publish(base as usize, len);
        Ok(Guard { slot, seq })
    }

    /// Whether an access to this mapping faulted (the object shrank under it) since it was
    /// registered.
    pub(crate) fn faulted(&self) -> bool {
        FAULTS.load(Ordering::Acquire) != 0 && self.slot.faulted.load(Ordering::Acquire) == self.seq
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _lock = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        self.slot.publish(0, 0);
    }
}

/// Whether any guarded mapping of this process has faulted (one load: the per-call check).
pub(crate) fn any_fault() -> bool {
    FAULTS.load(Ordering::Acquire) != 0
}

/// Installs the handler once, keeping the disposition it replaces.
fn install() -> Result<(), Error> {
    let ok = *INSTALLED.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: an all-zero `sigaction` is a valid value of this plain C struct.
        let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
        // SAFETY: querying the current disposition into a valid struct.
        if unsafe { libc::sigaction(libc::SIGBUS, core::ptr::null(), &mut old) } != 0 {
            return false;
        }
        let _ = PREVIOUS.set(old);
        // SAFETY: as above.
        let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
        sa.sa_sigaction =
            on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `sa.sa_mask` is a valid set; the handler is async-signal-safe (module doc).
        unsafe {
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, core::ptr::null_mut()) == 0
        }
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Backend {
            backend: "shm-ipc",
            detail: format!("installing the SIGBUS guard of shared mappings: {}", std::io::Error::last_os_error()),
        })
    }
}

/// Absorbs a fault at `addr` if it lies in a registered mapping: zero pages from its page to
/// the mapping's end, the fault recorded. Async-signal-safe.
fn absorb(addr: usize) -> bool {
    let page = PAGE.load(Ordering::Relaxed);
    for chunk in chunks() {
        for slot in &chunk.slots {
            let Some((seq, base, len)) = slot.read() else { continue };
            if addr < base || addr - base >= len {
                continue;
            }
            let start = addr & !(page - 1);
            // SAFETY: `[start, base + len)` lies in a live, registered mapping of ours (it stays
            // registered while anyone accesses it); replacing its pages with private zero pages
            // is the recovery the module doc describes.
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    base + len - start,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return false;
            }
            slot.faulted.store(seq, Ordering::Release);
            FAULTS.fetch_add(1, Ordering::Release);
            return true;
        }
    }
    false
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is this thread's; the kernel passes a valid siginfo to SA_SIGINFO handlers.
    let (errno, addr) = unsafe { (*libc::__errno_location(), (*info).si_addr() as usize) };
    let absorbed = absorb(addr);
    // SAFETY: restoring this thread's errno.
    unsafe { *libc::__errno_location() = errno };
    if !absorbed {
        forward(sig, info, ctx);
    }
}

/// A fault that is not ours: the previous handler, or the default action (reinstated, so the
/// faulting instruction, restarted on return, ends the process with `SIGBUS` as before).
fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let previous = PREVIOUS.get().filter(|p| p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN);
    match previous {
        Some(p) if p.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: an SA_SIGINFO disposition holds a handler of this signature.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { core::mem::transmute(p.sa_sigaction) };
            f(sig, info, ctx);
        }
        Some(p) => {
            // SAFETY: a plain disposition holds a handler taking the signal number.
            let f: extern "C" fn(libc::c_int) = unsafe { core::mem::transmute(p.sa_sigaction) };
            f(sig);
        }
        None => {
            // SAFETY: an all-zero sigaction with SIG_DFL (0) is the default disposition;
            // sigaction is async-signal-safe.
            unsafe {
                let dfl: libc::sigaction = core::mem::zeroed();
                libc::sigaction(sig, &dfl, core::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// A mapping of a reserved tmpfs file of `len` bytes and its descriptor.
    fn shared(len: usize) -> (*mut u8, OwnedFd) {
        // SAFETY: valid path; a fresh unnamed file that nothing else owns.
        let fd = unsafe {
            let raw = libc::open(c"/dev/shm".as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600);
            assert!(raw >= 0, "O_TMPFILE in /dev/shm: {}", std::io::Error::last_os_error());
            OwnedFd::from_raw_fd(raw)
        };
        // SAFETY: fd is ours; reserve and map `len` bytes of it.
        let p = unsafe {
            assert_eq!(libc::posix_fallocate(fd.as_raw_fd(), 0, len as libc::off_t), 0);
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (p.cast(), fd)
    }

    #[test]
    fn a_truncated_mapping_reads_zeros_and_reports_the_fault() {
        let len = 16 * 4096;
        let (p, fd) = shared(len);
        let guard = Guard::register(p, len).unwrap();
        // SAFETY: `p` maps `len` bytes.
        unsafe { core::ptr::write_bytes(p, 0xAB, len) };
        assert!(!guard.faulted());
        // SAFETY: fd is ours; shrinking it is the fault under test.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 3 * 4096 + 100) }, 0);
        let mut copy = vec![0u8; len];
        // SAFETY: the mapping is still ours; the pages past the end fault and are absorbed.
        unsafe { core::ptr::copy_nonoverlapping(p, copy.as_mut_ptr(), len) };
        assert!(guard.faulted() && any_fault());
        assert!(copy[..3 * 4096 + 100].iter().all(|&b| b == 0xAB), "the file's pages are kept");
        assert!(copy[4 * 4096..].iter().all(|&b| b == 0), "the truncated pages read as zeros");
        // Writes past the end land in private memory.
        // SAFETY: as above.
        unsafe { p.add(len - 1).write_volatile(7) };
        // A second registration of a slot never inherits an earlier fault.
        drop(guard);
        let (q, _fd2) = shared(4096);
        let fresh = Guard::register(q, 4096).unwrap();
        assert!(!fresh.faulted());
        drop(fresh);
        // SAFETY: both are our mappings of these lengths, no longer registered.
        unsafe {
            libc::munmap(p.cast(), len);
            libc::munmap(q.cast(), 4096);
        }
    }

    #[test]
    fn the_table_grows_past_one_chunk() {
        // Ranges of a reserved, inaccessible mapping: registered, never touched.
        let len = 3 * SLOTS * 4096;
        // SAFETY: a fresh anonymous reservation.
        let p = unsafe {
            libc::mmap(core::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        let guards: Vec<Guard> =
            (0..3 * SLOTS).map(|i| Guard::register(p.cast::<u8>().wrapping_add(i * 4096), 4096).unwrap()).collect();
        let slots: std::collections::HashSet<*const Slot> = guards.iter().map(|g| g.slot as *const Slot).collect();
        assert_eq!(slots.len(), guards.len(), "every registration has its own slot");
        drop(guards);
        // SAFETY: our reservation, no longer registered.
        unsafe { libc::munmap(p, len) };
    }
}
