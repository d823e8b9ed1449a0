//! The lazily grown device workspace the gathers land in.
//!
//! One plain allocation (`cuMemAlloc`/`hipMalloc`, not a stream-ordered pool), grown to what a
//! call needs, kept between calls (its size is reported as retained memory). It lives under
//! the collective's lock, and two hazards are handled here:
//!
//! * **Reuse across streams.** Calls on one stream are ordered by the stream. When a call
//!   comes on another stream than the previous one, that stream first waits for an event
//!   recorded after the previous call's last use of the workspace.
//! * **Growth.** The old allocation may still be read by enqueued work: growing waits
//!   (bounded) for that event before freeing it. This is a host wait, once per new maximum
//!   size; [`crate::TransportCollective::reserve_workspace`] does it ahead of time.
use crate::device::{Device, RawStream};
use crate::error::NcclError;
use collective_core::Error;
use std::time::{Duration, Instant};

/// Allocation granularity: sizes round up to it, so a slowly growing size does not free and
/// allocate on every call.
pub(crate) const GRANULE: usize = 1 << 20;

#[derive(Debug)]
pub(crate) struct Workspace<D: Device> {
    alloc: Option<D::Allocation>,
    bytes: usize,
    /// Recorded after the last use, on that call's stream.
    done: D::Event,
    /// Key of the stream `done` was last recorded on; `None` when nothing is pending.
    last: Option<usize>,
}

impl<D: Device> Workspace<D> {
    pub(crate) fn new(dev: &D) -> Result<Self, Error> {
        Ok(Workspace { alloc: None, bytes: 0, done: dev.event()?, last: None })
    }

    /// Bytes currently allocated.
    pub(crate) fn retained(&self) -> usize {
        self.bytes
    }

    /// Waits (polling, at most `timeout`) until every use enqueued so far has completed.
    pub(crate) fn wait_idle(&mut self, dev: &D, timeout: Duration) -> Result<(), Error> {
        if self.last.is_none() {
            return Ok(());
        }
        let start = Instant::now();
        while !dev.event_done(&self.done)? {
            if start.elapsed() >= timeout {
                return Err(NcclError::Timeout { call: "waiting for the workspace's last use", waited: timeout }.into());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        self.last = None;
        Ok(())
    }

    /// Ensures at least `bytes` bytes without waiting for pending work (for growth the caller
    /// has made idle).
    fn grow(&mut self, dev: &D, bytes: usize) -> Result<(), Error> {
        let size = bytes.checked_next_multiple_of(GRANULE).unwrap_or(bytes);
        self.alloc = None;
        self.bytes = 0;
        self.alloc = Some(dev.alloc(size)?);
        self.bytes = size;
        Ok(())
    }

    /// Grows to at least `bytes` now (bounded wait for pending users).
    pub(crate) fn reserve(&mut self, dev: &D, bytes: usize, timeout: Duration) -> Result<(), Error> {
        if bytes <= self.bytes && self.alloc.is_some() {
            return Ok(());
        }
        self.wait_idle(dev, timeout)?;
        self.grow(dev, bytes)
    }

    /// The base address of at least `bytes` bytes, usable by work enqueued next on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of `dev`.
    pub(crate) unsafe fn acquire(
        &mut self,
        dev: &D,
        bytes: usize,
        stream: RawStream,
        timeout: Duration,
    ) -> Result<u64, Error> {
        if bytes > self.bytes || self.alloc.is_none() {
            self.reserve(dev, bytes, timeout)?;
        } else if self.last.is_some_and(|k| k != stream.key()) {
            // SAFETY: `stream` is live (caller); the event belongs to `dev`.
            unsafe { dev.wait_event(stream, &self.done)? };
        }
        let alloc = self.alloc.as_ref().ok_or(Error::Closed)?;
        Ok(dev.address(alloc))
    }

    /// Records that the work just enqueued on `stream` is the workspace's last use.
    ///
    /// # Safety
    /// `stream` is a live stream of `dev`.
    pub(crate) unsafe fn release(&mut self, dev: &D, stream: RawStream) -> Result<(), Error> {
        // SAFETY: as above.
        unsafe { dev.record(&self.done, stream)? };
        self.last = Some(stream.key());
        Ok(())
    }

    /// Frees the allocation once idle (bounded); leaks it when it cannot be proven idle.
    pub(crate) fn free(&mut self, dev: &D, timeout: Duration) -> Result<(), Error> {
        let idle = self.wait_idle(dev, timeout);
        if let Some(a) = self.alloc.take() {
            if idle.is_err() {
                dev.leak(a);
            }
        }
        self.bytes = 0;
        idle
    }
}
