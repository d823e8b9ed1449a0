//! The collective handle of one rank and its per-call path.
//!
//! Per call: closed/poison check (one atomic load and one volatile load of the host-mapped
//! error record), `validate`, `Plan`, parameter packing into a stack struct, one
//! `cuLaunchKernel`. No host synchronisation, no host allocation, no round trip.
use crate::config::CudaIpcConfig;
use crate::driver::{self, BACKEND, check};
use crate::kernels::Module;
use crate::launch::{self, Fixed, ParamsMany, ParamsSingle};
use crate::memory::{self, ErrorRecord, IpcMapping, Staging};
use crate::status;
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::close::CloseOnce;
use collective_core::protocol::{CLOSE_ACK, Layout, Plan, Poison, close};
use collective_core::{
    Capabilities, Collective, Error, Io, Op, Plain, RawMut, RawRef, Reducible, Route, validate, validate_many,
};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, sys};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Who owns the staging allocations a rank reads.
pub(crate) enum Owner {
    /// In-process ranks (threads) share every allocation; it is freed when the last rank of the
    /// group is dropped, so no rank can free memory another rank's kernel still reads, and
    /// dropping a whole group from one thread never waits.
    Group(#[allow(dead_code)] Arc<GroupShared>),
    /// One process per rank: this rank's allocation, and its mappings of the peers'.
    Process {
        own: Mutex<Option<Staging>>,
        mappings: Mutex<Vec<IpcMapping>>,
        #[allow(dead_code)]
        boot: Box<dyn Bootstrap>,
    },
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Group(_) => f.write_str("Owner::Group"),
            Owner::Process { .. } => f.write_str("Owner::Process"),
        }
    }
}

/// Allocations of an in-process group.
#[derive(Debug)]
pub(crate) struct GroupShared {
    /// Held only so that it is freed with the last rank.
    #[allow(dead_code)]
    pub(crate) staging: Vec<Staging>,
}

/// The protocol state of a rank of a world of 2 or more.
#[derive(Debug)]
pub(crate) struct IpcState {
    pub(crate) module: Arc<Module>,
    pub(crate) layout: Layout,
    pub(crate) fixed: Fixed,
    pub(crate) bases: Vec<u64>,
    pub(crate) err: ErrorRecord,
    pub(crate) owner: Owner,
}

/// One rank of a CUDA IPC collective.
///
/// `Collective::Stream` is cudarc's [`CudaStream`]; the `enqueue*` methods take a raw
/// `CUstream` instead (unsafe), and the `*_slices` helpers take cudarc buffers.
///
/// Views passed in an [`Io`] must be device memory of this rank's context (or memory the device
/// can address, e.g. mapped pinned host memory): the kernel dereferences them.
#[derive(Debug)]
pub struct CudaIpcCollective {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) config: CudaIpcConfig,
    pub(crate) ipc: Option<IpcState>,
    /// World 1: the copy kernel (cheaper to enqueue than `cuMemcpyDtoDAsync`); `None` when the
    /// kernels could not be loaded, then the driver copy is used.
    pub(crate) local_copy: Option<Arc<Module>>,
    pub(crate) poison: Poison,
    pub(crate) closed: AtomicBool,
    pub(crate) close_once: CloseOnce,
}

impl CudaIpcCollective {
    /// The context this rank's kernels run in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The configuration this collective was built with (blocks resolved).
    pub fn config(&self) -> &CudaIpcConfig {
        &self.config
    }

    /// Where the kernels came from (`NVRTC sm_90`, or a prebuilt file); `None` when none are
    /// loaded (world 1 without NVRTC).
    pub fn kernel_origin(&self) -> Option<&str> {
        self.ipc.as_ref().map(|s| &s.module).or(self.local_copy.as_ref()).map(|m| m.origin())
    }

    /// World 1, out of place: one copy.
    fn copy_local(&self, dst: u64, src: u64, bytes: usize, stream: sys::CUstream) -> Result<(), Error> {
        if src == dst || bytes == 0 {
            return Ok(());
        }
        let r = match &self.local_copy {
            Some(m) => {
                let p = launch::CopyParams { dst, src, bytes: bytes as u64 };
                // SAFETY: `detcoll_copy` takes `DcCopyParams`; validated, non-overlapping device
                // ranges of `bytes` bytes.
                unsafe { launch::launch(m.copy, launch::copy_grid(bytes, m.tree_grid), launch::THREADS, &p, stream) }
            }
            // SAFETY: as above.
            None => check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) }, "cuMemcpyDtoDAsync"),
        };
        r.map_err(|e| self.fail(e))
    }

    /// Reports a failure a kernel of this rank recorded. Calls are asynchronous: synchronise
    /// the stream first to learn whether the calls enqueued so far succeeded. The first report
    /// of a failure is its typed error (`PeerTimeout`, `SignatureMismatch`, ...); from then on
    /// the collective is poisoned and every call returns [`Error::Poisoned`].
    pub fn check(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.poison.check()?;
        if let Some(ipc) = &self.ipc {
            if ipc.err.code() != 0 {
                return Err(self.poison.record(status::decode(&ipc.err.words(), self.config.timeouts().peer)));
            }
        }
        Ok(())
    }

    /// Test hook: puts this rank's protocol state where `start` one-shot calls would have left
    /// it — the device generation counter at `start` and every ready flag published at `start`
    /// — and leaves the phase-2 flags as construction left them, so a test can cross the 2^31
    /// and 2^32 generation boundaries in a few calls. Every rank of the world must call it
    /// with the same `start`, all before any call and while none is in flight.
    #[doc(hidden)]
    pub fn start_generation_for_test(&self, start: u32) -> Result<(), Error> {
        let Some(ipc) = &self.ipc else { return Ok(()) };
        let own = ipc.bases[self.rank];
        let word = u64::from(start) << 32;
        for b in 0..ipc.layout.blocks() {
            memory::write_word(&self.ctx, own + ipc.layout.ready(b) as u64, word)?;
        }
        // DC_ST_GEN, the second word of the status line.
        memory::write_word(&self.ctx, own + ipc.layout.status() as u64 + 8, u64::from(start))
    }

    /// Bytes of device staging (control lines and frames) this rank retains; 0 for world 1.
    pub fn staging_bytes(&self) -> usize {
        self.ipc.as_ref().map_or(0, |ipc| ipc.layout.total_bytes())
    }

    /// The raw device error record (`[code, peer, generation, observed flag word, our
    /// signature, their signature]`, see `collective_core::protocol::status`), for diagnostics
    /// beyond the typed error: e.g. which generation a silent peer's flag was left at. `None`
    /// for world 1 (no protocol).
    pub fn error_record(&self) -> Option<[u64; 8]> {
        self.ipc.as_ref().map(|ipc| ipc.err.words())
    }

    fn route_of(&self, op: Op, bytes: usize) -> Route {
        if self.world == 1 {
            Route::Local
        } else if op == Op::AllReduce && bytes > 0 && bytes >= self.config.rsag_threshold {
            Route::IpcReduceScatterAllGather
        } else {
            Route::IpcOneShot
        }
    }

    fn fail(&self, e: Error) -> Error {
        self.poison.record(e)
    }

    /// Enqueues one single-lane call on a raw stream.
    ///
    /// # Safety
    /// `stream` must be a live stream of this rank's context (or null for its legacy default
    /// stream), and the views in `io` must be device-addressable memory that stays valid and
    /// otherwise untouched until the stream has executed the call.
    pub unsafe fn enqueue(&self, op: Op, io: Io<'_>, stream: sys::CUstream) -> Result<(), Error> {
        self.check()?;
        let call = validate(op, &io, self.rank, self.world, self.config.capacity)?;
        driver::bind(&self.ctx)?;
        let Some(ipc) = &self.ipc else {
            return self.copy_local(call.dst, call.src, call.bytes_out(), stream);
        };
        let route = self.route_of(op, call.bytes_in());
        let plan = Plan::single(&call, self.rank, self.world, route)?;
        let params: ParamsSingle = launch::pack(&ipc.fixed, &plan, call.in_place && op == Op::AllGather)?;
        // SAFETY: the single-lane kernel takes `DcParams<16>`; the addresses are the group's
        // allocations (alive while `self` is) and the caller's validated views.
        unsafe { launch::launch(ipc.module.collective_single, params.h.grid, ipc.fixed.threads, &params, stream) }
            .map_err(|e| self.fail(e))
    }

    /// Enqueues a `reduce_scatter_many` on a raw stream.
    ///
    /// # Safety
    /// As [`CudaIpcCollective::enqueue`], for every lane.
    pub unsafe fn enqueue_many(&self, lanes: &[Io<'_>], stream: sys::CUstream) -> Result<(), Error> {
        self.check()?;
        let (calls, sig) = validate_many(lanes, self.rank, self.world, self.config.capacity)?;
        driver::bind(&self.ctx)?;
        let Some(ipc) = &self.ipc else {
            for l in &calls {
                self.copy_local(l.call.dst, l.call.src, l.call.bytes_out(), stream)?;
            }
            return Ok(());
        };
        let plan = Plan::many(&calls, sig, self.rank);
        let params: ParamsMany = launch::pack(&ipc.fixed, &plan, false)?;
        // SAFETY: the many-lane kernel takes `DcParams<32>`; addresses as in `enqueue`.
        unsafe { launch::launch(ipc.module.collective_many, params.h.grid, ipc.fixed.threads, &params, stream) }
            .map_err(|e| self.fail(e))
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<(), Error> {
        if stream.context().cu_ctx() == self.ctx.cu_ctx() {
            Ok(())
        } else {
            Err(Error::InvalidConfig { detail: "the stream belongs to another CUDA context than this rank".into() })
        }
    }

    fn slices<T: Plain>(
        &self,
        op: Op,
        input: Option<&CudaSlice<T>>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.check_stream(stream)?;
        let out_len = output.len();
        // The guards record cudarc's read/write events after the launch (when event tracking is
        // on), so cudarc orders later work on these buffers after the collective.
        let in_guard = input.map(|i| (i.len(), i.device_ptr(stream)));
        let (out_ptr, out_guard) = output.device_ptr_mut(stream);
        // SAFETY: the views cover exactly the cudarc allocations, borrowed for this call.
        let out = unsafe { RawMut::from_raw(out_ptr, out_len, T::DTYPE) };
        let io = match &in_guard {
            Some((len, (ptr, _))) => {
                // SAFETY: as above, for the input allocation.
                let input = unsafe { RawRef::from_raw(*ptr, *len, T::DTYPE) };
                Io::OutOfPlace { input, output: out }
            }
            None => Io::InPlace(out),
        };
        // SAFETY: the stream is this context's; the buffers are device allocations that cudarc
        // keeps alive and orders through the guards.
        let r = unsafe { self.enqueue(op, io, stream.cu_stream()) };
        drop(out_guard);
        drop(in_guard);
        r
    }

    /// all_reduce of cudarc buffers.
    pub fn all_reduce_slices<T: Reducible>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.slices(Op::AllReduce, Some(input), output, stream)
    }
    /// all_reduce in place on a cudarc buffer.
    pub fn all_reduce_in_place<T: Reducible>(&self, buf: &mut CudaSlice<T>, stream: &CudaStream) -> Result<(), Error> {
        self.slices(Op::AllReduce, None, buf, stream)
    }
    /// all_gather of cudarc buffers (`output.len() == world * input.len()`).
    pub fn all_gather_slices<T: Plain>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.slices(Op::AllGather, Some(input), output, stream)
    }
    /// all_gather in place (this rank's shard already at `rank * len / world`).
    pub fn all_gather_in_place<T: Plain>(&self, buf: &mut CudaSlice<T>, stream: &CudaStream) -> Result<(), Error> {
        self.slices(Op::AllGather, None, buf, stream)
    }
    /// reduce_scatter of cudarc buffers (`output.len() == input.len() / world`).
    pub fn reduce_scatter_slices<T: Reducible>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.slices(Op::ReduceScatter, Some(input), output, stream)
    }
    /// reduce_scatter in place (the result lands in shard `rank`).
    pub fn reduce_scatter_in_place<T: Reducible>(
        &self,
        buf: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.slices(Op::ReduceScatter, None, buf, stream)
    }

    /// Close of a process-mode rank: wait (bounded) until every peer acknowledged, then free.
    fn wait_acks_and_free(&self, ipc: &IpcState) -> Result<(), Error> {
        let Owner::Process { own, mappings, .. } = &ipc.owner else { return Ok(()) };
        let base = ipc.bases[self.rank];
        let missing =
            close::first_missing_ack(&ipc.layout, self.rank, self.world, self.config.timeouts().close, |off| {
                let mut w = [0u64; 1];
                memory::read_words(&self.ctx, base + off as u64, &mut w)?;
                Ok(w[0])
            })?;
        // Our mappings of the peers' memory are no longer used by any kernel of ours.
        if let Ok(mut m) = mappings.lock() {
            m.clear();
        }
        let mut own =
            own.lock().map_err(|_| Error::Backend { backend: BACKEND, detail: "staging lock poisoned".into() })?;
        match missing {
            None => {
                own.take();
                Ok(())
            }
            Some(peer) => {
                // A peer might still read our frames: keep them allocated rather than free
                // memory under it.
                if let Some(s) = own.as_mut() {
                    s.leak();
                }
                own.take();
                Err(Error::PeerTimeout { peer, what: "acknowledge close", waited: self.config.timeouts().close })
            }
        }
    }
}

impl Collective for CudaIpcCollective {
    type Stream = CudaStream;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::strict(self.config.capacity, true)
    }
    fn route(&self, op: Op, bytes: usize) -> Route {
        self.route_of(op, bytes)
    }
    fn all_reduce(&self, io: Io<'_>, stream: &CudaStream) -> Result<(), Error> {
        self.check_stream(stream)?;
        // SAFETY: the stream is this context's; the views' validity is the contract of their
        // (unsafe) constructors, documented on this type.
        unsafe { self.enqueue(Op::AllReduce, io, stream.cu_stream()) }
    }
    fn all_gather(&self, io: Io<'_>, stream: &CudaStream) -> Result<(), Error> {
        self.check_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue(Op::AllGather, io, stream.cu_stream()) }
    }
    fn reduce_scatter(&self, io: Io<'_>, stream: &CudaStream) -> Result<(), Error> {
        self.check_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue(Op::ReduceScatter, io, stream.cu_stream()) }
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], stream: &CudaStream) -> Result<(), Error> {
        self.check_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue_many(lanes, stream.cu_stream()) }
    }

    /// Synchronises this rank's context (no kernel of ours may still read a peer), writes
    /// `CLOSE_ACK` into every peer's `ack[rank]` line, then:
    /// * one process per rank: waits (bounded by `timeouts.close`) for every peer's
    ///   acknowledgement in its own block, unmaps the peers and frees its staging — or, on
    ///   timeout, keeps the staging allocated (a peer may still read it) and returns
    ///   `PeerTimeout`;
    /// * in-process group: returns; the shared allocations are freed with the last rank.
    ///
    /// A second close returns `Ok` after a successful one and [`Error::CloseFailed`] after a
    /// failed one.
    fn close(&self) -> Result<(), Error> {
        self.close_once.run(|| self.close_now())
    }
}

impl CudaIpcCollective {
    fn close_now(&self) -> Result<(), Error> {
        self.closed.store(true, Ordering::Release);
        let Some(ipc) = &self.ipc else { return Ok(()) };
        driver::synchronize(&self.ctx)?;
        for q in (0..self.world).filter(|&q| q != self.rank) {
            memory::write_word(&self.ctx, ipc.bases[q] + ipc.layout.ack(self.rank) as u64, CLOSE_ACK)?;
        }
        self.wait_acks_and_free(ipc)
    }
}

impl Drop for CudaIpcCollective {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
