//! Backend-neutral views of caller memory.
//!
//! A view is an address, an element count and a dtype. Which address space the address lives
//! in (host memory for the CPU twin, device memory for the GPU twins) is the backend's business:
//! each backend offers safe constructors from its own buffer types, and these unsafe raw ones.
//! The safe host constructors ([`RawRef::host`], [`Io::host`]) mark their views as host
//! slices: a backend whose kernels read device memory refuses them with
//! [`Error::HostMemory`](crate::Error::HostMemory) before any work ([`Io::host_view`]), since a
//! GPU would dereference a host address, after the slice's borrow ended (calls are
//! asynchronous).
use crate::{DType, Plain};
use core::marker::PhantomData;

/// A read-only view of `len` elements of `dtype` at `addr`, borrowed for `'a`.
#[derive(Debug, Clone, Copy)]
pub struct RawRef<'a> {
    addr: u64,
    len: usize,
    dtype: DType,
    /// Built from a host slice by the safe constructor.
    host: bool,
    _borrow: PhantomData<&'a [u8]>,
}

/// A writable view of `len` elements of `dtype` at `addr`, uniquely borrowed for `'a`.
#[derive(Debug)]
pub struct RawMut<'a> {
    addr: u64,
    len: usize,
    dtype: DType,
    /// Built from a host slice by the safe constructor.
    host: bool,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> RawRef<'a> {
    /// A view of raw memory.
    ///
    /// # Safety
    /// `addr..addr + len * dtype.size()` must be readable memory of the backend's address space
    /// for `'a`, and nothing may write it while a collective reading it is in flight.
    pub const unsafe fn from_raw(addr: u64, len: usize, dtype: DType) -> Self {
        RawRef { addr, len, dtype, host: false, _borrow: PhantomData }
    }
    /// A view of a host slice (the CPU twin's address space). GPU backends refuse it
    /// ([`Error::HostMemory`](crate::Error::HostMemory)).
    pub fn host<T: Plain>(s: &'a [T]) -> Self {
        RawRef { addr: s.as_ptr() as u64, len: s.len(), dtype: T::DTYPE, host: true, _borrow: PhantomData }
    }
    /// Whether the view was built from a host slice ([`RawRef::host`]).
    pub const fn is_host(&self) -> bool {
        self.host
    }
    /// Start address.
    pub const fn addr(&self) -> u64 {
        self.addr
    }
    /// Number of elements.
    pub const fn len(&self) -> usize {
        self.len
    }
    /// Whether the view has no elements.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Element type.
    pub const fn dtype(&self) -> DType {
        self.dtype
    }
    /// Length in bytes, saturating at `usize::MAX` for a length whose bytes do not fit
    /// (validation refuses such a view with `SizeOverflow`; what reads its size first, such as
    /// a route lookup, must not overflow).
    pub const fn bytes(&self) -> usize {
        self.len.saturating_mul(self.dtype.size())
    }
}

impl<'a> RawMut<'a> {
    /// A writable view of raw memory.
    ///
    /// # Safety
    /// `addr..addr + len * dtype.size()` must be writable memory of the backend's address space
    /// for `'a`, not accessed by anything else while a collective writing it is in flight.
    pub const unsafe fn from_raw(addr: u64, len: usize, dtype: DType) -> Self {
        RawMut { addr, len, dtype, host: false, _borrow: PhantomData }
    }
    /// A view of a mutable host slice (the CPU twin's address space). GPU backends refuse it
    /// ([`Error::HostMemory`](crate::Error::HostMemory)).
    pub fn host<T: Plain>(s: &'a mut [T]) -> Self {
        RawMut { addr: s.as_mut_ptr() as u64, len: s.len(), dtype: T::DTYPE, host: true, _borrow: PhantomData }
    }
    /// Whether the view was built from a host slice ([`RawMut::host`]).
    pub const fn is_host(&self) -> bool {
        self.host
    }
    /// Start address.
    pub const fn addr(&self) -> u64 {
        self.addr
    }
    /// Number of elements.
    pub const fn len(&self) -> usize {
        self.len
    }
    /// Whether the view has no elements.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Element type.
    pub const fn dtype(&self) -> DType {
        self.dtype
    }
    /// Length in bytes, saturating at `usize::MAX` for a length whose bytes do not fit
    /// (validation refuses such a view with `SizeOverflow`; what reads its size first, such as
    /// a route lookup, must not overflow).
    pub const fn bytes(&self) -> usize {
        self.len.saturating_mul(self.dtype.size())
    }
    /// The same memory, read-only.
    pub fn as_ref(&self) -> RawRef<'_> {
        RawRef { addr: self.addr, len: self.len, dtype: self.dtype, host: self.host, _borrow: PhantomData }
    }
}

/// Where a collective reads and writes.
///
/// In place follows NCCL: for `all_gather` the buffer holds `world * n` elements and this rank's
/// contribution is already at shard `rank`; for `reduce_scatter` the buffer holds the full
/// `world * n` input and the result lands in shard `rank`; for `all_reduce` the buffer is
/// overwritten with the result.
#[derive(Debug)]
pub enum Io<'a> {
    /// One buffer is both input and output.
    InPlace(RawMut<'a>),
    /// Separate, non-overlapping input and output.
    OutOfPlace { input: RawRef<'a>, output: RawMut<'a> },
}

impl<'a> Io<'a> {
    /// Out of place, from typed host slices.
    pub fn host<T: Plain>(input: &'a [T], output: &'a mut [T]) -> Self {
        Io::OutOfPlace { input: RawRef::host(input), output: RawMut::host(output) }
    }
    /// In place, on a typed host slice.
    pub fn host_in_place<T: Plain>(buf: &'a mut [T]) -> Self {
        Io::InPlace(RawMut::host(buf))
    }
    /// The name of a view built from a host slice (`buffer`, `input` or `output`), if any: what
    /// a backend that reads device memory refuses ([`Io::refuse_host_views`]).
    pub fn host_view(&self) -> Option<&'static str> {
        match self {
            Io::InPlace(b) => b.is_host().then_some("buffer"),
            Io::OutOfPlace { input, output } => {
                if input.is_host() {
                    Some("input")
                } else {
                    output.is_host().then_some("output")
                }
            }
        }
    }
    /// `Err(Error::HostMemory)` when a view of this call of `op` was built from a host slice:
    /// what a backend whose kernels read device memory checks before any work.
    pub fn refuse_host_views(&self, op: crate::Op) -> Result<(), crate::Error> {
        match self.host_view() {
            Some(argument) => Err(crate::Error::HostMemory { op, argument }),
            None => Ok(()),
        }
    }
}
