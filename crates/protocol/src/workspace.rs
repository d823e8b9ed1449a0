//! A lazily grown device workspace reused by every call of a handle, on whatever stream the
//! call comes: the NCCL/RCCL transport's gathers land in one, the hierarchical route stages its
//! node partials in another.
//!
//! One plain allocation (`cuMemAlloc`/`hipMalloc`, not a stream-ordered pool), grown to what a
//! call needs, kept between calls (its size is reported as retained memory). It lives under
//! its owner's lock, and two hazards are handled here:
//!
//! * **Reuse across streams.** Calls on one stream are ordered by the stream. When a call
//!   comes on another stream than the previous one, that stream first waits for an event
//!   recorded after the previous call's last use of the workspace.
//! * **Growth.** The old allocation may still be read by enqueued work: growing waits
//!   (bounded) for that event before freeing it. This is a host wait, once per new maximum
//!   size; [`Workspace::reserve`] does it ahead of time (the transport's
//!   `reserve_workspace`; graph capture cannot allocate).
use crate::device::{Device, RawStream};
use collective_core::Error;
use std::time::{Duration, Instant};

/// Allocation granularity: sizes round up to it, so a slowly growing size does not free and
/// allocate on every call.
pub const GRANULE: usize = 1 << 20;

#[derive(Debug)]
pub struct Workspace<D: Device> {
    alloc: Option<D::Allocation>,
    bytes: usize,
    /// Recorded after the last use, on that call's stream.
    done: D::Event,
    /// Key of the stream `done` was last recorded on; `None` when nothing is pending.
    last: Option<usize>,
    /// Who owns it, for the timeout error (`Error::Backend`'s backend).
    owner: &'static str,
}

impl<D: Device> Workspace<D> {
    /// An empty workspace of `dev`; `owner` names its user in a timeout error.
    pub fn new(dev: &D, owner: &'static str) -> Result<Self, Error> {
        Ok(Workspace { alloc: None, bytes: 0, done: dev.event()?, last: None, owner })
    }

    /// Bytes currently allocated.
    pub fn retained(&self) -> usize {
        self.bytes
    }

    /// Waits (polling, at most `timeout`) until every use enqueued so far has completed.
    pub fn wait_idle(&mut self, dev: &D, timeout: Duration) -> Result<(), Error> {
        if self.last.is_none() {
            return Ok(());
        }
        let start = Instant::now();
        while !dev.event_done(&self.done)? {
            if start.elapsed() >= timeout {
                return Err(Error::Backend {
                    backend: self.owner,
                    detail: format!("timed out after {timeout:?} waiting for the workspace's last use"),
                });
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
    pub fn reserve(&mut self, dev: &D, bytes: usize, timeout: Duration) -> Result<(), Error> {
        if bytes <= self.bytes && self.alloc.is_some() {
            return Ok(());
        }
        self.wait_idle(dev, timeout)?;
        self.grow(dev, bytes)
    }

    /// The base address of at least `bytes` bytes, usable by work enqueued next on `stream`.
    ///
    /// While `stream` is being captured into a graph nothing is allocated (capture cannot
    /// allocate: a call that needs more than is reserved is a typed error, before any work)
    /// and no dependency is made on uncaptured work (an eager event cannot join a capture;
    /// a graph's replays are ordered by the caller, as for any captured work).
    ///
    /// # Safety
    /// `stream` is a live stream of `dev`.
    pub unsafe fn acquire(
        &mut self,
        dev: &D,
        bytes: usize,
        stream: RawStream,
        timeout: Duration,
    ) -> Result<u64, Error> {
        let grow = bytes > self.bytes || self.alloc.is_none();
        let switch = self.last.is_some_and(|k| k != stream.key());
        // SAFETY: `stream` is live (caller).
        if (grow || switch) && unsafe { dev.is_capturing(stream) }? {
            if grow {
                return Err(Error::InvalidConfig {
                    detail: format!(
                        "{}: a call needs a workspace of {bytes} bytes ({} reserved), which cannot be allocated while its stream is captured into a graph; make the call once before capturing",
                        self.owner, self.bytes
                    ),
                });
            }
        } else if grow {
            self.reserve(dev, bytes, timeout)?;
        } else if switch {
            // SAFETY: `stream` is live (caller); the event belongs to `dev`.
            unsafe { dev.wait_event(stream, &self.done)? };
        }
        let alloc = self.alloc.as_ref().ok_or(Error::Closed)?;
        Ok(dev.address(alloc))
    }

    /// Records that the work just enqueued on `stream` is the workspace's last use (nothing
    /// while `stream` is being captured: captured work has not run, and the event keeps
    /// marking the latest eager use).
    ///
    /// # Safety
    /// `stream` is a live stream of `dev`.
    pub unsafe fn release(&mut self, dev: &D, stream: RawStream) -> Result<(), Error> {
        // SAFETY: as above.
        if unsafe { dev.is_capturing(stream) }? {
            return Ok(());
        }
        // SAFETY: as above.
        unsafe { dev.record(&self.done, stream)? };
        self.last = Some(stream.key());
        Ok(())
    }

    /// Frees the allocation once idle (bounded); leaks it when it cannot be proven idle.
    pub fn free(&mut self, dev: &D, timeout: Duration) -> Result<(), Error> {
        let idle = self.wait_idle(dev, timeout);
        if let Some(a) = self.alloc.take()
            && idle.is_err()
        {
            dev.leak(a);
        }
        self.bytes = 0;
        idle
    }
}
