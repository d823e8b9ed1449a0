//! [`StagedTransport`]: the host transport for device memory — copy a call's device bytes to
//! the host, run [`HostTransport`], copy the result back.
//!
//! Why it exists: NCCL/RCCL refuse two ranks on one GPU, so ranks that share a GPU (virtual
//! nodes on one GPU, 16 ranks on 8 GPUs) need another transport across nodes or for the flat
//! route. Staging through the host is slow (two copies and a star through rank 0 per call)
//! but needs nothing from the GPU runtime beyond stream-ordered host copies
//! ([`Device::copy_to_host`], [`Device::copy_from_host`]), and its reductions are
//! `fixed-tree`'s, so its bits are every other route's.
//!
//! Every call is synchronous with respect to its stream: it waits for the work already on the
//! stream (which produced the inputs), and returns once the output has landed on the device.
//! So it cannot be captured into a graph (a captured stream runs nothing now): a capturing
//! stream is refused before any work.
use crate::HostTransport;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Call, Capabilities, Collective, Error, Io, Op, RawMut, RawRef, Route, validate, validate_many};
use detcoll_protocol::{Device, RawStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The host transport run on the device memory of `D` (see the module doc).
///
/// One call at a time per handle, in the same order on every rank (the host transport's
/// rule): a lock is held for a whole call, device stages included, so two threads of one rank
/// cannot interleave their copies and exchanges.
///
/// Host buffers are allocated per call (8-byte aligned `Vec<u64>`), not kept in a reusable
/// pair: the host transport already allocates several times the payload per call (its
/// contribution and every rank's gathered row), so reuse would save a small share of the
/// allocations, while a kept pair would pin the largest call's size for the handle's life.
#[derive(Debug)]
pub struct StagedTransport<D: Device> {
    device: D,
    host: HostTransport,
    /// Held for a whole call (device stages and host call), so calls of one handle never
    /// interleave.
    calls: Mutex<()>,
    /// The first failure of a device stage (the ranks' exchanges may be out of step after it:
    /// this rank may have skipped one). Apart from `calls`, so reading it does not wait for a
    /// call in progress.
    failure: Mutex<Option<String>>,
    closed: AtomicBool,
}

/// Where one lane's bytes sit on the device and on the host.
struct Lane {
    call: Call,
    /// The device range copied to the host: in place the whole buffer (the host call reads and
    /// writes it in place), out of place the input.
    from: u64,
    /// Elements of `from`.
    from_len: usize,
    /// The host copy of `from`.
    input: Vec<u64>,
    /// Out of place: the host output (`call.count_out` elements).
    output: Option<Vec<u64>>,
}

/// 8-byte aligned host memory of at least `bytes` bytes (one word at least: never dangling).
fn host_buf(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8).max(1)]
}

fn panicked() -> Error {
    Error::Poisoned { cause: "a thread panicked inside a call of this handle".into() }
}

fn bytes_of(op: Op, argument: &'static str, len: usize, size: usize) -> Result<usize, Error> {
    len.checked_mul(size).ok_or(Error::SizeOverflow { op, argument, len })
}

impl Lane {
    /// The host side of a validated call: host buffers allocated, nothing copied yet.
    fn new(call: Call) -> Result<Lane, Error> {
        let size = call.dtype.size();
        let (from, from_len) = if call.in_place {
            // The whole buffer: all_gather's is its output, reduce_scatter's its input.
            match call.op {
                Op::AllGather => (call.dst, call.count_out),
                Op::ReduceScatter | Op::ReduceScatterMany => (call.src, call.count_in),
                Op::AllReduce => (call.dst, call.count_in),
            }
        } else {
            (call.src, call.count_in)
        };
        let input = host_buf(bytes_of(call.op, "input", from_len, size)?);
        let output = (!call.in_place).then(|| bytes_of(call.op, "output", call.count_out, size).map(host_buf));
        Ok(Lane { call, from, from_len, input, output: output.transpose()? })
    }

    fn staged_bytes(&self) -> usize {
        // Cannot overflow: checked in `new`.
        self.from_len * self.call.dtype.size()
    }

    /// The host call's view of this lane's host buffers.
    fn io(&mut self) -> Io<'_> {
        let (dtype, input) = (self.call.dtype, self.input.as_mut_ptr() as u64);
        match self.output.as_mut() {
            // SAFETY: `input` holds `from_len` elements (`new`), borrowed with `self`.
            None => Io::InPlace(unsafe { RawMut::from_raw(input, self.from_len, dtype) }),
            // SAFETY: both buffers hold the elements given (`new`), borrowed with `self`.
            Some(out) => unsafe {
                Io::OutOfPlace {
                    input: RawRef::from_raw(input, self.call.count_in, dtype),
                    output: RawMut::from_raw(out.as_mut_ptr() as u64, self.call.count_out, dtype),
                }
            },
        }
    }

    /// The host bytes the call wrote, which go back to `call.dst`: out of place the output;
    /// in place the part of the buffer the op writes (reduce_scatter's shard, else all of it),
    /// so the rest of the caller's buffer is not rewritten.
    fn written(&self) -> *const u8 {
        match &self.output {
            Some(out) => out.as_ptr().cast(),
            // In place `call.dst` lies inside `[from, from + staged_bytes)` (validated), at
            // `rank * shard` bytes for reduce_scatter and 0 otherwise.
            None => self.input.as_ptr().cast::<u8>().wrapping_add((self.call.dst - self.from) as usize),
        }
    }
}

impl<D: Device> StagedTransport<D> {
    /// The transport of this rank of `boot` on `device` (every rank builds it; nothing is
    /// exchanged until the first call).
    pub fn new(device: D, boot: Arc<dyn Bootstrap>) -> Result<Self, Error> {
        let host = HostTransport::new(boot)?;
        Ok(StagedTransport {
            device,
            host,
            calls: Mutex::new(()),
            failure: Mutex::new(None),
            closed: AtomicBool::new(false),
        })
    }

    /// The device whose memory the calls read and write.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The most bytes one rank may contribute to a call (the host transport's bound).
    fn capacity(&self) -> usize {
        self.host.capabilities().max_call_bytes
    }

    /// Runs one call of this handle: refused after close and once poisoned; a failure of a
    /// device stage poisons (this rank may have skipped an exchange its peers make), a failure
    /// of the host call poisons the host transport itself (see [`Collective::check`]).
    ///
    /// Every call is signed with `part` (`Collective::call_as_part`,
    /// `Collective::reduce_scatter_many_as_part`; 0: a call of its own), whatever its lanes.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn one_call(&self, stream: RawStream, lanes: &mut [Lane], part: u32) -> Result<(), Error> {
        let _call = self.calls.lock().map_err(|_| panicked())?;
        // Again under the lock: a call that ran meanwhile may have failed, or close come.
        self.check_open()?;
        // SAFETY: forwarded from the caller.
        if unsafe { self.device.is_capturing(stream) }? {
            return Err(Error::InvalidConfig {
                detail: "the host-staged transport cannot be captured into a graph: every call waits on the host \
                         for its stream and copies through host memory; call it outside the capture"
                    .into(),
            });
        }
        let mut host_failed = false;
        // SAFETY: forwarded from the caller; the lanes hold validated views and their host
        // buffers.
        let r = unsafe { self.staged(stream, lanes, part, &mut host_failed) };
        if let Err(e) = &r
            && !host_failed
        {
            let mut failure = self.failure.lock().map_err(|_| panicked())?;
            let cause =
                failure.get_or_insert_with(|| format!("a device stage of the host-staged transport failed: {e}"));
            // This rank makes no further exchange: its peers must not wait for one.
            self.host.abandon(cause);
        }
        r
    }

    /// The stages of one call; `host_failed` says whether an error came from the host call.
    ///
    /// # Safety
    /// As [`StagedTransport::one_call`].
    unsafe fn staged(
        &self,
        stream: RawStream,
        lanes: &mut [Lane],
        part: u32,
        host_failed: &mut bool,
    ) -> Result<(), Error> {
        let dev = &self.device;
        dev.bind()?;
        // Every device call below: `stream` is live (caller); device ranges are the validated
        // views of this call; host ranges are the lanes' buffers, which outlive the stream
        // synchronisation that follows every enqueue.
        // SAFETY: see above. The inputs were produced by work enqueued on the stream: wait.
        unsafe { dev.synchronize_stream(stream) }?;
        for l in lanes.iter_mut() {
            let bytes = l.staged_bytes();
            if bytes > 0 {
                // SAFETY: see above; `input` holds `bytes` bytes.
                unsafe { dev.copy_to_host(l.input.as_mut_ptr().cast(), l.from, bytes, stream) }?;
            }
        }
        // SAFETY: see above. A copy may return before its DMA lands: wait before reading.
        unsafe { dev.synchronize_stream(stream) }?;
        // Every form is signed with `part`: the front door numbers every call, refused or made,
        // through it, so ranks one refused call apart fail with `SignatureMismatch` instead of
        // pairing their calls (which returned `Ok` with another call's sums).
        let r = if let [l] = lanes {
            let op = l.call.op;
            self.host.call_as_part(op, l.io(), part, &())
        } else {
            // No lane or several: a reduce_scatter_many, its lanes' split joined with `part`.
            let ios: Vec<Io<'_>> = lanes.iter_mut().map(Lane::io).collect();
            self.host.reduce_scatter_many_as_part(&ios, part, &())
        };
        if let Err(e) = r {
            // The device output is untouched: nothing is copied back.
            *host_failed = true;
            return Err(e);
        }
        for l in lanes.iter() {
            let bytes = l.call.bytes_out();
            if bytes > 0 {
                // SAFETY: see above; `written` points at `bytes` bytes of the lane's buffers.
                unsafe { dev.copy_from_host(l.call.dst, l.written(), bytes, stream) }?;
            }
        }
        // SAFETY: see above. The host buffers are freed after this returns, so the copies must
        // have read them; and the output is ready when the call returns.
        unsafe { dev.synchronize_stream(stream) }
    }

    /// Runs one single-lane call on a raw stream: validated first (a typed error writes
    /// nothing and touches the device not at all), then the stream's work waited for, the
    /// call's device bytes copied to the host, the host transport run, the output copied back
    /// and waited for: the output is ready when this returns `Ok`. A failed host call leaves
    /// the device output untouched. In place, the whole buffer is staged; only the part the op
    /// writes is copied back.
    ///
    /// # Safety
    /// `stream` is a live stream of this transport's device, and the views in `io` are device
    /// memory of that device, valid and otherwise untouched until this returns.
    pub unsafe fn enqueue(&self, op: Op, io: Io<'_>, stream: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_as_part(op, io, 0, stream) }
    }

    /// [`StagedTransport::enqueue`] signed with `part` (see `Collective::call_as_part`): the
    /// host transport carries it in the call's signature.
    ///
    /// # Safety
    /// As [`StagedTransport::enqueue`].
    pub unsafe fn enqueue_as_part(&self, op: Op, io: Io<'_>, part: u32, stream: RawStream) -> Result<(), Error> {
        self.check_open()?;
        let call = validate(op, &io, self.host.rank(), self.host.world_size(), self.capacity())?;
        let mut lanes = [Lane::new(call)?];
        // SAFETY: forwarded from the caller.
        unsafe { self.one_call(stream, &mut lanes, part) }
    }

    /// Runs a `reduce_scatter_many` on a raw stream: every lane validated first, then every
    /// lane staged and reduced in one host call (one exchange), then every lane's output
    /// copied back. As [`StagedTransport::enqueue`] otherwise.
    ///
    /// # Safety
    /// As [`StagedTransport::enqueue`], for every lane.
    pub unsafe fn enqueue_many(&self, lanes: &[Io<'_>], stream: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_many_as_part(lanes, 0, stream) }
    }

    /// [`StagedTransport::enqueue_many`] signed with `part` too (see
    /// `Collective::reduce_scatter_many_as_part`).
    ///
    /// # Safety
    /// As [`StagedTransport::enqueue_many`].
    pub unsafe fn enqueue_many_as_part(&self, lanes: &[Io<'_>], part: u32, stream: RawStream) -> Result<(), Error> {
        self.check_open()?;
        let (calls, _) = validate_many(lanes, self.host.rank(), self.host.world_size(), self.capacity())?;
        // One lane goes to the host as a reduce_scatter_many too (`call.op`, its signature).
        let mut staged = calls.iter().map(|l| Lane::new(l.call)).collect::<Result<Vec<_>, _>>()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.one_call(stream, &mut staged, part) }
    }

    /// `Closed` after close, the recorded cause once poisoned, the host transport's state.
    fn check_open(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let failure = self.failure.lock().map_err(|_| panicked())?;
        if let Some(cause) = failure.as_ref() {
            return Err(Error::Poisoned { cause: cause.clone() });
        }
        drop(failure);
        self.host.check()
    }
}

impl<D: Device> Collective for StagedTransport<D> {
    type Stream = D::Stream;

    fn rank(&self) -> usize {
        self.host.rank()
    }
    fn world_size(&self) -> usize {
        self.host.world_size()
    }
    /// Strict, the host transport's capacity; no graph capture (every call waits on the host).
    fn capabilities(&self) -> Capabilities {
        Capabilities::strict(self.capacity(), false)
    }
    fn route(&self, _op: Op, _bytes: usize) -> Route {
        Route::Transport
    }
    fn host_memory(&self) -> bool {
        D::VENDOR == detcoll_protocol::Vendor::Host
    }
    fn call(&self, op: Op, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        // Host slices (the safe `Io::host`) on device memory: refused before any work.
        self.check_address_space(op, &io)?;
        let raw = self.device.raw_stream(stream)?;
        if op == Op::ReduceScatterMany {
            // SAFETY: a live stream of this device; views from host slices were refused above,
            // the others' validity is the contract of their (unsafe) constructors.
            return unsafe { self.enqueue_many(&[io], raw) };
        }
        // SAFETY: as above.
        unsafe { self.enqueue(op, io, raw) }
    }
    fn call_as_part(&self, op: Op, io: Io<'_>, part: u32, stream: &D::Stream) -> Result<(), Error> {
        self.check_address_space(op, &io)?;
        let raw = self.device.raw_stream(stream)?;
        if op == Op::ReduceScatterMany {
            // One lane, its lane split joined with `part` (as the host transport's
            // `call_as_part` signs one): dropping `part` would let peers one call apart pair.
            // SAFETY: as in `call`.
            return unsafe { self.enqueue_many_as_part(&[io], part, raw) };
        }
        // SAFETY: as in `call`.
        unsafe { self.enqueue_as_part(op, io, part, raw) }
    }
    fn all_reduce(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.call(Op::AllReduce, io, stream)
    }
    fn all_gather(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.call(Op::AllGather, io, stream)
    }
    fn reduce_scatter(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.call(Op::ReduceScatter, io, stream)
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], stream: &D::Stream) -> Result<(), Error> {
        for io in lanes {
            self.check_address_space(Op::ReduceScatterMany, io)?;
        }
        let raw = self.device.raw_stream(stream)?;
        // SAFETY: as in `call`.
        unsafe { self.enqueue_many(lanes, raw) }
    }
    fn reduce_scatter_many_as_part(&self, lanes: &[Io<'_>], part: u32, stream: &D::Stream) -> Result<(), Error> {
        for io in lanes {
            self.check_address_space(Op::ReduceScatterMany, io)?;
        }
        let raw = self.device.raw_stream(stream)?;
        // SAFETY: as in `call`.
        unsafe { self.enqueue_many_as_part(lanes, part, raw) }
    }

    /// `Closed` after close; the first failure of a device stage; the host transport's first
    /// failure.
    fn check(&self) -> Result<(), Error> {
        self.check_open()
    }
    /// The stream's synchronisation, then [`Collective::check`]. Every call already waited for
    /// its own copies, so this waits only for work enqueued after it.
    fn synchronize(&self, stream: &D::Stream) -> Result<(), Error> {
        let raw = self.device.raw_stream(stream)?;
        self.device.bind()?;
        // SAFETY: a live stream of this device (checked by `raw_stream`).
        unsafe { self.device.synchronize_stream(raw) }?;
        self.check_open()
    }
    /// Later calls return [`Error::Closed`]; the host transport releases its bootstrap, which
    /// peers still calling see as a departed rank (where this handle held its last reference).
    fn close(&self) -> Result<(), Error> {
        // Waits for a call in progress, so close never cuts a call's copies short.
        let _call = self.calls.lock();
        self.closed.store(true, Ordering::Release);
        self.host.close()
    }
    /// Poisons the host transport with `cause`, which releases its bootstrap.
    fn abandon(&self, cause: &str) {
        self.host.abandon(cause);
    }
}
