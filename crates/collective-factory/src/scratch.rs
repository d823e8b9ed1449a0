//! The hierarchical route's scratch row: where a reduce_scatter stages its node partials
//! between its two steps (the node's IPC reduce_scatter_many writes it, the transport across
//! nodes reads it). One row per handle, reused by every call.
//!
//! Reuse is safe on a host (calls are synchronous) and, on a GPU, by the same rule as the
//! transport's workspace ([`detcoll_protocol::Workspace`]): a call on another stream than the
//! previous one first waits for the event recorded after the row's last use, and growth waits
//! (bounded) for that use before freeing. The row is reserved at construction so that graph
//! capture, which cannot allocate, finds it.
use collective_core::Error;
use detcoll_protocol::{Device, RawStream, Workspace};
use std::sync::Mutex;
use std::time::Duration;

/// The stream of the call in progress, as the caller gave it: the backends' safe stream type
/// or a raw handle (the raw entry points).
#[derive(Debug)]
pub enum CallStream<'a, S: ?Sized> {
    /// A `Collective::Stream`.
    Safe(&'a S),
    /// A raw `CUstream` / `hipStream_t`.
    Raw(RawStream),
}

impl<S: ?Sized> Clone for CallStream<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: ?Sized> Copy for CallStream<'_, S> {}

/// Memory the hierarchical reduce_scatter stages in (see the module docs).
pub trait Scratch<S: ?Sized>: Send + Sync + std::fmt::Debug {
    /// The address of at least `bytes` bytes that work enqueued next on `stream` may use.
    fn acquire(&self, bytes: usize, stream: CallStream<'_, S>) -> Result<u64, Error>;
    /// The work just enqueued on `stream` is the row's last use.
    fn release(&self, stream: CallStream<'_, S>) -> Result<(), Error>;
}

/// [`Scratch`] in host memory (the CPU platform, whose calls are synchronous).
#[derive(Debug, Default)]
pub struct HostScratch(Mutex<Vec<u64>>);

impl<S: ?Sized> Scratch<S> for HostScratch {
    fn acquire(&self, bytes: usize, _: CallStream<'_, S>) -> Result<u64, Error> {
        let mut v = self.0.lock().map_err(|_| Error::Poisoned { cause: "a thread panicked in a call".into() })?;
        let words = bytes.div_ceil(8).max(1);
        if v.len() < words {
            v.resize(words, 0);
        }
        Ok(v.as_mut_ptr() as u64)
    }
    fn release(&self, _: CallStream<'_, S>) -> Result<(), Error> {
        Ok(())
    }
}

/// [`Scratch`] in device memory, stream-safe (see the module docs).
#[derive(Debug)]
pub struct DeviceScratch<D: Device> {
    device: D,
    row: Mutex<Workspace<D>>,
    /// The bound on a wait for the row's last use (growth, drop).
    timeout: Duration,
}

impl<D: Device> DeviceScratch<D> {
    /// A row on `device`, `reserve` bytes allocated now (what a call of the handle's capacity
    /// needs, so that captured calls up to it find the row).
    pub fn new(device: D, reserve: usize, timeout: Duration) -> Result<Self, Error> {
        device.bind()?;
        let mut row = Workspace::new(&device, "hierarchical route")?;
        if reserve > 0 {
            row.reserve(&device, reserve, timeout)?;
        }
        Ok(DeviceScratch { device, row: Mutex::new(row), timeout })
    }

    /// Bytes allocated now.
    pub fn retained(&self) -> usize {
        self.row.lock().map(|r| r.retained()).unwrap_or(0)
    }

    fn raw(&self, stream: CallStream<'_, D::Stream>) -> Result<RawStream, Error> {
        match stream {
            CallStream::Safe(s) => self.device.raw_stream(s),
            CallStream::Raw(r) => Ok(r),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Workspace<D>>, Error> {
        self.row.lock().map_err(|_| Error::Poisoned { cause: "a thread panicked in a call".into() })
    }
}

impl<D: Device> Scratch<D::Stream> for DeviceScratch<D> {
    fn acquire(&self, bytes: usize, stream: CallStream<'_, D::Stream>) -> Result<u64, Error> {
        let raw = self.raw(stream)?;
        self.device.bind()?;
        // SAFETY: `raw` is the call's stream, checked to belong to this device (safe streams)
        // or vouched for by the raw entry point's caller.
        unsafe { self.lock()?.acquire(&self.device, bytes, raw, self.timeout) }
    }
    fn release(&self, stream: CallStream<'_, D::Stream>) -> Result<(), Error> {
        let raw = self.raw(stream)?;
        // SAFETY: as in `acquire`.
        unsafe { self.lock()?.release(&self.device, raw) }
    }
}

impl<D: Device> Drop for DeviceScratch<D> {
    fn drop(&mut self) {
        if let Ok(row) = self.row.get_mut() {
            // Frees once the last use completed; leaks the row if that cannot be shown in time.
            let _ = self.device.bind();
            let _ = row.free(&self.device, self.timeout);
        }
    }
}
