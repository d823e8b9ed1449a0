//! Our own runtime-loaded binding of the NCCL API subset detcoll uses.
//!
//! RCCL keeps NCCL's API and ABI, so this one binding drives `libnccl.so.2` on NVIDIA and
//! `librccl.so.1` on ROCm. Nothing is linked at build time: [`NcclLibrary::open`] dlopens a
//! library (see [`crate::loader`] for where it looks) and resolves every symbol up front, so a
//! missing library or symbol is a typed [`LoadError`] at load time (the result layer's
//! `NcclError::LibraryMissing`), never a panic at first use.
//!
//! Types mirror `nccl.h` of NCCL 2.28 (`src/nccl.h.in`); their sizes are checked at compile
//! time. Result codes are a transparent `int` newtype rather than a Rust enum: a future
//! library may return a code this binding does not know (2.29 added `ncclTimeout = 8`), and an
//! out-of-range discriminant in a Rust enum would be undefined behaviour.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::fmt;

/// A library that could not be opened, or lacks a symbol this binding needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The library file or name tried.
    pub library: String,
    /// What the loader said.
    pub detail: String,
}

/// Bytes of an `ncclUniqueId`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// The opaque id rank 0 creates and every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

const _: () = assert!(size_of::<ncclUniqueId>() == NCCL_UNIQUE_ID_BYTES);

impl ncclUniqueId {
    /// All zero bytes (the value NCCL overwrites).
    pub const fn zeroed() -> Self {
        ncclUniqueId { internal: [0; NCCL_UNIQUE_ID_BYTES] }
    }

    /// The id as bytes, for the bootstrap exchange.
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        let mut out = [0u8; NCCL_UNIQUE_ID_BYTES];
        for (o, c) in out.iter_mut().zip(self.internal.iter()) {
            *o = *c as u8;
        }
        out
    }

    /// The id from bytes received through the bootstrap; `None` unless exactly 128 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != NCCL_UNIQUE_ID_BYTES {
            return None;
        }
        let mut id = Self::zeroed();
        for (c, b) in id.internal.iter_mut().zip(bytes) {
            *c = *b as c_char;
        }
        Some(id)
    }
}

impl fmt::Debug for ncclUniqueId {
    /// Prints a digest only: the id contains rank 0's address and is not interesting in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h =
            self.to_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3));
        write!(f, "ncclUniqueId({h:016x})")
    }
}

/// The communicator object NCCL allocates (never dereferenced on our side).
#[repr(C)]
#[derive(Debug)]
pub struct ncclComm {
    _opaque: [u8; 0],
}

/// Handle to a communicator.
pub type ncclComm_t = *mut ncclComm;
/// `cudaStream_t` on NVIDIA, `hipStream_t` on ROCm: both an opaque pointer.
pub type cudaStream_t = *mut c_void;

/// `ncclResult_t`: a transparent `int`, so any value a library returns is sound to hold.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ncclResult_t(pub c_int);

impl ncclResult_t {
    pub const ncclSuccess: Self = Self(0);
    pub const ncclUnhandledCudaError: Self = Self(1);
    pub const ncclSystemError: Self = Self(2);
    pub const ncclInternalError: Self = Self(3);
    pub const ncclInvalidArgument: Self = Self(4);
    pub const ncclInvalidUsage: Self = Self(5);
    pub const ncclRemoteError: Self = Self(6);
    pub const ncclInProgress: Self = Self(7);
    /// Added in NCCL 2.29 (not in 2.28's header); named so messages from newer libraries read well.
    pub const ncclTimeout: Self = Self(8);

    /// The enumerator's name in `nccl.h`, or `"unknown"`.
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "ncclSuccess",
            1 => "ncclUnhandledCudaError",
            2 => "ncclSystemError",
            3 => "ncclInternalError",
            4 => "ncclInvalidArgument",
            5 => "ncclInvalidUsage",
            6 => "ncclRemoteError",
            7 => "ncclInProgress",
            8 => "ncclTimeout",
            _ => "unknown",
        }
    }
}

impl fmt::Debug for ncclResult_t {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for ncclResult_t {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// `ncclDataType_t` (values from `nccl.h`; RCCL uses the same). Only passed to the library.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ncclDataType_t {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
}

/// `ncclNumTypes` of NCCL 2.28.
pub const ncclNumTypes: c_int = 12;

/// `ncclRedOp_t` (values from `nccl.h`). Used only by the non-strict reference calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ncclRedOp_t {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
}

/// `ncclNumOps` of NCCL 2.28.
pub const ncclNumOps: c_int = 5;

const _: () = assert!(size_of::<ncclDataType_t>() == size_of::<c_int>());
const _: () = assert!(size_of::<ncclRedOp_t>() == size_of::<c_int>());
const _: () = assert!(size_of::<ncclResult_t>() == size_of::<c_int>());

/// `NCCL_CONFIG_UNDEF_INT`: "let the library decide".
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_API_MAGIC`: marks a config built by the initializer.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_VERSION(2, 28, 0)`: the header version this struct layout is from.
pub const NCCL_CONFIG_VERSION: c_uint = 22800;

/// `ncclConfig_t` as of NCCL 2.28 (`struct ncclConfig_v22800`).
///
/// The struct is versioned and append-only: the library reads `size` bytes (capped at its own
/// size) and checks `magic`, so this layout works with 2.28 and with newer libraries (which
/// leave their later fields at their defaults), and older ones copy only the prefix they
/// know. Build it with [`ncclConfig_t::initializer`] (`NCCL_CONFIG_INITIALIZER`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<ncclConfig_t>() == 80);

impl ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER`: size, magic, version set; every attribute undefined.
    pub const fn initializer() -> Self {
        const U: c_int = NCCL_CONFIG_UNDEF_INT;
        ncclConfig_t {
            size: size_of::<ncclConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_CONFIG_VERSION,
            blocking: U,
            cgaClusterSize: U,
            minCTAs: U,
            maxCTAs: U,
            netName: core::ptr::null(),
            splitShare: U,
            trafficClass: U,
            commName: core::ptr::null(),
            collnetEnable: U,
            CTAPolicy: U,
            shrinkShare: U,
            nvlsCTAs: U,
            nChannelsPerNetPeer: U,
            nvlinkCentricSched: U,
        }
    }
}

/// Every entry point we use, resolved at load.
#[derive(Debug, Clone, Copy)]
pub struct NcclFns {
    pub ncclGetVersion: unsafe extern "C" fn(version: *mut c_int) -> ncclResult_t,
    pub ncclGetUniqueId: unsafe extern "C" fn(id: *mut ncclUniqueId) -> ncclResult_t,
    pub ncclCommInitRank:
        unsafe extern "C" fn(comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int) -> ncclResult_t,
    pub ncclCommInitRankConfig: unsafe extern "C" fn(
        comm: *mut ncclComm_t,
        nranks: c_int,
        id: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t,
    pub ncclCommDestroy: unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t,
    pub ncclCommAbort: unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t,
    pub ncclCommGetAsyncError: unsafe extern "C" fn(comm: ncclComm_t, async_error: *mut ncclResult_t) -> ncclResult_t,
    pub ncclGetErrorString: unsafe extern "C" fn(result: ncclResult_t) -> *const c_char,
    pub ncclAllGather: unsafe extern "C" fn(
        send: *const c_void,
        recv: *mut c_void,
        send_count: usize,
        dtype: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t,
    pub ncclGroupStart: unsafe extern "C" fn() -> ncclResult_t,
    pub ncclGroupEnd: unsafe extern "C" fn() -> ncclResult_t,
    pub ncclSend: unsafe extern "C" fn(
        send: *const c_void,
        count: usize,
        dtype: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t,
    pub ncclRecv: unsafe extern "C" fn(
        recv: *mut c_void,
        count: usize,
        dtype: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t,
    /// Native reduction: NOT deterministic; only for the non-strict reference timing.
    pub ncclAllReduce: unsafe extern "C" fn(
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t,
    /// Native reduction: NOT deterministic; only for the non-strict reference timing.
    pub ncclReduceScatter: unsafe extern "C" fn(
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        dtype: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t,
    /// Optional (NCCL >= 2.13): a more specific message than the result code's.
    pub ncclGetLastError: Option<unsafe extern "C" fn(comm: ncclComm_t) -> *const c_char>,
    /// Optional (NCCL >= 2.14): flushes a communicator without blocking, so close is bounded.
    pub ncclCommFinalize: Option<unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t>,
}

/// A loaded NCCL or RCCL: the library handle (kept alive as long as the function pointers) and
/// its resolved entry points.
pub struct NcclLibrary {
    fns: NcclFns,
    path: String,
    /// `None` only for the in-process fakes of tests.
    _lib: Option<libloading::Library>,
}

impl fmt::Debug for NcclLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclLibrary").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Resolves `name` (NUL-terminated) as a `T` function pointer.
///
/// # Safety
/// `T` must be the symbol's true C signature.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, path: &str, name: &'static [u8]) -> Result<T, LoadError> {
    // SAFETY: forwarded: `T` is the documented signature of `name`.
    match unsafe { lib.get::<T>(name) } {
        Ok(s) => Ok(*s),
        Err(e) => Err(LoadError {
            library: path.to_string(),
            detail: format!("symbol {} is missing ({e}); NCCL/RCCL 2.14 or newer is required", symbol_name(name)),
        }),
    }
}

/// Like [`symbol`], `None` when absent.
///
/// # Safety
/// As [`symbol`].
unsafe fn optional<T: Copy>(lib: &libloading::Library, name: &'static [u8]) -> Option<T> {
    // SAFETY: forwarded.
    unsafe { lib.get::<T>(name) }.ok().map(|s| *s)
}

fn symbol_name(name: &[u8]) -> &str {
    core::str::from_utf8(name).unwrap_or("?").trim_end_matches('\0')
}

impl NcclLibrary {
    /// Opens the library at `path` (a file name searched by the dynamic loader, or a path) and
    /// resolves every entry point. A missing library or symbol is a [`LoadError`].
    pub fn open(path: &str) -> Result<NcclLibrary, LoadError> {
        // SAFETY: loading NCCL/RCCL runs their initialisers, which only set up library state.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| LoadError { library: path.to_string(), detail: collective_core::display_chain(&e) })?;
        // SAFETY: every signature below is the one of nccl.h (2.28), which RCCL keeps.
        let fns = unsafe {
            NcclFns {
                ncclGetVersion: symbol(&lib, path, b"ncclGetVersion\0")?,
                ncclGetUniqueId: symbol(&lib, path, b"ncclGetUniqueId\0")?,
                ncclCommInitRank: symbol(&lib, path, b"ncclCommInitRank\0")?,
                ncclCommInitRankConfig: symbol(&lib, path, b"ncclCommInitRankConfig\0")?,
                ncclCommDestroy: symbol(&lib, path, b"ncclCommDestroy\0")?,
                ncclCommAbort: symbol(&lib, path, b"ncclCommAbort\0")?,
                ncclCommGetAsyncError: symbol(&lib, path, b"ncclCommGetAsyncError\0")?,
                ncclGetErrorString: symbol(&lib, path, b"ncclGetErrorString\0")?,
                ncclAllGather: symbol(&lib, path, b"ncclAllGather\0")?,
                ncclGroupStart: symbol(&lib, path, b"ncclGroupStart\0")?,
                ncclGroupEnd: symbol(&lib, path, b"ncclGroupEnd\0")?,
                ncclSend: symbol(&lib, path, b"ncclSend\0")?,
                ncclRecv: symbol(&lib, path, b"ncclRecv\0")?,
                ncclAllReduce: symbol(&lib, path, b"ncclAllReduce\0")?,
                ncclReduceScatter: symbol(&lib, path, b"ncclReduceScatter\0")?,
                ncclGetLastError: optional(&lib, b"ncclGetLastError\0"),
                ncclCommFinalize: optional(&lib, b"ncclCommFinalize\0"),
            }
        };
        Ok(NcclLibrary { fns, path: path.to_string(), _lib: Some(lib) })
    }

    /// A library whose entry points are `fns`, functions of this process (tests: a fake NCCL).
    #[cfg(test)]
    pub(crate) fn from_fns(fns: NcclFns, path: &str) -> NcclLibrary {
        NcclLibrary { fns, path: path.to_string(), _lib: None }
    }

    /// The resolved entry points. Calling them is unsafe: see `nccl.h` for each contract.
    pub fn fns(&self) -> &NcclFns {
        &self.fns
    }

    /// The name or path the library was opened by.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether this is RCCL (by file name): used in messages and bench labels.
    pub fn is_rccl(&self) -> bool {
        self.path.contains("rccl")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn unique_id_is_128_bytes_and_round_trips() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        let bytes: Vec<u8> = (0..128u32).map(|i| (i * 37 + 11) as u8).collect();
        let id = ncclUniqueId::from_bytes(&bytes).expect("128 bytes");
        assert_eq!(id.to_bytes().as_slice(), bytes.as_slice());
        assert!(ncclUniqueId::from_bytes(&bytes[..127]).is_none());
        assert!(ncclUniqueId::from_bytes(&[0u8; 129]).is_none());
    }

    #[test]
    fn config_layout_matches_nccl_2_28() {
        assert_eq!(size_of::<ncclConfig_t>(), 80);
        assert_eq!(offset_of!(ncclConfig_t, magic), 8);
        assert_eq!(offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(offset_of!(ncclConfig_t, nvlinkCentricSched), 76);
        let c = ncclConfig_t::initializer();
        assert_eq!((c.size, c.magic, c.version, c.blocking), (80, 0xcafe_beef, 22800, i32::MIN));
    }

    #[test]
    fn enum_values_match_nccl_h() {
        assert_eq!(ncclResult_t::ncclSuccess.0, 0);
        assert_eq!(ncclResult_t::ncclRemoteError.0, 6);
        assert_eq!(ncclResult_t::ncclInProgress.0, 7);
        assert_eq!(ncclResult_t(42).name(), "unknown");
        assert_eq!(ncclDataType_t::ncclUint8 as i32, 1);
        assert_eq!(ncclDataType_t::ncclFloat16 as i32, 6);
        assert_eq!(ncclDataType_t::ncclFloat32 as i32, 7);
        assert_eq!(ncclDataType_t::ncclBfloat16 as i32, 9);
        assert_eq!(ncclDataType_t::ncclFloat8e5m2 as i32, ncclNumTypes - 1);
        assert_eq!(ncclRedOp_t::ncclSum as i32, 0);
        assert_eq!(ncclRedOp_t::ncclAvg as i32, ncclNumOps - 1);
    }

    #[test]
    fn a_library_without_the_symbols_is_a_typed_error() {
        // glibc is present on every Linux host and exports no NCCL symbol.
        match NcclLibrary::open("libc.so.6") {
            Err(LoadError { library, detail }) => {
                assert_eq!(library, "libc.so.6");
                assert!(detail.contains("ncclGetVersion"), "{detail}");
            }
            other => panic!("expected LibraryMissing, got {other:?}"),
        }
    }
}
