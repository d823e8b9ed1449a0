//! Shared by the HIP test files: device discovery (with a printed skip), a lock that keeps one
//! world on the GPU at a time, and the rank environment of the conformance suite.
#![allow(dead_code)]
use collective_core::conformance::RankEnv;
use collective_core::{DType, RawMut, RawRef};
use hip_ipc::runtime::{self, DeviceMemory};
use hip_ipc::{HipIpcCollective, Stream};
use std::sync::{Mutex, MutexGuard};

/// Device bytes every rank of a test world gets up front (the suite needs a few MiB per rank).
pub const REGION_BYTES: usize = 256 << 20;

/// HIP device 0, or `None` after printing "skipped: no HIP device".
pub fn gpu() -> Option<usize> {
    match runtime::device_count() {
        Ok(n) if n > 0 => Some(0),
        _ => {
            collective_core::conformance::skip("no HIP device");
            None
        }
    }
}

/// One world on the GPU at a time: ranks of a world spin waiting for each other.
pub fn gpu_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A buffer carved from the rank's region (allocated before the world starts: allocating
/// while a peer's kernel spins could synchronise the device and stall the world).
#[derive(Debug)]
pub struct DevBuf {
    pub ptr: u64,
    pub len: usize,
}

/// One rank of the suite: its collective, its own stream, a bump allocator over its region.
pub struct HipRank {
    pub comm: HipIpcCollective,
    pub stream: Stream,
    next: u64,
    end: u64,
    /// Owned here when the rank is a process of its own; threads' regions outlive the world.
    _region: Option<DeviceMemory>,
}

impl HipRank {
    /// A rank allocating from `[base, base + bytes)`, owned elsewhere (threads).
    pub fn borrowing(comm: HipIpcCollective, stream: Stream, base: u64, bytes: usize) -> HipRank {
        HipRank { comm, stream, next: base, end: base + bytes as u64, _region: None }
    }
    /// A rank owning its memory (one process per rank).
    pub fn owning(comm: HipIpcCollective, stream: Stream, region: DeviceMemory) -> HipRank {
        let (next, end) = (region.ptr(), region.ptr() + region.len() as u64);
        HipRank { comm, stream, next, end, _region: Some(region) }
    }
    fn upload(&self, dst: u64, data: &[u8]) {
        self.stream.synchronize().expect("sync");
        if !data.is_empty() {
            runtime::copy_to_device(data, dst).expect("hipMemcpy (upload)");
        }
    }
    fn download(&self, src: u64, len: usize) -> Vec<u8> {
        self.stream.synchronize().expect("sync");
        let mut v = vec![0u8; len];
        if len > 0 {
            runtime::copy_to_host(src, &mut v).expect("hipMemcpy (download)");
        }
        v
    }
}

impl RankEnv for HipRank {
    type Comm = HipIpcCollective;
    type Buf = DevBuf;
    fn comm(&self) -> &HipIpcCollective {
        &self.comm
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
    fn alloc(&mut self, bytes: usize) -> DevBuf {
        let ptr = self.next;
        let take = (bytes.max(1) as u64).div_ceil(256) * 256;
        assert!(ptr + take <= self.end, "test region exhausted ({bytes} bytes asked)");
        self.next += take;
        DevBuf { ptr, len: bytes }
    }
    fn write(&mut self, buf: &mut DevBuf, data: &[u8]) {
        assert!(data.len() <= buf.len);
        self.upload(buf.ptr, data);
    }
    fn read(&mut self, buf: &DevBuf) -> Vec<u8> {
        self.download(buf.ptr, buf.len)
    }
    fn view<'b>(&self, buf: &'b DevBuf, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.len, "suite view out of bounds");
        // SAFETY: in bounds of a live device buffer the view borrows.
        unsafe { RawRef::from_raw(buf.ptr + byte_offset as u64, len, dtype) }
    }
    fn view_mut<'b>(&self, buf: &'b mut DevBuf, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.len, "suite view out of bounds");
        // SAFETY: as above, borrowed uniquely.
        unsafe { RawMut::from_raw(buf.ptr + byte_offset as u64, len, dtype) }
    }
}
