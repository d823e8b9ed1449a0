//! [`HostTransport`]: one `all_gather_bytes` of the bootstrap per call, then `fixed-tree`.
use crate::tree::reduce_rows;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Call, Capabilities, Collective, Error, Io, Op, Route, Signature, validate, validate_many};
use std::sync::{Arc, Mutex};

/// Bytes of the signature that prefixes every contribution.
const SIG_BYTES: usize = 16;
/// The bootstrap's largest frame (rank 0 sends every contribution in one): a rank contributes
/// at most this over the world size.
const MAX_FRAME: usize = 1 << 30;

/// A transport over `boot`: host memory, synchronous calls (`Stream = ()`), one call at a time
/// per handle (the ranks' exchanges must come in the same order). See the crate docs.
#[derive(Debug)]
pub struct HostTransport {
    rank: usize,
    world: usize,
    capacity: usize,
    /// Held for a whole call, and by `close`, which so waits for a call in flight.
    calls: Mutex<()>,
    /// Held only for a moment (never across an exchange), so `abandon` and `check` never wait
    /// for a call in flight: a composed collective abandoning this handle from another thread
    /// after a failure elsewhere must not wait out this handle's exchange timeout.
    state: Mutex<State>,
}

/// What a call needs and what it may find: the rendezvous, until close or the first failure,
/// the first failure, and whether the handle was closed.
#[derive(Debug)]
struct State {
    /// The rendezvous the calls exchange over; `None` once closed or poisoned. Released then:
    /// where this handle held the last reference (the factory's groups, a bootstrap moved into
    /// the collective) its peers' exchanges with this rank fail at once (`PeerGone`) instead of
    /// waiting out the exchange timeout, as when the handle drops. A poisoned handle never
    /// exchanges again, so its peers could only wait for it in vain.
    boot: Option<Arc<dyn Bootstrap>>,
    /// The first failure's cause once poisoned.
    poisoned: Option<String>,
    closed: bool,
}

impl State {
    /// `Closed` after close, the first failure once poisoned.
    fn usable(&self) -> Result<(), Error> {
        match (&self.poisoned, self.closed) {
            (_, true) => Err(Error::Closed),
            (Some(cause), false) => Err(Error::Poisoned { cause: cause.clone() }),
            (None, false) => Ok(()),
        }
    }

    /// Records `cause` as the first failure and releases the rendezvous.
    fn poison(&mut self, cause: impl FnOnce() -> String) {
        self.poisoned.get_or_insert_with(cause);
        self.boot = None;
    }
}

/// The cause of every call of a handle a panicking call left locked.
fn panicked() -> Error {
    Error::Poisoned { cause: "a thread panicked inside a call of this handle".into() }
}

impl HostTransport {
    /// The transport of this rank of `boot` (every rank builds it; nothing is exchanged
    /// until the first call).
    pub fn new(boot: Arc<dyn Bootstrap>) -> Result<Self, Error> {
        let (rank, world) = (boot.rank(), boot.world_size());
        collective_core::check_world_size(world)?;
        let capacity = (MAX_FRAME / world).saturating_sub(SIG_BYTES + 64);
        Ok(HostTransport {
            rank,
            world,
            capacity,
            calls: Mutex::new(()),
            state: Mutex::new(State { boot: Some(boot), poisoned: None, closed: false }),
        })
    }

    /// The state, for a moment. A thread that panicked while holding it left no exchange
    /// running (it is never held across one), so the state stays usable.
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `Ok` while this handle is neither closed nor poisoned: a call checks it again after its
    /// exchange, before it writes its output, so a call that `abandon` overtook writes nothing.
    fn live(&self) -> Result<(), Error> {
        if self.calls.is_poisoned() {
            return Err(panicked());
        }
        self.state().usable()
    }

    /// Runs `body` over the rendezvous as this handle's one call: refused after close and
    /// once poisoned; poisons on a failure that leaves the ranks' exchanges out of step. A call
    /// in flight when the handle is abandoned fails as `Poisoned`, never `Ok` (its output is
    /// written only if the abandon came after its `live` check).
    fn one_call(&self, body: impl FnOnce(&dyn Bootstrap) -> Result<(), Error>) -> Result<(), Error> {
        let _call = self.calls.lock().map_err(|_| panicked())?;
        let boot = {
            let state = self.state();
            state.usable()?;
            // Released only on close or the first failure, which `usable` refused.
            let Some(boot) = state.boot.clone() else { return Err(Error::Closed) };
            boot
        };
        let r = body(&*boot);
        // This call's reference goes before the poison check: where `abandon` released the
        // handle's own meanwhile, this was the last, and peers see this rank gone at once.
        drop(boot);
        let mut state = self.state();
        // Poisoned already: only `abandon` poisons a handle while its call runs (calls and
        // `close` take the call lock). Then this call fails as abandoned, whatever its exchange
        // gave — its peer's absence or disagreement is the abandon's consequence, not news.
        let abandoned = state.usable();
        if let Err(e) = &r
            && e.poisons()
        {
            state.poison(|| e.to_string());
        }
        abandoned?;
        r
    }

    /// Every rank's contribution (`payload` is this rank's), in rank order, after checking that
    /// every rank made the same call.
    fn exchange(boot: &dyn Bootstrap, sig: Signature, payload: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        let mut mine = Vec::with_capacity(SIG_BYTES + payload.len());
        for w in sig.pack() {
            mine.extend_from_slice(&w.to_le_bytes());
        }
        mine.extend_from_slice(payload);
        let all = boot.all_gather_bytes(&mine)?;
        let mut rows = Vec::with_capacity(all.len());
        for (peer, mut row) in all.into_iter().enumerate() {
            let theirs = (row.len() >= SIG_BYTES)
                .then(|| {
                    let w = |i: usize| u64::from_le_bytes(row[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
                    Signature::unpack([w(0), w(1)])
                })
                .flatten();
            match theirs {
                Some(t) if t == sig && row.len() == mine.len() => {}
                Some(t) => return Err(Error::SignatureMismatch { peer, ours: sig, theirs: t }),
                None => {
                    return Err(Error::ConfigMismatch {
                        detail: format!("rank {peer} sent the host transport a contribution it cannot read"),
                    });
                }
            }
            row.drain(..SIG_BYTES);
            rows.push(row);
        }
        Ok(rows)
    }

    /// The signature of a single-lane call, its `split` being `part` (`Collective::call_as_part`;
    /// 0 for a plain call of its own).
    fn signature(call: &Call, part: u32) -> Signature {
        Signature { route: Route::Transport, ..call.signature() }.as_part(part)
    }

    /// One call signed with `part` (see [`HostTransport::signature`]).
    fn call_signed(&self, op: Op, io: Io<'_>, part: u32) -> Result<(), Error> {
        match op {
            Op::AllGather => self.gather(io, part),
            Op::AllReduce => {
                let call = validate(Op::AllReduce, &io, self.rank, self.world, self.capacity)?;
                self.reduce(call, 0, part)
            }
            Op::ReduceScatter => {
                let call = validate(Op::ReduceScatter, &io, self.rank, self.world, self.capacity)?;
                self.reduce(call, self.rank * call.count_out, part)
            }
            Op::ReduceScatterMany => self.many(&[io], part),
        }
    }

    /// A validated all_reduce (`at` 0) or reduce_scatter (`at`: this rank's shard): every
    /// rank's whole input, then the tree over elements `at..` into the output.
    fn reduce(&self, call: Call, at: usize, part: u32) -> Result<(), Error> {
        self.one_call(|boot| {
            // SAFETY: the validated views of this call.
            let mine = unsafe { bytes(call.src, call.bytes_in()) }.to_vec();
            let rows = Self::exchange(boot, Self::signature(&call, part), &mine)?;
            self.live()?;
            let views: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
            // SAFETY: as above; the input has been copied.
            reduce_rows(call.dtype, &views, at, unsafe { bytes_mut(call.dst, call.bytes_out()) })
        })
    }

    /// An all_gather signed with `part`: every rank's input, in rank order, into the output.
    fn gather(&self, io: Io<'_>, part: u32) -> Result<(), Error> {
        let call = validate(Op::AllGather, &io, self.rank, self.world, self.capacity)?;
        self.one_call(|boot| {
            // SAFETY: validated views of this call (here and below).
            let mine = unsafe { bytes(call.src, call.bytes_in()) }.to_vec();
            let rows = Self::exchange(boot, Self::signature(&call, part), &mine)?;
            self.live()?;
            // SAFETY: as above; the input has been copied (in place, it is this rank's chunk).
            let out = unsafe { bytes_mut(call.dst, call.bytes_out()) };
            for (chunk, row) in out.chunks_exact_mut(call.bytes_in().max(1)).zip(&rows) {
                chunk.copy_from_slice(row);
            }
            Ok(())
        })
    }

    /// A reduce_scatter_many, its lanes' split mixed with `part` (0: a call of its own): every
    /// lane's input in one exchange, then one tree per lane.
    fn many(&self, lanes: &[Io<'_>], part: u32) -> Result<(), Error> {
        let (calls, sig) = validate_many(lanes, self.rank, self.world, self.capacity)?;
        let sig = sig.as_part(part);
        self.one_call(|boot| {
            let mut mine = Vec::new();
            for l in calls.iter() {
                // SAFETY: as in `gather`.
                mine.extend_from_slice(unsafe { bytes(l.call.src, l.call.bytes_in()) });
            }
            let rows = Self::exchange(boot, Signature { route: Route::Transport, ..sig }, &mine)?;
            self.live()?;
            let mut at = 0usize;
            for l in calls.iter() {
                let c = l.call;
                let views: Vec<&[u8]> = rows.iter().map(|r| &r[at..at + c.bytes_in()]).collect();
                // SAFETY: as above; lanes do not overlap (validated).
                let out = unsafe { bytes_mut(c.dst, c.bytes_out()) };
                reduce_rows(c.dtype, &views, self.rank * c.count_out, out)?;
                at += c.bytes_in();
            }
            Ok(())
        })
    }
}

/// The `bytes` bytes at `addr` of host memory.
///
/// # Safety
/// A validated view of this call: readable for its length during the call.
unsafe fn bytes<'a>(addr: u64, bytes: usize) -> &'a [u8] {
    if bytes == 0 {
        return &[];
    }
    // SAFETY: the caller's view (validated: in bounds, no wrap).
    unsafe { std::slice::from_raw_parts(addr as *const u8, bytes) }
}

/// As [`bytes`], writable.
///
/// # Safety
/// A validated output view of this call, borrowed uniquely by it, not overlapping what the
/// call still reads.
unsafe fn bytes_mut<'a>(addr: u64, bytes: usize) -> &'a mut [u8] {
    if bytes == 0 {
        return &mut [];
    }
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, bytes) }
}

impl Collective for HostTransport {
    type Stream = ();

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn capabilities(&self) -> Capabilities {
        // Synchronous host calls: nothing to capture in a graph.
        Capabilities::strict(self.capacity, false)
    }
    fn route(&self, _op: Op, _bytes: usize) -> Route {
        if self.world == 1 { Route::Local } else { Route::Transport }
    }
    fn host_memory(&self) -> bool {
        true
    }

    fn call(&self, op: Op, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.call_signed(op, io, 0)
    }
    fn call_as_part(&self, op: Op, io: Io<'_>, part: u32, _: &()) -> Result<(), Error> {
        self.call_signed(op, io, part)
    }
    fn all_gather(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.gather(io, 0)
    }
    fn all_reduce(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.call_signed(Op::AllReduce, io, 0)
    }
    fn reduce_scatter(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.call_signed(Op::ReduceScatter, io, 0)
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], _: &()) -> Result<(), Error> {
        self.many(lanes, 0)
    }
    fn reduce_scatter_many_as_part(&self, lanes: &[Io<'_>], part: u32, _: &()) -> Result<(), Error> {
        self.many(lanes, part)
    }

    /// `Closed` after close, else the first failure's cause.
    fn check(&self) -> Result<(), Error> {
        self.live()
    }
    fn synchronize(&self, _: &()) -> Result<(), Error> {
        self.check()
    }
    /// Waits for a call in flight on another thread (bounded by the bootstrap's exchange
    /// timeout), then releases the rendezvous: later calls are `Closed`, and peers waiting on
    /// this rank see it gone once its last reference is dropped (where this handle held it:
    /// the factory's groups, a bootstrap moved into the collective).
    fn close(&self) -> Result<(), Error> {
        // A call that panicked left no exchange of this handle running: close all the same.
        let _call = self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut state = self.state();
        state.closed = true;
        let boot = state.boot.take();
        drop(state);
        drop(boot);
        Ok(())
    }
    /// Poisons the handle with `cause` and releases the rendezvous, as a failed call of its own
    /// does: a peer waiting on this rank sees it gone. Never waits for a call in flight on
    /// another thread: that call fails as `Poisoned` when its exchange ends (bounded by the
    /// bootstrap's timeout), and its reference to the rendezvous goes then.
    fn abandon(&self, cause: &str) {
        self.state().poison(|| cause.to_string());
    }
}
