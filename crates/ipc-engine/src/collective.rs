//! The collective handle of one rank and its per-call path, for every GPU runtime.
//!
//! Per call: closed/poison check (one atomic load and one volatile load of the host-mapped
//! error record), `validate`, `Plan`, parameter packing into a stack struct, one launch (a
//! call above the staging capacity: one `Plan` and launch per chunk, see `Chunks`). No
//! host synchronisation, no host allocation, no round trip.
use crate::lockstep::Member;
use crate::order::StreamOrder;
use crate::state::{IpcState, Owner};
use collective_core::process::ProcessOwner;
use collective_core::{
    Capabilities, Collective, DType, Error, Io, IpcRoute, Op, Route, RouteSelect, Signature, validate, validate_many,
};
use detcoll_protocol::close::{self, CloseOnce, MissingAck};
use detcoll_protocol::params::{
    self, CollectiveNormParams, CopyParams, ParamsMany, ParamsSingle, TILE_BYTES, WIDE_TILE_BYTES,
};
use detcoll_protocol::status::{self, RECORD_WORDS};
use detcoll_protocol::{CLOSE_ACK, Chunks, IpcConfig, NormArgs, NormParams, Plan, Poison};
use detcoll_protocol::{IpcDevice, Launch, RawStream, Vendor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One rank of an IPC collective on device `D` (CUDA: `cuda_ipc::CudaIpcCollective`; HIP:
/// `hip_ipc::HipIpcCollective`).
///
/// Ranks as threads of one process ([`IpcCollective::group`]) use peers' pointers directly;
/// one process per rank ([`IpcCollective::new`]) exchanges IPC handles through a
/// [`collective_core::bootstrap::Bootstrap`]. Every wait in the kernels is bounded; a
/// timeout, a mismatching or closed peer, or corrupt state is written to host-mapped memory
/// and poisons the collective ([`IpcCollective::check`]).
///
/// Views passed in an [`Io`] must be device memory this rank's device can address (its own
/// allocations, or mapped pinned host memory): the kernel dereferences them. Views built from
/// host slices by the safe constructors (`Io::host`) are refused with `Error::HostMemory` on a
/// device that is not the host.
#[derive(Debug)]
pub struct IpcCollective<D: IpcDevice> {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: D,
    pub(crate) config: IpcConfig,
    pub(crate) ipc: Option<IpcState<D>>,
    /// World 1: the copy kernel; `None` when the kernels could not be loaded, then the
    /// runtime's copy is used.
    pub(crate) local_copy: Option<Arc<D::Kernels>>,
    pub(crate) poison: Poison,
    pub(crate) closed: AtomicBool,
    pub(crate) close_once: CloseOnce,
    /// Held for the whole of every call (all its chunks), so calls of several threads on one
    /// handle never interleave their launches: each call is atomic, in one order per handle.
    /// It holds the stream order (`order.rs`): calls on different streams run in that order.
    pub(crate) calls: Mutex<StreamOrder<D::Event>>,
    /// Ranks that are threads sharing this rank's device: every call is one step of all of
    /// them (`lockstep.rs`). `None` for ranks with a device (or process) of their own.
    pub(crate) lockstep: Option<Member>,
    /// The process that built this handle: it fails closed in a forked child.
    pub(crate) process: ProcessOwner,
}

impl<D: IpcDevice> IpcCollective<D> {
    /// The device this rank's kernels run on.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The configuration this collective was built with (blocks and timeouts resolved).
    pub fn config(&self) -> &IpcConfig {
        &self.config
    }

    /// Where the kernels came from; `None` when none are loaded (world 1 without them).
    pub fn kernel_origin(&self) -> Option<String> {
        self.ipc.as_ref().map(|s| &s.kernels).or(self.local_copy.as_ref()).map(|k| D::kernel_origin(k))
    }

    /// Bytes of device staging (control lines and frames) this rank retains; 0 for world 1.
    pub fn staging_bytes(&self) -> usize {
        self.ipc.as_ref().map_or(0, |ipc| ipc.layout.total_bytes())
    }

    /// The raw device error record (`[code, peer, generation, observed flag word, our
    /// signature, their signature]`, see `detcoll_protocol::status`), for diagnostics
    /// beyond the typed error. `None` for world 1 (no protocol).
    pub fn error_record(&self) -> Option<[u64; RECORD_WORDS]> {
        self.ipc.as_ref().map(|ipc| D::record_words(&ipc.err))
    }

    /// Reports a failure a kernel of this rank recorded. Calls are asynchronous: synchronise
    /// the stream first to learn whether the calls enqueued so far succeeded. The first report
    /// of a failure is its typed error (`PeerTimeout`, `SignatureMismatch`, `PeerClosed`, ...);
    /// from then on the collective is poisoned and every call returns [`Error::Poisoned`].
    pub fn check(&self) -> Result<(), Error> {
        self.process.check()?;
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.poison.check()?;
        if let Some(ipc) = &self.ipc
            && D::record_code(&ipc.err) != 0
        {
            let words = D::record_words(&ipc.err);
            return Err(self.poison.record(status::decode(&words, self.config.timeouts().peer, D::BACKEND)));
        }
        Ok(())
    }

    /// The route a call of `op` moving `bytes` per rank takes when the caller does not name
    /// one: a lookup in this collective's route table ([`IpcConfig::routes`], bound to the world
    /// and to IPC at construction; the factory passes its agreed routing table). Push calls that
    /// do not fit their slots take one-shot (same bits), except bulk all_reduce and
    /// reduce_scatter, which run as bulk chunks (`protocol::Chunks`).
    pub fn default_route(&self, op: Op, bytes: usize) -> IpcRoute {
        // The bound table holds IPC routes only.
        self.config.routes.ipc_route(op, bytes).unwrap_or(IpcRoute::OneShot)
    }

    fn fail(&self, e: Error) -> Error {
        self.poison.record(e)
    }

    /// Bytes of staging and control this rank keeps for its lifetime (0 at world 1).
    pub fn workspace_bytes(&self) -> usize {
        self.ipc.as_ref().map_or(0, |ipc| ipc.layout.total_bytes())
    }

    /// Test hook: puts this rank's protocol state where `start` one-shot calls would have left
    /// it — the device generation counter at `start`, every ready flag and every push header
    /// in this rank's memory published at `start` — and leaves the phase-2 flags as
    /// construction left them, so a test can cross the 2^31 and 2^32 generation boundaries in
    /// a few calls. The LL lines still hold construction's flag 0, which generation 0 would
    /// read as current: the next two calls rewrite every line first (the epoch refresh, asked
    /// for through the status line). Every rank of the world must call it with the same
    /// `start`, all before any call and while none is in flight.
    #[doc(hidden)]
    pub fn start_generation_for_test(&self, start: u32) -> Result<(), Error> {
        let Some(ipc) = &self.ipc else { return Ok(()) };
        let own = ipc.mems[self.rank].control;
        let word = u64::from(start) << 32;
        for b in 0..ipc.layout.blocks() {
            self.device.write_word(own + ipc.layout.ready(b) as u64, word)?;
        }
        for parity in 0..2 {
            for q in 0..self.world {
                self.device.write_word(own + ipc.layout.push_header(parity, q) as u64, word)?;
            }
        }
        for phase in 0..2 {
            for b in 0..ipc.layout.blocks() {
                for q in 0..self.world {
                    self.device.write_word(own + ipc.layout.push_flag(phase, b, q) as u64, word)?;
                }
            }
        }
        let word = |w: usize| own + (ipc.layout.status() + 8 * w) as u64;
        // The next two calls (one per parity) refresh every LL line.
        self.device.write_word(word(status::ST_REFRESH), 2)?;
        self.device.write_word(word(status::ST_GEN), u64::from(start))
    }

    /// World 1, out of place: one copy.
    fn copy_local(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error> {
        if src == dst || bytes == 0 {
            return Ok(());
        }
        let r = match &self.local_copy {
            Some(k) => {
                let p = CopyParams { dst, src, bytes: bytes as u64 };
                let grid = params::copy_grid(bytes, D::grid_limit(k));
                // SAFETY: `detcoll_copy` takes `DcCopyParams`; validated, non-overlapping device
                // ranges of `bytes` bytes; the stream is the caller's (vouched for).
                unsafe { self.device.launch(k, Launch::Copy(&p), grid, stream) }
            }
            // SAFETY: as above.
            None => unsafe { self.device.copy(dst, src, bytes, stream) },
        };
        r.map_err(|e| self.fail(e))
    }

    /// Enqueues one single-lane call on a raw stream, by the route of
    /// [`IpcCollective::default_route`].
    ///
    /// # Safety
    /// `stream` must be a live stream of this rank's device (or null for its default stream),
    /// and the views in `io` must be device-addressable memory that stays valid and otherwise
    /// untouched until the stream has executed the call.
    pub unsafe fn enqueue(&self, op: Op, io: Io<'_>, stream: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_routed(op, io, None, stream) }
    }

    /// Enqueues one single-lane call on a raw stream by `route` (`None`: the default route).
    /// The route is the caller's decision (the factory's routing table): an IPC route this op
    /// cannot take (RS+AG for anything but all_reduce, a non-IPC route) is an error before
    /// any device work.
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue`].
    pub unsafe fn enqueue_routed(
        &self,
        op: Op,
        io: Io<'_>,
        route: Option<IpcRoute>,
        stream: RawStream,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_routed_as_part(op, io, route, 0, stream) }
    }

    /// [`IpcCollective::enqueue_routed`] as a part of a larger call that a composite route runs
    /// as smaller collectives: every launch is signed with `part` (`Signature::part_split` of
    /// the whole call; 0: a call of its own), so peers running parts of another call fail with
    /// `SignatureMismatch` (see `RouteSelect::call_on_route_as_part`).
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue`].
    pub unsafe fn enqueue_routed_as_part(
        &self,
        op: Op,
        io: Io<'_>,
        route: Option<IpcRoute>,
        part: u32,
        stream: RawStream,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_single(op, io, route, part, None, stream) }.map(drop)
    }

    /// Enqueues the all_reduce of a fused all_reduce + residual + RMSNorm on a raw stream by
    /// `route` (`None`: the table's route for the fused call, `RouteTable::fused_norm_route`), with the norm of `norm` (`norm.sum` is the
    /// all_reduce's output) as the epilogue of the call's last launch (`Launch::SingleNorm`):
    /// one kernel for a call that fits one launch, and no second launch for a chunked one
    /// (earlier chunks' sums are complete when the last launch starts: stream order).
    ///
    /// `Ok(true)`: the norm is enqueued too. `Ok(false)`: only the all_reduce was (a world of
    /// one rank, whose all_reduce is a copy): the caller enqueues the norm after it. Every
    /// argument is checked before any device work, with the front door's typed errors
    /// (`collective_core::validate_norm`: dtypes, lengths, shape, `eps`, overlaps) and in the
    /// one form a fused launch takes: `norm.sum` and `norm.y` are the all_reduce's output
    /// (`InvalidArgument` otherwise).
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue`], and the views of `norm` as
    /// [`NormDevice::residual_rmsnorm`](detcoll_protocol::NormDevice::residual_rmsnorm) requires.
    pub unsafe fn enqueue_all_reduce_norm(
        &self,
        io: Io<'_>,
        route: Option<IpcRoute>,
        norm: &NormArgs,
        stream: RawStream,
    ) -> Result<bool, Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_all_reduce_norm_as_part(io, route, norm, true, 0, stream) }
    }

    /// The all_reduce of a fused all_reduce + residual + RMSNorm with the norm as the epilogue
    /// of its last launch (`in_kernel`: [`IpcCollective::enqueue_all_reduce_norm`]) or left to
    /// the caller ([`IpcCollective::enqueue_all_reduce_for_norm`], `Ok(false)`), signed as
    /// `part` too (the norm's split joined with it, `Signature::join_split`): a front door's
    /// call number (`Signature::call_split`), or a composite route's whole call; 0 for neither.
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue_all_reduce_norm`].
    pub unsafe fn enqueue_all_reduce_norm_as_part(
        &self,
        io: Io<'_>,
        route: Option<IpcRoute>,
        norm: &NormArgs,
        in_kernel: bool,
        part: u32,
        stream: RawStream,
    ) -> Result<bool, Error> {
        let epilogue = if in_kernel { Epilogue::InLastLaunch } else { Epilogue::Caller };
        // SAFETY: forwarded.
        let r = unsafe { self.enqueue_single(Op::AllReduce, io, route, part, Some((norm, epilogue)), stream) };
        r.map(|fused| in_kernel && fused)
    }

    /// Enqueues the all_reduce of a fused all_reduce + residual + RMSNorm whose norm the caller
    /// launches after it (the form for batches the one kernel does not take), checked as
    /// [`IpcCollective::enqueue_all_reduce_norm`] checks and signed, like it, with the norm's
    /// `hidden` and `eps` (`Signature::norm_split`): peers making a fused call with another
    /// `hidden` or `eps`, or a plain all_reduce of the same size, fail with
    /// `SignatureMismatch` on every rank instead of returning different `y`.
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue_all_reduce_norm`].
    pub unsafe fn enqueue_all_reduce_for_norm(
        &self,
        io: Io<'_>,
        route: Option<IpcRoute>,
        norm: &NormArgs,
        stream: RawStream,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_all_reduce_norm_as_part(io, route, norm, false, 0, stream) }.map(drop)
    }

    /// Whether a fused all_reduce + RMSNorm of `io` by `route` (`norm` its packed norm) is one
    /// kernel whose norm reads the gathered sums in place (`CollectiveNormParams::new`) and
    /// covers the whole call: a runtime with that form, the RS+AG route, the norm's vector path,
    /// and a call that fits one launch (a chunked call's last launch would normalise every row
    /// but save the copies of its own chunk only). The form that pays at any batch size: on one
    /// H200 it measured 3-13 % faster than the all_reduce then the norm kernel at worlds 4 and 8
    /// (benches/results/h200-2026-12-03-fused-norm-gathered.md), and slower on bulk push (world
    /// 2) and in chunked calls, which keep the second launch above a few rows.
    pub fn fused_norm_reads_gathered(&self, io: &Io<'_>, route: IpcRoute, norm: &NormParams) -> bool {
        if !D::NORM_READS_GATHERED || route != IpcRoute::ReduceScatterAllGather || !norm.vector_ok() {
            return false;
        }
        self.fused_norm_in_one_launch(io, route)
    }

    /// Whether a fused all_reduce + RMSNorm of `io` by `route` (`norm` its packed norm) takes a
    /// row form inside the protocol in every launch (`CollectiveNormParams::shard_rows`:
    /// `dc_norm_bulk_rows` on bulk push, `dc_norm_rsag_rows` on RS+AG, in
    /// kernels/detcoll_norm.h): a runtime with the gathered-sum and row forms, one of those
    /// routes, f16/bf16 rows of 4096 or 8192 (in 8 KiB tiles, or in the wide tiles such calls
    /// take where their shards allow: `IpcCollective::fused_tile`) on the norm's vector path,
    /// and every launch's rows whole with whole-row shards (`shard_rows_in_every_launch`). Each
    /// block normalises the own shard's rows in registers as it reduces them and the peers'
    /// rows where their reduced shards lie after phase 2, at any batch size.
    pub fn fused_norm_shard_rows(&self, io: &Io<'_>, route: IpcRoute, norm: &NormParams) -> bool {
        let Ok(call) = validate(Op::AllReduce, io, self.rank, self.world, usize::MAX) else { return false };
        let Ok(Some(ipc)) = self.ipc_for(route) else { return false };
        let tile = self.fused_tile(&call, route, norm, ipc);
        self.shard_rows_in_every_launch(&call, route, norm, ipc, tile)
    }

    /// The protocol tile in bytes of a fused all_reduce + RMSNorm of `io` by `route` (`norm` its
    /// packed norm): [`WIDE_TILE_BYTES`] where every launch's shards are whole rows of 8192 or
    /// whole pairs of rows of 4096 on a route with the row forms (`IpcCollective::fused_tile`),
    /// else [`TILE_BYTES`]; `None` for a call this handle could not make by `route`. For tests
    /// and benches that say which shape a call took.
    pub fn fused_norm_tile(&self, io: &Io<'_>, route: IpcRoute, norm: &NormParams) -> Option<u32> {
        let call = validate(Op::AllReduce, io, self.rank, self.world, usize::MAX).ok()?;
        let ipc = self.ipc_for(route).ok()??;
        Some(self.fused_tile(&call, route, norm, ipc))
    }

    /// The protocol tile of a fused all_reduce of `call` by `route` with the norm `norm`:
    /// [`WIDE_TILE_BYTES`] (16 KiB) for f16/bf16 rows of 8192 or 4096 on bulk push and RS+AG,
    /// on a runtime with the row forms, when every launch's plan in wide tiles has the row
    /// forms' cut (`CollectiveNormParams::shard_rows_cut`) — a tile is then a row of 8192 or a
    /// pair of rows of 4096, which one block holds in registers; [`TILE_BYTES`] otherwise (rows
    /// of 4096 whose shards are not whole pairs then take the forms a row a tile). Chosen from
    /// signed values only (the route, dtype, `hidden` and rows, and the plans, which every rank
    /// cuts the same), never from this rank's addresses: the tile decides which block owns
    /// which bytes of every frame, so ranks must agree on it; a rank off the vector path or
    /// with an input off 16 bytes keeps the wide tile and takes the gathered-sum form in it
    /// (and the launches are signed with the tile besides: [`IpcCollective::tile_split`]).
    fn fused_tile(&self, call: &collective_core::Call, route: IpcRoute, norm: &NormParams, ipc: &IpcState<D>) -> u32 {
        let row = u64::from(norm.hidden) * 2;
        let wide_rows = row == u64::from(WIDE_TILE_BYTES) || 2 * row == u64::from(WIDE_TILE_BYTES);
        let cut = || self.every_launch(call, route, norm, ipc, WIDE_TILE_BYTES, CollectiveNormParams::shard_rows_cut);
        if Self::rows_forms_may_apply(route, norm) && wide_rows && cut() { WIDE_TILE_BYTES } else { TILE_BYTES }
    }

    /// What the row forms inside the protocol ask of a fused call before its shape: a runtime
    /// that has them, bulk push or RS+AG, f16/bf16.
    fn rows_forms_may_apply(route: IpcRoute, norm: &NormParams) -> bool {
        let two_bytes = norm.dtype == DType::F16 as u32 || norm.dtype == DType::BF16 as u32;
        let forms = D::NORM_READS_GATHERED && D::NORM_ROW_LOOP;
        forms && two_bytes && matches!(route, IpcRoute::Push | IpcRoute::ReduceScatterAllGather)
    }

    /// The split a fused call's launches in tiles of `tile` bytes are signed with besides
    /// (joined with the norm's): 0 in the protocol's tiles, a tag of the wide tile otherwise,
    /// so ranks that ever disagreed on the tile would fail with `SignatureMismatch` rather than
    /// read each other's frames in another block's tiles.
    fn tile_split(tile: u32) -> u32 {
        const TAG: u64 = 0x5449_4c45; // "TILE"
        if tile == TILE_BYTES { 0 } else { Signature::lane_split([TAG, u64::from(tile)]) }
    }

    /// Whether every launch of a fused all_reduce of `call` by `route` (bulk push or RS+AG),
    /// with the norm `norm`, takes a row form inside the protocol for the rows it writes: the
    /// call's launches (one, or its chunks above the staging capacity) each write whole rows
    /// (`fused_norm::plan_rows`) whose shards are whole rows (`CollectiveNormParams::shard_rows`
    /// of the launch's rows, in `tile`, the call's: [`IpcCollective::fused_tile`]). Then every
    /// launch normalises its own rows, and no launch after the last re-reads the sums. A
    /// chunked bulk push call of the default capacity at world 2 (chunks of 8 MiB,
    /// `chunk::balanced`) has whole rows of 4096 whenever its rows divide evenly.
    fn shard_rows_in_every_launch(
        &self,
        call: &collective_core::Call,
        route: IpcRoute,
        norm: &NormParams,
        ipc: &IpcState<D>,
        tile: u32,
    ) -> bool {
        // The call's own shape first: only a call that could take the forms plans its launches.
        let row_bytes = u64::from(norm.hidden) * 2;
        let row_a_tile = row_bytes == u64::from(TILE_BYTES) || row_bytes == u64::from(WIDE_TILE_BYTES);
        if !(Self::rows_forms_may_apply(route, norm) && row_a_tile && norm.vector_ok()) {
            return false;
        }
        self.every_launch(call, route, norm, ipc, tile, CollectiveNormParams::shard_rows)
    }

    /// Whether `test` holds for every launch of a fused all_reduce of `call` by `route` with
    /// the norm `norm`, each packed in tiles of `tile` bytes with the norm of the rows it
    /// writes (`fused_norm::plan_rows`; a launch whose rows are not whole fails the test).
    fn every_launch(
        &self,
        call: &collective_core::Call,
        route: IpcRoute,
        norm: &NormParams,
        ipc: &IpcState<D>,
        tile: u32,
        test: impl Fn(&CollectiveNormParams) -> bool,
    ) -> bool {
        let (capacity, ll) = (self.config.capacity, ipc.layout.ll_capacity());
        let Ok(chunks) = Chunks::single(call, self.rank, self.world, route.route(), capacity, ll) else {
            return false;
        };
        let mut launches = 0usize;
        for plan in chunks {
            let Ok(plan) = plan else { return false };
            let Some(rows) = crate::fused_norm::plan_rows(norm, &plan).and_then(|(f, r)| norm.rows_from(f, r)) else {
                return false;
            };
            let Ok(p) = params::pack_tiled(&ipc.fixed, &plan, false, D::BACKEND, tile) else { return false };
            if !test(&CollectiveNormParams::new(p, rows, true)) {
                return false;
            }
            launches += 1;
        }
        launches > 0
    }

    /// Whether a fused all_reduce + RMSNorm of `io` by `route` (`norm` its packed norm) is one
    /// kernel that normalises each row in registers right after its reduce, however many rows
    /// each block takes (the row loop, `dc_norm_rows_kept` in kernels/detcoll_norm.h; with fewer
    /// rows, the row form in registers): a runtime with that form, the one-shot route, f16/bf16
    /// rows of one protocol tile (hidden 4096: `TILE_BYTES` / 2), the norm's vector path and a
    /// call that fits one launch. The norm's own launch would re-read the sum, the residual and
    /// the weight that this form holds in registers: on one H100 the loop took 8.5-15 % off the
    /// fused call where the rows outnumber the blocks (world 2, 67-256 rows; world 8, 17 rows).
    /// Rows of two tiles (hidden 8192) do not loop: their loop measured 6-29 % slower than the
    /// epilogue or the norm's own launch (benches/results/h100-2026-12-05-row-loop.md), and
    /// 15-21 % slower than the norm's own launch in 16 KiB tiles, a row a tile
    /// (benches/results/h100-2026-12-07-wide-loop.md).
    pub fn fused_norm_row_loop(&self, io: &Io<'_>, route: IpcRoute, norm: &NormParams) -> bool {
        let two_bytes = norm.dtype == DType::F16 as u32 || norm.dtype == DType::BF16 as u32;
        if !D::NORM_ROW_LOOP || route != IpcRoute::OneShot || !two_bytes || !norm.vector_ok() {
            return false;
        }
        u64::from(norm.hidden) * 2 == u64::from(TILE_BYTES) && self.fused_norm_in_one_launch(io, route)
    }

    /// Whether a fused all_reduce + RMSNorm of `io` by `route` (`norm` its packed norm) is one
    /// kernel that holds each row of two protocol tiles (f16/bf16 of hidden 8192: `TILE_BYTES`)
    /// in registers, a block a row, and normalises it right after its reduce
    /// (`dc_norm_two_tile_rows` in kernels/detcoll_norm.h): a runtime with the row forms
    /// (`NORM_ROW_LOOP`), the one-shot route, the norm's vector path, a call that fits one
    /// launch, and no more rows than the launch has blocks (its grid is a block a tile, at most
    /// the resident grid, so: rows <= the resident grid). The front door asks it for batches
    /// above its one-kernel row limit (collective-factory's `ONE_KERNEL_MAX_ROWS`), where the
    /// norm would otherwise be a launch of its own: on one H100 (world 2, 66 rows of 8192) the
    /// form took 9.3 us against 13.9 us for the all_reduce then the norm kernel
    /// (benches/results/h100-2026-12-06-two-tile-rows.md). Rows beyond the grid keep the norm's
    /// launch: a loop of them measured slower there.
    pub fn fused_norm_two_tile_rows(&self, io: &Io<'_>, route: IpcRoute, norm: &NormParams) -> bool {
        let two_bytes = norm.dtype == DType::F16 as u32 || norm.dtype == DType::BF16 as u32;
        if !D::NORM_ROW_LOOP || route != IpcRoute::OneShot || !two_bytes || !norm.vector_ok() {
            return false;
        }
        let Ok(Some(ipc)) = self.ipc_for(route) else { return false };
        u64::from(norm.hidden) * 2 == 2 * u64::from(TILE_BYTES)
            && norm.rows <= u64::from(ipc.fixed.max_grid)
            && self.fused_norm_in_one_launch(io, route)
    }

    /// Whether the all_reduce of `io` by `route` is one launch (no chunks).
    fn fused_norm_in_one_launch(&self, io: &Io<'_>, route: IpcRoute) -> bool {
        let Ok(call) = validate(Op::AllReduce, io, self.rank, self.world, usize::MAX) else { return false };
        let Ok(Some(ipc)) = self.ipc_for(route) else { return false };
        let (capacity, ll) = (self.config.capacity, ipc.layout.ll_capacity());
        Chunks::single(&call, self.rank, self.world, route.route(), capacity, ll).is_ok_and(|c| c.count() == 1)
    }

    /// One single-lane call (`enqueue_routed`), every launch signed with `part` (a part of a
    /// larger call, `enqueue_routed_as_part`; 0 for a call of its own); with `norm`, the
    /// all_reduce of a fused call:
    /// its norm checked, every launch signed with the norm (`Signature::norm_split`, joined
    /// with `part`), and the
    /// norm the epilogue of its last launch (`Epilogue::InLastLaunch`,
    /// `enqueue_all_reduce_norm`) or left to the caller (`Epilogue::Caller`). `Ok(false)`: no
    /// launch took the norm (none given, left to the caller, or a world of one rank, whose call
    /// is a copy).
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue_all_reduce_norm`].
    unsafe fn enqueue_single(
        &self,
        op: Op,
        io: Io<'_>,
        route: Option<IpcRoute>,
        part: u32,
        norm: Option<(&NormArgs, Epilogue)>,
        stream: RawStream,
    ) -> Result<bool, Error> {
        let mut order = self.lock_call()?;
        self.check()?;
        // Host slices (the safe `Io::host`) on a device that is not the host: refused.
        self.check_address_space(op, &io)?;
        // No capacity limit: a call above the staging capacity runs in chunks (`Chunks`).
        let call = validate(op, &io, self.rank, self.world, usize::MAX)?;
        // A fused call's norm, checked against the validated all_reduce, then packed; the
        // digest of its hidden and eps signs every launch of the call. Without a route, the
        // table's for the fused call (its own rules, else the all_reduce's).
        let split =
            norm.map_or(part, |(args, _)| Signature::join_split(Signature::norm_split(args.hidden, args.eps), part));
        let route = route.unwrap_or_else(|| match norm {
            Some(_) => self.config.routes.fused_norm_ipc_route(call.bytes_in()).unwrap_or(IpcRoute::OneShot),
            None => self.default_route(op, call.bytes_in()),
        });
        // A norm left to the caller is packed too: to refuse now, before the all_reduce runs,
        // what the caller's norm launch would refuse after it.
        let (norm, packed_norm) = match norm {
            Some((args, epilogue)) => {
                crate::fused_norm::check(&io, args)?;
                let packed = NormParams::pack(args)?;
                ((epilogue == Epilogue::InLastLaunch).then_some((args, packed)), Some(packed))
            }
            None => (None, None),
        };
        let Some(ipc) = self.ipc_for(route)? else {
            self.device.bind()?;
            return self.copy_local(call.dst, call.src, call.bytes_out(), stream).map(|()| false);
        };
        self.device.bind()?;
        // The call's tile, whoever runs its norm (this launch or the caller's): wide for rows
        // of 8192 in whole-row shards (`fused_tile`), signed with it.
        let tile = packed_norm.map_or(TILE_BYTES, |packed| self.fused_tile(&call, route, &packed, ipc));
        let split = Signature::join_split(split, Self::tile_split(tile));
        // A row form inside the protocol in every launch (`shard_rows_in_every_launch`): each
        // launch, not only the last, is fused with the norm of the rows it writes.
        let every_launch =
            norm.is_some_and(|(_, packed)| self.shard_rows_in_every_launch(&call, route, &packed, ipc, tile));
        // The LL push route when the payload fits the LL slots, the one-shot pull route
        // otherwise (same bits); above the staging capacity, chunks: consecutive launches on
        // this stream, one generation each (the double-buffered frames pipeline them).
        let (capacity, ll) = (self.config.capacity, ipc.layout.ll_capacity());
        let mut chunks = Chunks::single(&call, self.rank, self.world, route.route(), capacity, ll)?.peekable();
        // Each plan, signed, with whether it is the call's last.
        let plans = core::iter::from_fn(move || {
            let plan = chunks.next()?;
            let last = chunks.peek().is_none();
            Some(plan.map(|mut p| {
                p.sig.split = split;
                (p, last)
            }))
        });
        let gather_in_place = call.in_place && op == Op::AllGather;
        let launch = |(plan, last): (Plan, bool)| {
            let p: ParamsSingle = params::pack_tiled(&ipc.fixed, &plan, gather_in_place, D::BACKEND, tile)?;
            // With the form in every launch, each launch's norm is its own rows' (the check
            // above found them for every plan: the same plans).
            let rows_of = |args: &NormArgs, packed: &NormParams| {
                let (first, rows) = crate::fused_norm::plan_rows(packed, &plan)?;
                Some((
                    args.rows_from(usize::try_from(first).ok()?, usize::try_from(rows).ok()?)?,
                    packed.rows_from(first, rows)?,
                ))
            };
            let chunk_args;
            let norm = match norm {
                Some((args, packed)) if every_launch => {
                    chunk_args = rows_of(args, &packed).ok_or_else(|| {
                        self.fail(Error::Backend {
                            backend: D::BACKEND,
                            detail: "a fused launch's rows changed between its plans".into(),
                        })
                    })?;
                    Some((&chunk_args.0, chunk_args.1))
                }
                n => n.filter(|_| last),
            };
            let r = match norm {
                Some((args, packed)) => {
                    let fused = CollectiveNormParams::new(p, packed, D::NORM_READS_GATHERED);
                    let grid = fused.grid(ipc.fixed.max_grid);
                    // SAFETY: `detcoll_collective_norm` takes `DcCollectiveNormParams`; the
                    // collective's addresses as below, the norm's the caller's (checked by
                    // `pack`, valid by the caller's contract).
                    unsafe {
                        self.device.launch(&ipc.kernels, Launch::SingleNorm { params: &fused, args }, grid, stream)
                    }
                }
                // SAFETY: the single-lane kernel takes `DcParams<16>`; the addresses are the
                // group's allocations (alive while `self` is) and the caller's validated views.
                None => unsafe { self.device.launch(&ipc.kernels, Launch::Single(&p), p.h.grid, stream) },
            };
            r.map_err(|e| self.fail(e))
        };
        // SAFETY: a live stream of this device (caller).
        unsafe { self.run_call(&mut order, stream, plans, launch) }.map(|()| norm.is_some())
    }

    /// Takes this handle's call lock (see `calls`). A thread that panicked inside a call
    /// left its launches unknown: the handle fails closed.
    fn lock_call(&self) -> Result<MutexGuard<'_, StreamOrder<D::Event>>, Error> {
        // A forked child first: it inherits this lock as the parent held it, and a parent
        // thread inside a call at the fork left it locked for good in the child.
        self.process.check()?;
        self.calls.lock().map_err(|_| {
            self.fail(Error::Backend {
                backend: D::BACKEND,
                detail: "a thread panicked inside a call of this handle".into(),
            })
        })
    }

    /// Runs one call on `stream`: `launch` once per plan of `plans` (one, or the call's
    /// chunks), in the handle's order — after the rank's previous call when that was on
    /// another stream (`order.rs`) — and each launch as one step of the lockstep of the ranks
    /// sharing this device (`lockstep.rs`; at once for a rank with a device of its own).
    /// Per launch, not per call: a rank's chunks are ordered on its stream, so a peer's chunk
    /// `i` enqueued behind this rank's chunk `i + 1` in a hardware queue the two streams share
    /// would never start (measured: thread ranks on one H200 timing out in chunked calls while
    /// the lockstep was per call). A failure here poisons this rank (its peers' kernels of this
    /// call would wait in vain).
    ///
    /// # Safety
    /// `stream` is a live stream of this rank's device.
    unsafe fn run_call<P>(
        &self,
        order: &mut StreamOrder<D::Event>,
        stream: RawStream,
        plans: impl IntoIterator<Item = Result<P, Error>>,
        mut launch: impl FnMut(P) -> Result<(), Error>,
    ) -> Result<(), Error> {
        // SAFETY: `stream` is live (caller).
        unsafe { order.before(&self.device, stream) }.map_err(|e| self.fail(e))?;
        for plan in plans {
            match &self.lockstep {
                None => launch(plan?)?,
                Some(m) => m.step(self.config.timeouts().peer, || launch(plan?)).map_err(|e| self.fail(e))?,
            }
        }
        // SAFETY: as above.
        unsafe { order.after(&self.device, stream) }.map_err(|e| self.fail(e))
    }

    /// The protocol state a call by `route` runs on: `None` for `Local` at world 1 (a copy).
    /// A route this world does not have (`Local` above one rank, a protocol route at world 1)
    /// is `InvalidConfig`, before any device work. Which IPC routes an op can take, the plan
    /// says (`Plan::single`: RS+AG is an all_reduce route).
    fn ipc_for(&self, route: IpcRoute) -> Result<Option<&IpcState<D>>, Error> {
        match (&self.ipc, route) {
            (None, IpcRoute::Local) => Ok(None),
            (Some(ipc), r) if r != IpcRoute::Local => Ok(Some(ipc)),
            _ => Err(Error::InvalidConfig {
                detail: format!("route {} is not a route of a world of {} ranks", route.route().name(), self.world),
            }),
        }
    }

    /// Enqueues a `reduce_scatter_many` on a raw stream, by the route of
    /// [`IpcCollective::default_route`] for its total bytes.
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue`], for every lane.
    pub unsafe fn enqueue_many(&self, lanes: &[Io<'_>], stream: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_many_routed(lanes, None, stream) }
    }

    /// Enqueues a `reduce_scatter_many` on a raw stream by `route` (`None`: the default
    /// route): `IpcPushLl` when the lanes' shards fit the LL slots, the one-shot pull route
    /// otherwise (and for any other route), in groups of lanes and chunks of lanes above the
    /// staging capacity (consecutive launches, as in `enqueue_routed`).
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue`], for every lane.
    pub unsafe fn enqueue_many_routed(
        &self,
        lanes: &[Io<'_>],
        route: Option<IpcRoute>,
        stream: RawStream,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.enqueue_many_routed_as_part(lanes, route, 0, stream) }
    }

    /// [`IpcCollective::enqueue_many_routed`] as a part of a larger call: the lanes' split is
    /// mixed with `part` (`Signature::part_split` of the whole call; 0: a call of its own), as
    /// [`IpcCollective::enqueue_routed_as_part`] signs a single-lane part.
    ///
    /// # Safety
    /// As [`IpcCollective::enqueue`], for every lane.
    pub unsafe fn enqueue_many_routed_as_part(
        &self,
        lanes: &[Io<'_>],
        route: Option<IpcRoute>,
        part: u32,
        stream: RawStream,
    ) -> Result<(), Error> {
        let mut order = self.lock_call()?;
        self.check()?;
        for io in lanes {
            self.check_address_space(Op::ReduceScatterMany, io)?;
        }
        let (calls, sig) = validate_many(lanes, self.rank, self.world, usize::MAX)?;
        let sig = sig.as_part(part);
        let bytes = sig.count as usize * sig.dtype.size();
        let route = route.unwrap_or_else(|| self.default_route(Op::ReduceScatterMany, bytes));
        let Some(ipc) = self.ipc_for(route)? else {
            self.device.bind()?;
            for l in &calls {
                self.copy_local(l.call.dst, l.call.src, l.call.bytes_out(), stream)?;
            }
            return Ok(());
        };
        self.device.bind()?;
        let (capacity, ll) = (self.config.capacity, ipc.layout.ll_capacity());
        let chunks = Chunks::many(&calls, sig, self.rank, self.world, route.route(), capacity, ll);
        let launch = |plan| {
            let p: ParamsMany = params::pack(&ipc.fixed, &plan, false, D::BACKEND)?;
            // SAFETY: the many-lane kernel takes `DcParams<32>`; addresses as in `enqueue`.
            unsafe { self.device.launch(&ipc.kernels, Launch::Many(&p), p.h.grid, stream) }.map_err(|e| self.fail(e))
        };
        // SAFETY: a live stream of this device (caller).
        unsafe { self.run_call(&mut order, stream, chunks, launch) }
    }

    /// Close: waits for a call another thread has in flight on this handle (bounded: its
    /// waits are), synchronises this rank's device (no kernel of ours may still read a peer),
    /// writes `CLOSE_ACK` into every peer's `ack[rank]` line, then
    /// * one process per rank: waits (bounded by `timeouts.close`) for every peer's
    ///   acknowledgement in its own block, unmaps the peers and frees its staging — or, on
    ///   timeout, keeps the staging allocated (a peer may still read it) and returns
    ///   `PeerTimeout`;
    /// * in-process group: returns; the shared allocations are freed with the last rank.
    fn close_now(&self) -> Result<(), Error> {
        self.closed.store(true, Ordering::Release);
        if let Some(m) = &self.lockstep {
            m.close();
        }
        // A call another thread has in flight on this handle ends first (its waits are
        // bounded by `timeouts.peer`): the mappings and staging freed below are what it reads,
        // and a call that took the lock before `closed` was set may not have launched yet.
        // Calls that take the lock after this see `closed`. (Before, close returned at once
        // while such a call still waited for its peers.)
        let _calls = self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(ipc) = &self.ipc else { return Ok(()) };
        self.device.synchronize()?;
        for q in (0..self.world).filter(|&q| q != self.rank) {
            self.device.write_word(ipc.mems[q].control + ipc.layout.ack(self.rank) as u64, CLOSE_ACK)?;
        }
        self.wait_acks_and_free(ipc)
    }

    /// Close of a process-mode rank: wait (bounded) until every peer acknowledged, then free.
    fn wait_acks_and_free(&self, ipc: &IpcState<D>) -> Result<(), Error> {
        let Owner::Process { own, mappings, .. } = &ipc.owner else { return Ok(()) };
        let base = ipc.mems[self.rank].control;
        let bound = self.config.timeouts().close;
        let read_ack = |off: usize| {
            let mut w = [0u64; 1];
            self.device.read_words(base + off as u64, &mut w)?;
            Ok(w[0])
        };
        let missing = close::first_missing_ack(&ipc.layout, self.rank, self.world, bound, read_ack, |q| {
            self.device.peer_exited(q)
        })?;
        // Our mappings of the peers' memory are no longer used by any kernel of ours.
        if let Ok(mut m) = mappings.lock() {
            m.clear();
        }
        let mut own =
            own.lock().map_err(|_| Error::Backend { backend: D::BACKEND, detail: "staging lock poisoned".into() })?;
        match (missing, own.take()) {
            (None, _) => Ok(()),
            // Its process is gone: nothing reads this rank's memory any more, so it is freed
            // (dropped here), and close says why the peer never acknowledged.
            (Some(MissingAck::Exited { peer, pid }), _) => {
                Err(Error::PeerDied { peer, detail: format!("its process {pid} exited without acknowledging close") })
            }
            (Some(MissingAck::Waited(peer)), staging) => {
                // A peer might still read our frames: keep them allocated rather than free
                // memory under it.
                if let Some(s) = staging {
                    D::leak_staging(s);
                }
                Err(Error::PeerTimeout { peer, what: "acknowledge close", waited: bound })
            }
        }
    }
}

impl<D: IpcDevice> Collective for IpcCollective<D> {
    type Stream = D::Stream;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn capabilities(&self) -> Capabilities {
        // Generations live on the device; graph capture is claimed only where it was tested.
        // Calls of any size: above the staging capacity they run in chunks.
        Capabilities::strict(self.config.capacity, D::GRAPH_CAPTURE).with_max_call_bytes(usize::MAX)
    }
    /// The table's route for `op` and `bytes`, as it runs (LL push above the LL slots runs
    /// one-shot: [`RouteSelect::route_taken`]).
    fn route(&self, op: Op, bytes: usize) -> Route {
        self.route_taken(op, bytes, self.default_route(op, bytes))
    }
    fn host_memory(&self) -> bool {
        D::VENDOR == Vendor::Host
    }
    fn check(&self) -> Result<(), Error> {
        IpcCollective::check(self)
    }
    fn synchronize(&self, stream: &D::Stream) -> Result<(), Error> {
        let s = self.device.raw_stream(stream)?;
        // SAFETY: the stream is this device's (checked by `raw_stream`).
        unsafe { self.device.synchronize_stream(s) }.map_err(|e| self.fail(e))?;
        IpcCollective::check(self)
    }
    /// The one entry of single-lane calls: the op goes to `enqueue` as a value.
    fn call(&self, op: Op, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        let s = self.device.raw_stream(stream)?;
        if op == Op::ReduceScatterMany {
            // SAFETY: the stream is this device's (checked); views from host slices (the safe
            // `Io::host`) are refused by `enqueue_many` on a device that is not the host, the
            // others' validity is the contract of their (unsafe) constructors, documented on
            // this type.
            return unsafe { self.enqueue_many(&[io], s) };
        }
        // SAFETY: as above.
        unsafe { self.enqueue(op, io, s) }
    }
    fn call_as_part(&self, op: Op, io: Io<'_>, part: u32, stream: &D::Stream) -> Result<(), Error> {
        let s = self.device.raw_stream(stream)?;
        if op == Op::ReduceScatterMany {
            // SAFETY: as in `call`.
            return unsafe { self.enqueue_many_routed_as_part(&[io], None, part, s) };
        }
        // SAFETY: as in `call`.
        unsafe { self.enqueue_routed_as_part(op, io, None, part, s) }
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
        let s = self.device.raw_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue_many(lanes, s) }
    }
    /// Signed with `part` by this backend's own route ([`IpcCollective::default_route`], as
    /// `reduce_scatter_many` takes; part 0 is that call). Not the trait's default, which drops
    /// `part`: a caller of the trait method (any composite but the factory's front door, which
    /// goes through `RouteSelect`) would run an unsigned call, so ranks one call apart would
    /// pair and return `Ok` with one another's data.
    fn reduce_scatter_many_as_part(&self, lanes: &[Io<'_>], part: u32, stream: &D::Stream) -> Result<(), Error> {
        let s = self.device.raw_stream(stream)?;
        // SAFETY: as in `call`.
        unsafe { self.enqueue_many_routed_as_part(lanes, None, part, s) }
    }
    /// Poisons this handle with `cause`, then tells the peers at once: this rank's status word
    /// (the one its kernels set on their own first failure, which every peer's wait polls)
    /// takes `ERR_ABANDONED` where no failure is recorded there yet, so a peer waiting for
    /// this rank — the node's other ranks in the hierarchical route's last step, when this
    /// rank's step across nodes failed — fails with `PeerFailed` at its next poll instead of
    /// `PeerTimeout` at its own bound (ranks sharing a GPU in one process, at their launch
    /// barrier: `Poisoned` naming this rank). The poison comes first: a call of this handle that
    /// the word then stops (its kernels give up without a record; on the host the executor's
    /// launch reports it) reads `Poisoned`, never `Ok`. Best effort, and it does not wait for
    /// a call in flight; nothing is written after `close` freed the staging or from a forked
    /// child (the memory is not this process's).
    fn abandon(&self, cause: &str) {
        self.poison.set(cause);
        if !self.process.is_current() {
            return;
        }
        // Ranks sharing this GPU in one process wait for each other before every launch too.
        if let Some(m) = &self.lockstep {
            m.abandon(cause);
        }
        let Some(ipc) = &self.ipc else { return };
        // The status line is in this rank's staging, kept alive while it is written: a
        // process's own staging under the lock its close frees it under (gone: nothing to
        // tell), an in-process group's with the group. Not the calls lock: a call in flight
        // on another thread (a watchdog aborting a call that waits for a peer, as
        // `ncclCommAbort` does) must stop now, not when its wait times out — its kernel or
        // executor sees the word and gives up, and the call reads `Poisoned`.
        let _alive = match &ipc.owner {
            Owner::Process { own, .. } => {
                let own = own.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if own.is_none() {
                    return;
                }
                Some(own)
            }
            Owner::Group(_) => None,
        };
        let abort = ipc.mems[self.rank].control + (ipc.layout.status() + 8 * status::ST_ABORT) as u64;
        let mut word = [0u64; 1];
        if self.device.bind().is_ok() && self.device.read_words(abort, &mut word).is_ok() && word[0] == 0 {
            // Best effort: a failure here leaves the peers their own bounds.
            let _ = self.device.write_word(abort, status::ERR_ABANDONED);
        }
    }
    /// See `close_now` for what close waits for. A second close returns `Ok` after a
    /// successful one and [`Error::CloseFailed`] after a failed one.
    fn close(&self) -> Result<(), Error> {
        if !self.process.is_current() {
            // A forked child: the device state and the peers' memory are the parent's.
            return Err(self.process.foreign());
        }
        self.close_once.run(|| self.close_now())
    }
}

impl<D: IpcDevice> RouteSelect for IpcCollective<D> {
    /// LL push runs one-shot where the call's payload exceeds the LL slots (`Plan::single_fitted`):
    /// the whole input (all_reduce, all_gather) or one shard (reduce_scatter).
    fn route_taken(&self, op: Op, bytes: usize, route: IpcRoute) -> Route {
        if route != IpcRoute::PushLl || op == Op::ReduceScatterMany {
            return route.route();
        }
        let Ok(Some(ipc)) = self.ipc_for(route) else { return route.route() };
        let payload = if op == Op::ReduceScatter { bytes / self.world } else { bytes };
        if payload <= ipc.layout.ll_capacity() { Route::IpcPushLl } else { Route::IpcOneShot }
    }
    fn call_on_route_as_part(
        &self,
        op: Op,
        io: Io<'_>,
        route: IpcRoute,
        part: u32,
        stream: &D::Stream,
    ) -> Result<(), Error> {
        if op == Op::ReduceScatterMany {
            return Err(Error::InvalidConfig { detail: "reduce_scatter_many takes reduce_scatter_many's call".into() });
        }
        let s = self.device.raw_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue_routed_as_part(op, io, Some(route), part, s) }
    }
    fn reduce_scatter_many_on_route_as_part(
        &self,
        lanes: &[Io<'_>],
        route: IpcRoute,
        part: u32,
        stream: &D::Stream,
    ) -> Result<(), Error> {
        let s = self.device.raw_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue_many_routed_as_part(lanes, Some(route), part, s) }
    }
}

impl<D: IpcDevice> Drop for IpcCollective<D> {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Where the norm of a fused call's all_reduce runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Epilogue {
    /// In the all_reduce's last launch (`Launch::SingleNorm`).
    InLastLaunch,
    /// After it, launched by the caller.
    Caller,
}
