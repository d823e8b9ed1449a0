//! One rank's protocol region: heap memory (threads) or a shared-memory file (processes).
use collective_core::Error;
use std::ffi::CString;

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
    Mapped,
}

// SAFETY: the region is plain memory; all concurrent access goes through atomics or is
// ordered by the protocol's release/acquire flags.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

const PAGE: usize = 4096;

fn os_err(what: &str, name: &str) -> Error {
    Error::Backend { backend: "shm-ipc", detail: format!("{what} {name}: {}", std::io::Error::last_os_error()) }
}

impl Region {
    /// Heap memory for ranks that are threads of this process.
    pub(crate) fn heap(len: usize) -> Result<Region, Error> {
        let layout = std::alloc::Layout::from_size_align(len.max(PAGE), PAGE)
            .map_err(|e| Error::InvalidConfig { detail: format!("region of {len} bytes: {e}") })?;
        // SAFETY: the layout has non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(Error::Backend { backend: "shm-ipc", detail: format!("out of memory for {len} bytes") });
        }
        Ok(Region { base, len, kind: Kind::Heap })
    }

    /// Creates and maps the shared-memory object `name` (e.g. `/detcoll-123-0`).
    pub(crate) fn create_shared(name: &str, len: usize) -> Result<Region, Error> {
        let c = CString::new(name).map_err(|_| Error::InvalidConfig { detail: format!("bad shm name {name}") })?;
        // SAFETY: valid NUL-terminated name; flags create a new object only.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(os_err("shm_open (create)", name));
        }
        // SAFETY: fd is a valid descriptor we own.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = os_err("ftruncate", name);
            // SAFETY: fd is ours; the object is removed since nobody could have mapped it.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(c.as_ptr());
            }
            return Err(e);
        }
        Self::map(fd, name, len)
    }

    /// Maps the existing shared-memory object `name` of a peer.
    pub(crate) fn open_shared(name: &str, len: usize) -> Result<Region, Error> {
        let c = CString::new(name).map_err(|_| Error::InvalidConfig { detail: format!("bad shm name {name}") })?;
        // SAFETY: valid NUL-terminated name.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(os_err("shm_open (open)", name));
        }
        Self::map(fd, name, len)
    }

    fn map(fd: libc::c_int, name: &str, len: usize) -> Result<Region, Error> {
        // SAFETY: fd is valid; a fresh shared mapping of `len` bytes.
        let p = unsafe {
            libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        // SAFETY: the mapping keeps the object alive; the descriptor is no longer needed.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            return Err(os_err("mmap", name));
        }
        Ok(Region { base: p.cast(), len, kind: Kind::Mapped })
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

impl Drop for Region {
    fn drop(&mut self) {
        match self.kind {
            // SAFETY: allocated in `heap` with this layout.
            Kind::Heap => unsafe {
                std::alloc::dealloc(self.base, std::alloc::Layout::from_size_align_unchecked(self.len.max(PAGE), PAGE))
            },
            // SAFETY: mapped in `map` with this length.
            Kind::Mapped => unsafe {
                libc::munmap(self.base.cast(), self.len);
            },
        }
    }
}
