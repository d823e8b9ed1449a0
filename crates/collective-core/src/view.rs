//! Backend-neutral views of caller memory.
//!
//! A view is an address, an element count and a dtype. Which address space the address lives
//! in (host memory for the CPU twin, device memory for the GPU twins) is the backend's business:
//! each backend offers safe constructors from its own buffer types, and these unsafe raw ones.
use crate::{DType, Plain};
use core::marker::PhantomData;

/// A read-only view of `len` elements of `dtype` at `addr`, borrowed for `'a`.
#[derive(Debug, Clone, Copy)]
pub struct RawRef<'a> {
    addr: u64,
    len: usize,
    dtype: DType,
    _borrow: PhantomData<&'a [u8]>,
}

/// A writable view of `len` elements of `dtype` at `addr`, uniquely borrowed for `'a`.
#[derive(Debug)]
pub struct RawMut<'a> {
    addr: u64,
    len: usize,
    dtype: DType,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> RawRef<'a> {
    /// A view of raw memory.
    ///
    /// # Safety
    /// `addr..addr + len * dtype.size()` must be readable memory of the backend's address space
    /// for `'a`, and nothing may write it while a collective reading it is in flight.
    pub const unsafe fn from_raw(addr: u64, len: usize, dtype: DType) -> Self {
        RawRef { addr, len, dtype, _borrow: PhantomData }
    }
    /// A view of a host slice (the CPU twin's address space).
    pub fn host<T: Plain>(s: &'a [T]) -> Self {
        RawRef { addr: s.as_ptr() as u64, len: s.len(), dtype: T::DTYPE, _borrow: PhantomData }
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
        RawMut { addr, len, dtype, _borrow: PhantomData }
    }
    /// A view of a mutable host slice (the CPU twin's address space).
    pub fn host<T: Plain>(s: &'a mut [T]) -> Self {
        RawMut { addr: s.as_mut_ptr() as u64, len: s.len(), dtype: T::DTYPE, _borrow: PhantomData }
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
        RawRef { addr: self.addr, len: self.len, dtype: self.dtype, _borrow: PhantomData }
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
}
