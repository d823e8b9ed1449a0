//! The built-in watchdog: bounds every transport call's device time, also when the caller waits
//! with its own stream synchronisation — where NCCL's kernels would otherwise spin forever on a
//! peer that died or made another call.
//!
//! * **Per call** (under the collective's lock, so one producer): two `Device::record`s of
//!   events preallocated in a fixed ring of [`SLOTS`] slots — `start` before the call's first
//!   device work, `end` after its last — and a few atomic loads and stores. No host
//!   allocation, no host synchronisation. When every slot is still pending ([`SLOTS`] tracked
//!   calls not finished on the device) the call is **not tracked** rather than waited for.
//!   An untracked call that hangs is not caught, and neither is any later call queued behind
//!   it on that stream (their `start` never completes): the protection assumes the host runs
//!   fewer than [`SLOTS`] transport calls ahead of the device.
//! * **The thread** (`ccl-watchdog-<rank>`, spawned at construction, stopped and joined at
//!   close or drop) polls the ring every 1-5 ms with `Device::event_done`. A call's clock starts
//!   when the thread first sees its `start` done, so a call queued behind long user work is
//!   not timed out; a peer that reaches the same call more than the bound later than this
//!   rank (a slow but live rank) is treated as dead, exactly as the IPC routes' device waits
//!   treat it. Once a started call's `end` is still pending past the bound, the thread
//!   aborts the communicator under the state lock (`ncclCommAbort` stops its kernels, so the
//!   caller's own stream wait returns), poisons the collective with [`NcclError::Watchdog`]
//!   naming the call, and exits: every later call returns [`Error::Poisoned`]. It also polls
//!   `ncclCommGetAsyncError` (when the lock is free), so an asynchronous error poisons
//!   promptly, and treats a failing event query (a device error) the same way.
//!
//! Locking: the ring needs no lock (the producer fills slots at `tail`, the thread retires them
//! at `head`). The thread takes the state lock only through `try_lock`, never sleeps holding
//! it, and stops waiting for it once asked to stop; close stops and joins the thread before it
//! takes the state lock. Every holder of the state lock bounds its waits, except NCCL itself
//! in blocking mode (`TransportConfig::blocking`), where a call blocked inside NCCL keeps the
//! watchdog from aborting until it returns.
use crate::comm::Communicator;
use crate::device::{Device, RawStream};
use crate::error::{BACKEND, NcclError};
use collective_core::{Error, Op};
use detcoll_protocol::Poison;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Slots of the ring: tracked calls that may be pending on the device at once.
pub const SLOTS: usize = 64;

/// What a tracked call is, for the timeout's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// One of the deterministic `Collective` operations.
    Strict(Op),
    /// A native (non-strict) NCCL reduction of [`crate::nonstrict`].
    Native(Op),
}

const NATIVE: u8 = 0x80;

impl Call {
    fn code(self) -> u8 {
        match self {
            Call::Strict(op) => op as u8,
            Call::Native(op) => op as u8 | NATIVE,
        }
    }

    fn name(code: u8) -> &'static str {
        let op = Op::ALL.into_iter().find(|o| *o as u8 == code & !NATIVE);
        match (op, code & NATIVE != 0) {
            (Some(op), false) => op.name(),
            (Some(Op::AllReduce), true) => "native all_reduce (non-strict)",
            (Some(Op::ReduceScatter), true) => "native reduce_scatter (non-strict)",
            _ => "a transport call",
        }
    }
}

#[derive(Debug)]
struct Slot<E> {
    start: E,
    end: E,
    call: AtomicU8,
    seq: AtomicU64,
}

/// The events of the tracked calls and the thread's stop flag, shared by the collective and
/// its watchdog thread.
#[derive(Debug)]
pub(crate) struct Ring<D: Device> {
    slots: Box<[Slot<D::Event>]>,
    /// Index of the oldest slot not yet retired; written by the thread only.
    head: AtomicU64,
    /// Index of the next slot to fill; written by the producer (under the state lock) only.
    tail: AtomicU64,
    bound: Duration,
    stop: AtomicBool,
}

fn at(index: u64) -> usize {
    (index % SLOTS as u64) as usize
}

/// The producer side, kept in the collective's [`State`] (so only a lock holder records).
#[derive(Debug)]
pub(crate) struct Tracking<D: Device> {
    ring: Option<Arc<Ring<D>>>,
    /// Calls made so far (tracked or not), for the timeout's message.
    calls: u64,
}

/// A tracked call between its start and end records.
#[derive(Debug)]
pub(crate) struct Ticket {
    index: u64,
    seq: u64,
}

impl<D: Device> Tracking<D> {
    /// The ring's [`SLOTS`] × 2 events when `bound` is set (created now, before any call);
    /// nothing when the watchdog is off.
    pub(crate) fn new(dev: &D, bound: Option<Duration>) -> Result<Self, Error> {
        let ring = match bound {
            None => None,
            Some(bound) => {
                let slots = (0..SLOTS)
                    .map(|_| {
                        Ok(Slot {
                            start: dev.event()?,
                            end: dev.event()?,
                            call: AtomicU8::new(0),
                            seq: AtomicU64::new(0),
                        })
                    })
                    .collect::<Result<Box<[_]>, Error>>()?;
                Some(Arc::new(Ring {
                    slots,
                    head: AtomicU64::new(0),
                    tail: AtomicU64::new(0),
                    bound,
                    stop: AtomicBool::new(false),
                }))
            }
        };
        Ok(Tracking { ring, calls: 0 })
    }

    /// The shared ring, when the watchdog is on.
    pub(crate) fn ring(&self) -> Option<&Arc<Ring<D>>> {
        self.ring.as_ref()
    }

    /// Counts a call and records its start on `stream`; `None` when the watchdog is off or
    /// every slot is still pending (the call is then not tracked: never a wait).
    ///
    /// # Safety
    /// `stream` is a live stream of `dev`.
    pub(crate) unsafe fn begin(&mut self, dev: &D, stream: RawStream) -> Result<Option<Ticket>, Error> {
        self.calls += 1;
        let Some(ring) = &self.ring else { return Ok(None) };
        let index = ring.tail.load(Ordering::Relaxed);
        if index - ring.head.load(Ordering::Acquire) >= SLOTS as u64 {
            return Ok(None);
        }
        // SAFETY: `stream` is live (caller); the slot is not in use (at or past `tail`, which
        // the thread does not read) and its events belong to `dev`.
        unsafe { dev.record(&ring.slots[at(index)].start, stream)? };
        Ok(Some(Ticket { index, seq: self.calls }))
    }

    /// Records the end of the call `ticket` on `stream` and hands it to the thread.
    ///
    /// # Safety
    /// As [`Tracking::begin`], on the stream `ticket` was begun on.
    pub(crate) unsafe fn end(
        &mut self,
        ticket: Option<Ticket>,
        dev: &D,
        stream: RawStream,
        call: Call,
    ) -> Result<(), Error> {
        let (Some(ring), Some(t)) = (&self.ring, ticket) else { return Ok(()) };
        let slot = &ring.slots[at(t.index)];
        // SAFETY: as in `begin`.
        unsafe { dev.record(&slot.end, stream)? };
        slot.call.store(call.code(), Ordering::Relaxed);
        slot.seq.store(t.seq, Ordering::Relaxed);
        ring.tail.store(t.index + 1, Ordering::Release);
        Ok(())
    }
}

/// What the watchdog needs from the state the collective's lock protects (the collective's
/// `State`): its communicator, and recording a failure that aborts it.
pub(crate) trait Watched: Send + 'static {
    /// The communicator, polled for asynchronous errors while the lock is free.
    fn comm(&self) -> &Communicator;
    /// Records `e` (poisoning) and aborts the communicator.
    fn fail(&mut self, poison: &Poison, e: Error) -> Error;
}

/// The running watchdog thread of one collective.
#[derive(Debug)]
pub(crate) struct WatchdogThread<D: Device> {
    ring: Arc<Ring<D>>,
    thread: JoinHandle<()>,
}

impl<D: Device> WatchdogThread<D> {
    /// Starts the thread watching `ring`'s calls.
    pub(crate) fn spawn<S: Watched>(
        rank: usize,
        ring: &Arc<Ring<D>>,
        device: Arc<D>,
        state: Arc<Mutex<S>>,
        poison: Arc<Poison>,
    ) -> Result<Self, Error> {
        let interval = (ring.bound / 20).clamp(Duration::from_millis(1), Duration::from_millis(5));
        let watcher =
            Watcher { ring: ring.clone(), device, state, poison, interval, seen: [None; SLOTS], done: [false; SLOTS] };
        let spawned = std::thread::Builder::new().name(format!("ccl-watchdog-{rank}")).spawn(move || watcher.run());
        let thread = spawned.map_err(|e| Error::Backend {
            backend: BACKEND,
            detail: format!("spawning the transport watchdog: {e}"),
        })?;
        Ok(WatchdogThread { ring: ring.clone(), thread })
    }

    /// Stops the thread and joins it (promptly: it never waits unboundedly once asked to stop).
    pub(crate) fn stop(self) {
        self.ring.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }

    /// Whether the thread has exited (tests).
    #[cfg(test)]
    pub(crate) fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// The thread's side.
struct Watcher<D: Device, S> {
    ring: Arc<Ring<D>>,
    device: Arc<D>,
    state: Arc<Mutex<S>>,
    poison: Arc<Poison>,
    interval: Duration,
    /// When the thread first saw each pending slot's `start` done.
    seen: [Option<Instant>; SLOTS],
    /// Pending slots whose `end` was seen done (retired once every older slot is too).
    done: [bool; SLOTS],
}

impl<D: Device, S: Watched> Watcher<D, S> {
    fn run(mut self) {
        // The device's event queries bind it themselves (CUDA); this covers NCCL's abort.
        let _ = self.device.bind();
        while !self.ring.stop.load(Ordering::Acquire) && !self.poison.is_poisoned() {
            if let Err(e) = self.scan().and_then(|()| self.poll_comm()) {
                self.trip(e);
                return;
            }
            std::thread::park_timeout(self.interval);
        }
    }

    /// One pass over the pending slots: retires finished calls, starts the clocks of calls
    /// seen started, and fails with the timeout of a started call past the bound.
    fn scan(&mut self) -> Result<(), Error> {
        let ring = &*self.ring;
        let tail = ring.tail.load(Ordering::Acquire);
        let mut head = ring.head.load(Ordering::Relaxed);
        for index in head..tail {
            let i = at(index);
            if self.done[i] {
                continue;
            }
            let slot = &ring.slots[i];
            if self.device.event_done(&slot.end)? {
                self.done[i] = true;
            } else if let Some(started) = self.seen[i] {
                if started.elapsed() > ring.bound {
                    let call = Call::name(slot.call.load(Ordering::Relaxed));
                    let seq = slot.seq.load(Ordering::Relaxed);
                    return Err(NcclError::Watchdog { call, seq, bound: ring.bound }.into());
                }
            } else if self.device.event_done(&slot.start)? {
                self.seen[i] = Some(Instant::now());
            }
        }
        while head < tail && self.done[at(head)] {
            self.done[at(head)] = false;
            self.seen[at(head)] = None;
            head += 1;
        }
        ring.head.store(head, Ordering::Release);
        Ok(())
    }

    /// One `ncclCommGetAsyncError`, when the state lock is free (a call holding it polls the
    /// communicator itself).
    fn poll_comm(&self) -> Result<(), Error> {
        match self.state.try_lock() {
            Ok(st) if st.comm().is_usable() => st.comm().async_error().map(drop).map_err(Error::from),
            _ => Ok(()),
        }
    }

    /// Aborts the communicator and poisons the collective with `e` (under the state lock,
    /// waited for without blocking: given up when stopped, close then aborts a poisoned
    /// communicator itself).
    fn trip(&self, e: Error) {
        let e = if e.poisons() {
            e
        } else {
            Error::Backend { backend: BACKEND, detail: format!("transport watchdog: {e}") }
        };
        loop {
            let mut st = match self.state.try_lock() {
                Ok(st) => st,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) if self.ring.stop.load(Ordering::Acquire) => {
                    self.poison.record(e);
                    return;
                }
                Err(TryLockError::WouldBlock) => {
                    std::thread::park_timeout(self.interval);
                    continue;
                }
            };
            st.fail(&self.poison, e);
            return;
        }
    }
}

#[cfg(test)]
mod tests;
