//! Kernel parameters (mirrors of the structs in kernels/detcoll_protocol.h), packing a
//! protocol [`Plan`] into them, and the launch shape — shared by the GPU twins (`cuda-ipc`,
//! `hip-ipc`), which only add their runtime's launch call. Pure host code: addresses are `u64`.
//!
//! Moved verbatim from `crates/cuda-ipc/src/launch.rs` (only the backend name of the
//! "too many segments" error became a parameter of [`pack`]).
use super::{Layout, Phase, Plan};
use crate::norm::NormParams;
use collective_core::{DType, Error, Op, Route, check_node_world_size};

/// Must equal `DC_ABI_VERSION` in the kernels (checked when a module is loaded).
pub const ABI_VERSION: u32 = 12;
/// Threads per block (the kernels' `__launch_bounds__`).
pub const THREADS: u32 = 512;
/// Frame bytes per tile: tile `t` belongs to block `t % grid` in every phase on every rank.
/// One 16-byte vector per thread of a 512-thread block.
pub const TILE_BYTES: u32 = 16 * THREADS;
/// The wide tile: two 16-byte vectors per thread, for fused all_reduce + RMSNorm calls whose
/// f16/bf16 rows of 8192 fall in whole-row shards on bulk push and RS+AG (ipc-engine's
/// `IpcCollective::fused_tile`): a row is then a tile, so one block holds it in registers
/// (the row forms inside the protocol, kernels/detcoll_norm.h). Every rank of such a call
/// takes it (chosen from signed values only), so the tile -> block mapping is the same on
/// every rank.
pub const WIDE_TILE_BYTES: u32 = 2 * TILE_BYTES;
/// Most ranks.
pub const MAX_WORLD: usize = 8;
/// Segments of a single-lane call's parameters (`DC_SEGS_SINGLE`).
pub const SEGS_SINGLE: usize = 16;
/// Segments of a `reduce_scatter_many` call's parameters (`DC_SEGS_MANY`).
pub const SEGS_MANY: usize = 32;

pub const SEG_WRITE_BACK: u32 = 1;
pub const SEG_GATHER: u32 = 2;
/// Push route, send list: write `src` into this rank's slot of every peer.
pub const SEG_SEND: u32 = 4;
/// Push route, send list: write shard `q` (`src + q * bytes`) into this rank's slot of peer `q`.
pub const SEG_SCATTER: u32 = 8;

/// `DcHeader::mode`: the pull protocol (stage, flags, read peers' frames).
pub const MODE_PULL: u32 = 0;
/// `DcHeader::mode`: the LL push protocol (write peers' slots, poll own slots).
pub const MODE_PUSH_LL: u32 = 1;
/// `DcHeader::mode`: the bulk push protocol (write peers' frames, one released flag per block).
pub const MODE_PUSH: u32 = 2;
/// Bulk push, send list: write `src` into peer `peer`'s frame at `frame_off`.
pub const SEG_SEND_TO: u32 = 16;
/// Bulk push, send list: the data is gathered (all_gather), signalled by the phase-1 AG flag.
pub const SEG_AG: u32 = 32;
/// The fewest rows for which a fused launch's norm reads the gathered sums in place
/// ([`CollectiveNormParams::new`]). Its warp per row is latency-bound on few rows: on one H200
/// it was 1.3-1.7x the two launches at 128 rows and slower than the block form of the epilogue
/// at 64 (RS+AG, worlds 4/8), 3-13 % faster than the two launches from 512 rows
/// (benches/results/h200-2026-12-03-fused-norm-gathered.md). The front door's
/// `GATHERED_MIN_ROWS`.
pub const NORM_GATHERED_MIN_ROWS: usize = 512;
/// Phase 2 of a fused norm launch read in place ([`CollectiveNormParams::new`]): the
/// protocol skips the segment's copy and the norm reads the peer's reduced shard where the
/// copy would have read it.
pub const SEG_NORM_READ: u32 = 64;

/// One contiguous piece of work (`DcSeg`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Seg {
    pub ptr: u64,
    /// Push route: this rank's own values (send source, or the own leaf of a reduce / the
    /// own shard of a gather); 0 on the pull routes.
    pub src: u64,
    pub frame_off: u64,
    pub bytes: u64,
    pub peer: u32,
    pub flags: u32,
}

/// Everything but the segments (`DcHeader`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Header {
    /// Every rank's control block, in rank order.
    pub ctl: [u64; MAX_WORLD],
    /// Every rank's frame 0, in rank order (frame 1 is `frame[1]` bytes further).
    pub data: [u64; MAX_WORLD],
    pub err: u64,
    pub timeout_ns: u64,
    pub sig: [u64; 2],
    pub frame: [u64; 2],
    pub off_status: u32,
    pub off_sig0: u32,
    pub off_sig1: u32,
    pub off_ready: u32,
    pub off_phase2: u32,
    pub line: u32,
    pub digest: u32,
    pub rank: u32,
    pub world: u32,
    pub layout_blocks: u32,
    pub grid: u32,
    pub dtype: u32,
    pub tile_bytes: u32,
    pub nstage: u32,
    pub nphase1: u32,
    pub nphase2: u32,
    /// `ack[0]` of the own control block: a peer's close acknowledgement ends a wait on it.
    pub off_ack: u32,
    /// Push header of sender 0, parity 0 (`Layout::push_header`); sender `q` of parity `p` at
    /// `off_push + (p * 8 + q) * line`.
    pub off_push: u32,
    /// Start of the LL area in every control block (`Layout::ll_area`).
    pub off_ll: u32,
    /// Bytes of one LL slot (`Layout::ll_slot_bytes`); slot `(p, q)` at `off_ll + (p * world +
    /// q) * ll_slot`.
    pub ll_slot: u32,
    /// [`MODE_PULL`], [`MODE_PUSH_LL`] or [`MODE_PUSH`].
    pub mode: u32,
    /// Bulk push flag of phase 0, block 0, sender 0 (`Layout::push_flag`); phase `k`, block
    /// `b`, sender `q` at `off_pflag + ((k * layout_blocks + b) * 8 + q) * line`.
    pub off_pflag: u32,
    /// Bulk push: bytes between two senders' slots in a frame.
    pub push_stride: u64,
    /// Bulk push: frame offset of the reduced-shard slots.
    pub push_ag: u64,
}

/// `DcParams<N>`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Params<const N: usize> {
    pub h: Header,
    pub seg: [Seg; N],
}

/// Single-lane calls: 1 stage + up to 8 phase-1 + 7 phase-2 segments.
pub type ParamsSingle = Params<SEGS_SINGLE>;
/// `reduce_scatter_many`: up to 16 stage + 16 phase-1 segments.
pub type ParamsMany = Params<SEGS_MANY>;

/// `DcCollectiveNormParams` (kernels/detcoll_norm.h): the fused all_reduce + residual +
/// RMSNorm launch (`detcoll_collective_norm`), the last launch of a fused call: its collective,
/// then the norm of every row as the kernel's epilogue.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollectiveNormParams {
    pub call: ParamsSingle,
    pub norm: NormParams,
}

impl CollectiveNormParams {
    /// The fused launch of `call` (the call's last launch) with the norm `norm` as its
    /// epilogue. With `reads_gathered` (a runtime whose kernel has the gathered-sum form: CUDA,
    /// and the host executor), at least [`NORM_GATHERED_MIN_ROWS`] rows and
    /// [`can_read_gathered`](Self::can_read_gathered), every phase-2 segment is flagged
    /// [`SEG_NORM_READ`]: the launch skips their copies into the output and the norm reads those
    /// sums in place, one warp per row (`dc_norm_rows_gathered`); fewer rows keep the block form
    /// after the copies — except in the shape of the row forms inside the protocol
    /// ([`shard_rows`](Self::shard_rows)), flagged at any row count: it reads each row once, in
    /// registers, with no warp per row. This is a rank's own choice: its peers' memory and
    /// flags are the same either way.
    pub fn new(call: ParamsSingle, norm: NormParams, reads_gathered: bool) -> CollectiveNormParams {
        let mut fused = CollectiveNormParams { call, norm };
        let rows = usize::try_from(fused.norm.rows).unwrap_or(usize::MAX);
        let enough = rows >= NORM_GATHERED_MIN_ROWS || fused.shard_rows_shape();
        if reads_gathered && enough && fused.can_read_gathered() {
            let h = &fused.call.h;
            let first = (h.nstage + h.nphase1) as usize;
            for s in &mut fused.call.seg[first..first + h.nphase2 as usize] {
                s.flags |= SEG_NORM_READ;
            }
        }
        fused
    }

    /// Whether the norm can read the phase-2 sums where they lie: the pull or bulk push route
    /// with a phase 2 (RS+AG and bulk push all_reduce), the norm's vector path
    /// ([`NormParams::vector_ok`]), and every phase-2 segment a range of the norm's `sum` whose
    /// output, size and source (in either frame) are 16-byte aligned — so no vector of the norm
    /// straddles two sources.
    pub fn can_read_gathered(&self) -> bool {
        let (h, n) = (&self.call.h, &self.norm);
        if h.nphase2 == 0 || (h.mode != MODE_PULL && h.mode != MODE_PUSH) || !n.vector_ok() {
            return false;
        }
        let first = (h.nstage + h.nphase1) as usize;
        let Some(segs) = self.call.seg.get(first..first + h.nphase2 as usize) else { return false };
        let size = if n.dtype == DType::F32 as u32 { 4 } else { 2 };
        let Some(end) = n.rows.checked_mul(u64::from(n.hidden) * size).and_then(|b| b.checked_add(n.sum)) else {
            return false;
        };
        segs.iter().all(|s| {
            let within = s.ptr >= n.sum && s.ptr.checked_add(s.bytes).is_some_and(|e| e <= end);
            let aligned = |frame: u64| self.gather_source(s, frame).is_some_and(|b| b % 16 == 0);
            within && (s.ptr | s.bytes) % 16 == 0 && aligned(h.frame[0]) && aligned(h.frame[1])
        })
    }

    /// Where the phase-2 copy of `s` reads its first byte in frame `frame` (`dc_run_segment`'s
    /// gather on the pull route, `dc_bulk_gather` on bulk push); `None` for a rank outside the
    /// header.
    fn gather_source(&self, s: &Seg, frame: u64) -> Option<u64> {
        let h = &self.call.h;
        let frame_of = |q: u32| h.data.get(q as usize).map(|d| d.wrapping_add(frame).wrapping_add(s.frame_off));
        match (h.mode, s.peer == h.rank) {
            (MODE_PUSH, true) => Some(s.src),
            (MODE_PUSH, false) => frame_of(h.rank),
            _ => frame_of(s.peer),
        }
    }

    /// The address of the sum of byte `o` of the norm's `sum` (the first of a 16-byte vector)
    /// in a launch that [reads the gathered sums](Self::reads_gathered), `frame` the call's
    /// frame offset (`frame[g % 2]`): where the skipped phase-2 copy of its segment would have
    /// read it, or `sum` itself (`dc_norm_sum_at`; the host executor's norm uses this).
    pub fn sum_at(&self, frame: u64, o: u64) -> u64 {
        let (h, a) = (&self.call.h, self.norm.sum + o);
        let first = (h.nstage + h.nphase1) as usize;
        for s in &self.call.seg[first..first + h.nphase2 as usize] {
            let rel = a.wrapping_sub(s.ptr);
            if rel < s.bytes {
                // A flagged launch's sources exist (can_read_gathered).
                return self.gather_source(s, frame).map_or(a, |base| base.wrapping_add(rel));
            }
        }
        a
    }

    /// Whether the launch's norm reads the gathered sums in place (see [`new`](Self::new)).
    pub fn reads_gathered(&self) -> bool {
        let h = &self.call.h;
        h.nphase2 != 0
            && self.call.seg.get((h.nstage + h.nphase1) as usize).is_some_and(|s| s.flags & SEG_NORM_READ != 0)
    }

    /// Blocks of the fused launch. When the protocol's blocks write whole rows of the sum
    /// ([`local_group`](Self::local_group)), exactly the collective's grid: each block then
    /// normalises the rows it reduced, with no barrier of the launch. Otherwise the collective's
    /// grid, or more (up to `max_grid`, the most the protocol keeps resident) when there are more
    /// rows to normalise (a block per row, or per [`THREADS`]` / 32` rows when the norm reads
    /// the gathered sums: a warp per row); blocks beyond the collective's grid only run the norm.
    pub fn grid(&self, max_grid: u32) -> u32 {
        if self.local_group() != 0 || self.shard_rows() {
            return self.call.h.grid;
        }
        let per_block = if self.reads_gathered() { u64::from(THREADS / 32) } else { 1 };
        let blocks = u32::try_from(self.norm.rows.div_ceil(per_block)).unwrap_or(u32::MAX);
        self.call.h.grid.max(blocks.min(max_grid))
    }

    /// Whether the launch takes a row form inside the protocol (on CUDA): the bulk rows form
    /// on bulk push (`dc_norm_bulk_rows`, kernels/detcoll_norm.h) or the RS+AG rows form on
    /// RS+AG (`dc_norm_rsag_rows`): it [reads the gathered sums](Self::reads_gathered) and has
    /// [the forms' shape](Self::shard_rows_shape). Each block then reduces and normalises the
    /// own shard's rows of its tiles in registers and, after phase 2, normalises the peers'
    /// rows of its tiles where their reduced shards lie: the launch has exactly the
    /// collective's grid and no barrier. The kernel decides the same from the same parameters;
    /// the host's answer only sizes the grid (the host executor runs such a launch as the
    /// gathered-sum form: the same bits).
    pub fn shard_rows(&self) -> bool {
        self.reads_gathered() && self.shard_rows_shape()
    }

    /// The row forms' shape: [the cut](Self::shard_rows_cut), on the norm's vector path, and
    /// on bulk push the input 16-byte aligned (its own leaf is read from there with 16-byte
    /// loads; `dc_norm_protocol_rows`). Those two are this rank's own addresses: a rank
    /// without them takes the gathered-sum form in the same frames, flags and tiles, which
    /// pairs with its peers' row forms.
    pub fn shard_rows_shape(&self) -> bool {
        let h = &self.call.h;
        if !self.norm.vector_ok() || !self.shard_rows_cut() {
            return false;
        }
        h.mode == MODE_PULL || self.call.seg[h.nstage as usize].src.is_multiple_of(16)
    }

    /// The cut the row forms need, from signed values only (the route, the dtype, `hidden`,
    /// the rows and where the plan's segments lie relative to the sum and in the frames: the
    /// same on every rank): the bulk push route, or RS+AG (the pull route with a phase 2),
    /// with one reduce segment and a phase 2, f16/bf16 rows that are a protocol tile (hidden
    /// 4096 in 8 KiB tiles, 8192 in [`WIDE_TILE_BYTES`]) or two rows of 4096 to a
    /// [`WIDE_TILE_BYTES`] tile (the forms' pairs, `dc_norm_row_pair_in_regs`), and the reduce
    /// and phase-2 segments whole tiles of the sum that together are all of it (the launch's
    /// rows) — on RS+AG also each a tile into the frames, where its tiles are counted from.
    pub fn shard_rows_cut(&self) -> bool {
        let (h, n) = (&self.call.h, &self.norm);
        let two_bytes = n.dtype == DType::F16 as u32 || n.dtype == DType::BF16 as u32;
        let (row, tile) = (u64::from(n.hidden) * 2, u64::from(h.tile_bytes));
        let (push, pull) = (h.mode == MODE_PUSH, h.mode == MODE_PULL);
        if !(push || pull) || h.nphase1 != 1 || h.nphase2 == 0 || !two_bytes {
            return false;
        }
        let row_a_tile = (h.tile_bytes == TILE_BYTES || h.tile_bytes == WIDE_TILE_BYTES) && row == tile;
        let pairs = h.tile_bytes == WIDE_TILE_BYTES && 2 * row == tile;
        if !(row_a_tile || pairs) {
            return false;
        }
        let first = h.nstage as usize;
        let Some(segs) = self.call.seg.get(first..first + 1 + h.nphase2 as usize) else { return false };
        let Some(end) = n.rows.checked_mul(row) else { return false };
        let mut covered = 0u64;
        for s in segs {
            let Some(rel) = s.ptr.checked_sub(n.sum) else { return false };
            if rel % tile != 0 || s.bytes % tile != 0 || rel.checked_add(s.bytes).is_none_or(|e| e > end) {
                return false;
            }
            if pull && s.frame_off % tile != 0 {
                return false;
            }
            covered = covered.saturating_add(s.bytes);
        }
        segs[0].flags & SEG_GATHER == 0 && covered == end
    }

    /// Rows per protocol tile when a launch of exactly the collective's grid has every block
    /// write whole rows of the sum and nothing else write it, 0 otherwise: the launch is the
    /// call's only one (its single reduce segment is the whole sum, from frame offset 0), on the
    /// LL push or the one-shot pull route (no phase 2), and a row divides the tile (hidden 4096
    /// in f16/bf16, 2048 in f32, or a divisor of those). Tile `t` is block `t % grid`'s, so
    /// block `b` reduced the rows of units `b, b + grid, ...` of this many rows each.
    ///
    /// The kernel decides the same from the same parameters (`dc_norm_local_group`,
    /// kernels/detcoll_norm.h); the host's answer only sizes the grid.
    pub fn local_group(&self) -> u32 {
        let h = &self.call.h;
        if h.mode == MODE_PUSH || h.nphase1 != 1 || h.nphase2 != 0 {
            return 0;
        }
        let Some(s) = self.call.seg.get(h.nstage as usize) else { return 0 };
        let size = if self.norm.dtype == DType::F32 as u32 { 4 } else { 2 };
        let row = u64::from(self.norm.hidden) * size;
        let tile = u64::from(h.tile_bytes);
        let whole = self.norm.rows.checked_mul(row) == Some(s.bytes);
        if s.flags & SEG_GATHER != 0 || s.frame_off != 0 || s.ptr != self.norm.sum || !whole {
            return 0;
        }
        if row == 0 || row > tile || tile % row != 0 {
            return 0;
        }
        (tile / row) as u32
    }
}

/// `DcTreeParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TreeParams {
    pub input: [u64; MAX_WORLD],
    pub out: u64,
    pub count: u64,
    pub world: u32,
    pub dtype: u32,
}

impl TreeParams {
    /// The parameters of one fused-tree launch (`detcoll_tree`): `out[i] = tree(inputs[0][i],
    /// ..., inputs[W-1][i])` for `i < count`, `W = inputs.len()`, in `dtype`'s arithmetic.
    ///
    /// Refuses (typed errors, before any launch) a `W` outside `1..=`[`collective_core::MAX_NODE_WORLD_SIZE`],
    /// a dtype without an add, and any address not aligned to the element size. Shared by the
    /// CUDA and HIP host wrappers of the kernel.
    pub fn pack(inputs: &[u64], out: u64, count: usize, dtype: DType) -> Result<TreeParams, Error> {
        let world = inputs.len();
        check_node_world_size(world)?;
        if !dtype.is_reducible() {
            return Err(Error::UnsupportedDtype { op: Op::AllReduce, dtype });
        }
        let mut input = [0u64; MAX_WORLD];
        input[..world].copy_from_slice(inputs);
        for (argument, addr) in inputs.iter().map(|a| ("inputs[i]", *a)).chain([("out", out)]) {
            if addr % dtype.size() as u64 != 0 {
                return Err(Error::Misaligned { op: Op::AllReduce, argument, addr, align: dtype.size() });
            }
        }
        Ok(TreeParams { input, out, count: count as u64, world: world as u32, dtype: dtype as u32 })
    }
}

/// `DcCopyParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyParams {
    pub dst: u64,
    pub src: u64,
    pub bytes: u64,
}

/// Blocks of the world-1 copy kernel for `bytes`: one 16-byte vector per thread, at most
/// `max_grid`.
pub fn copy_grid(bytes: usize, max_grid: u32) -> u32 {
    (bytes.div_ceil(TILE_BYTES as usize) as u64).clamp(1, u64::from(max_grid.max(1))) as u32
}

const _: () = assert!(size_of::<Seg>() == 40);
const _: () = assert!(size_of::<Header>() == 280);
const _: () = assert!(size_of::<ParamsSingle>() == 280 + 16 * 40);
const _: () = assert!(size_of::<TreeParams>() == 88);
const _: () = assert!(size_of::<CollectiveNormParams>() == size_of::<ParamsSingle>() + size_of::<NormParams>());

/// Where one rank's protocol memory is, as the kernels address it (see [`Layout`] for the two
/// placements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankMemory {
    /// Start of the rank's control block (header, status, signatures, flags, acks).
    pub control: u64,
    /// Start of the rank's frame 0; frame 1 follows [`Layout::frame_stride`] bytes later.
    pub frames: u64,
}

impl RankMemory {
    /// Control block and frames in one allocation at `base` (CUDA, CPU twin).
    pub const fn one_allocation(layout: &Layout, base: u64) -> RankMemory {
        RankMemory { control: base, frames: base + layout.frame(0) as u64 }
    }
}

/// Per-rank constants of every launch: filled once at construction.
#[derive(Debug, Clone, Copy)]
pub struct Fixed {
    pub header: Header,
    pub max_grid: u32,
    pub threads: u32,
}

impl Fixed {
    /// The constant part of every launch of `rank` over the ranks' memory `mems` (rank order).
    pub fn new(layout: &Layout, mems: &[RankMemory], rank: usize, err: u64, timeout_ns: u64, threads: u32) -> Fixed {
        let mut ctl = [0u64; MAX_WORLD];
        let mut data = [0u64; MAX_WORLD];
        for (q, m) in mems.iter().enumerate().take(MAX_WORLD) {
            ctl[q] = m.control;
            data[q] = m.frames;
        }
        let header = Header {
            ctl,
            data,
            err,
            timeout_ns,
            sig: [0; 2],
            frame: [0, layout.frame_stride() as u64],
            off_status: layout.status() as u32,
            off_sig0: layout.sig_slot(0) as u32,
            off_sig1: layout.sig_slot(1) as u32,
            off_ready: layout.ready(0) as u32,
            off_phase2: layout.phase2(0) as u32,
            line: (layout.ready(1) - layout.ready(0)) as u32,
            digest: 0,
            rank: rank as u32,
            world: mems.len() as u32,
            layout_blocks: layout.blocks() as u32,
            grid: 1,
            dtype: 0,
            tile_bytes: TILE_BYTES,
            nstage: 0,
            nphase1: 0,
            nphase2: 0,
            off_ack: layout.ack(0) as u32,
            off_push: layout.push_header(0, 0) as u32,
            off_ll: layout.ll_area() as u32,
            ll_slot: layout.ll_slot_bytes() as u32,
            mode: MODE_PULL,
            off_pflag: layout.push_flag(0, 0, 0) as u32,
            push_stride: 0,
            push_ag: 0,
        };
        Fixed { header, max_grid: layout.blocks() as u32, threads }
    }

    /// Blocks for a call staging `bytes` per rank: one per tile, at most `max_grid`, at least 1
    /// (every call publishes and waits, empty ones included, so generations stay in step).
    /// A function of the signature and the configuration only, hence equal on every rank.
    pub fn grid(&self, bytes: u64) -> u32 {
        self.grid_of_tiles(bytes, TILE_BYTES)
    }

    /// [`Fixed::grid`] for tiles of `tile` bytes (a call's `tile_bytes`).
    pub fn grid_of_tiles(&self, bytes: u64, tile: u32) -> u32 {
        let tiles = bytes.div_ceil(u64::from(tile.max(1)));
        tiles.clamp(1, u64::from(self.max_grid)) as u32
    }
}

fn too_many(backend: &'static str, what: &str) -> Error {
    Error::Backend { backend, detail: format!("plan has more {what} segments than the kernel parameters hold") }
}

/// Packs `plan` into kernel parameters with `N` segment slots.
///
/// `skip_self_gather`: an in-place all_gather's own shard is already in place, so the copy of
/// this rank's frame back over it is dropped. `backend` names the caller in the error returned
/// when the plan does not fit.
pub fn pack<const N: usize>(
    fixed: &Fixed,
    plan: &Plan,
    skip_self_gather: bool,
    backend: &'static str,
) -> Result<Params<N>, Error> {
    pack_tiled(fixed, plan, skip_self_gather, backend, TILE_BYTES)
}

/// [`pack`] with tiles of `tile` bytes ([`TILE_BYTES`], or [`WIDE_TILE_BYTES`] for the
/// fused calls ipc-engine's `IpcCollective::fused_tile` gives it): the header's `tile_bytes`
/// and a grid of a block per tile.
pub fn pack_tiled<const N: usize>(
    fixed: &Fixed,
    plan: &Plan,
    skip_self_gather: bool,
    backend: &'static str,
    tile: u32,
) -> Result<Params<N>, Error> {
    let mut p = Params::<N> { h: fixed.header, seg: [Seg::default(); N] };
    p.h.tile_bytes = tile;
    let size = plan.sig.dtype.size() as u64;
    let rank = fixed.header.rank as usize;
    let mut n = 0usize;
    let mut push = |s: Seg, what: &str| -> Result<(), Error> {
        if n >= N {
            return Err(too_many(backend, what));
        }
        p.seg[n] = s;
        n += 1;
        Ok(())
    };
    let push_route = matches!(plan.route, Route::IpcPushLl | Route::IpcPush);
    let gathered = if plan.sig.op == Op::AllGather { SEG_AG } else { 0 };
    let mut nstage = 0u32;
    for s in plan.stage.as_slice() {
        let (flags, peer) = match s.phase {
            Phase::Send => (SEG_SEND, 0),
            Phase::Scatter => (SEG_SCATTER, 0),
            Phase::SendTo => (SEG_SEND_TO | gathered, s.peer as u32),
            _ => (0, 0),
        };
        push(
            Seg {
                ptr: s.src,
                src: s.src,
                frame_off: s.frame_offset as u64 * size,
                bytes: s.count as u64 * size,
                peer,
                flags,
            },
            "stage",
        )?;
        nstage += 1;
    }
    let mut nphase1 = 0u32;
    for s in plan.phase1.as_slice() {
        let flags = match s.phase {
            Phase::Gather => SEG_GATHER,
            _ => {
                if s.write_back {
                    SEG_WRITE_BACK
                } else {
                    0
                }
            }
        };
        if s.phase == Phase::Gather && skip_self_gather && s.peer == rank {
            continue;
        }
        push(
            Seg {
                ptr: s.dst,
                src: if push_route { s.src } else { 0 },
                frame_off: s.frame_offset as u64 * size,
                bytes: s.count as u64 * size,
                peer: s.peer as u32,
                flags,
            },
            "phase-1",
        )?;
        nphase1 += 1;
    }
    let mut nphase2 = 0u32;
    for s in plan.phase2.as_slice() {
        push(
            Seg {
                ptr: s.dst,
                src: 0,
                frame_off: s.frame_offset as u64 * size,
                bytes: s.count as u64 * size,
                peer: s.peer as u32,
                flags: SEG_GATHER,
            },
            "phase-2",
        )?;
        nphase2 += 1;
    }
    let [w0, w1] = plan.sig.pack();
    p.h.sig = [w0, w1];
    p.h.digest = plan.sig.digest();
    p.h.dtype = plan.sig.dtype as u32;
    // Push routes: blocks by the payload one peer receives (LL; reduce_scatter sends shards)
    // or by the slot (bulk: a shard, all_gather's input).
    (p.h.grid, p.h.mode) = match plan.route {
        Route::IpcPushLl => (fixed.grid_of_tiles(plan.push_payload_bytes() as u64, tile), MODE_PUSH_LL),
        Route::IpcPush => (fixed.grid_of_tiles(plan.slot_stride as u64 * size, tile), MODE_PUSH),
        _ => (fixed.grid_of_tiles(plan.sig.count * size, tile), MODE_PULL),
    };
    p.h.push_stride = plan.slot_stride as u64 * size;
    p.h.push_ag = plan.ag_base as u64 * size;
    p.h.nstage = nstage;
    p.h.nphase1 = nphase1;
    // Nonzero exactly on the RS+AG route (world >= 2 there, so every rank gathers from at
    // least one peer); the kernel also uses it to know which phase-2 flags this call uses.
    p.h.nphase2 = nphase2;
    Ok(p)
}

/// The layout words of the `detcoll_abi` table every kernel image must export for this host
/// code: `[ABI_VERSION, sizeof DcParams<16>, sizeof DcParams<32>, sizeof DcTreeParams,
/// sizeof DcSeg, sizeof DcCopyParams, sizeof DcNormParams]`; the table's last word is the
/// image's world set ([`check_abi`]).
pub const fn abi_table() -> [u32; ABI_WORDS - 1] {
    [
        ABI_VERSION,
        size_of::<ParamsSingle>() as u32,
        size_of::<ParamsMany>() as u32,
        size_of::<TreeParams>() as u32,
        size_of::<Seg>() as u32,
        size_of::<CopyParams>() as u32,
        size_of::<NormParams>() as u32,
    ]
}

/// Words of the `detcoll_abi` table: the layout ([`abi_table`]), then the world set.
pub const ABI_WORDS: usize = 8;

/// The world set of an image of every world 1..=8 (`DC_WORLDS`' default: bit `w` for world `w`),
/// what prebuilt images and the HIP build carry.
pub const EVERY_WORLD: u16 = 0x1FE;

/// Checks the `detcoll_abi` table a kernel image exports: `Ok` with its world set (bit `w` for
/// world `w`, `DC_WORLDS`) when its layout words are this crate's ([`abi_table`]) and the set is
/// one of worlds 1..=8; otherwise what differs. An image built for some worlds only
/// (`-DDC_WORLDS=...`) must never be taken for one of every world: a launch for a world it
/// lacks traps and poisons the context.
pub fn check_abi(got: &[u32; ABI_WORDS]) -> Result<u16, String> {
    let want = abi_table();
    let (layout, worlds) = got.split_at(ABI_WORDS - 1);
    if layout != want {
        return Err(format!("kernels export {layout:?}, this crate expects {want:?}"));
    }
    match u16::try_from(worlds[0]) {
        Ok(set) if set != 0 && set & !EVERY_WORLD == 0 => Ok(set),
        _ => Err(format!("world set {:#x} is not a set of worlds 1..=8", worlds[0])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collective_core::{DType, Io, Op, RawMut, RawRef, Route, validate, validate_many};
    use core::mem::offset_of;

    // Mirrored by hand from kernels/detcoll_protocol.h (`DcSeg`, `DcHeader`, `DcParams<N>`,
    // `DcTreeParams`, `DcCopyParams`, natural C alignment): byte offsets of every field.
    const DC_ABI_VERSION: u32 = 12;
    const DC_MAX_WORLD: usize = 8;
    const DC_THREADS: u32 = 512;
    const DC_SEGS_SINGLE: usize = 16;
    const DC_SEGS_MANY: usize = 32;
    const DC_SEG_WRITE_BACK: u32 = 1;
    const DC_SEG_GATHER: u32 = 2;
    const DC_SEG_SEND: u32 = 4;
    const DC_SEG_SCATTER: u32 = 8;
    const DC_MODE_PULL: u32 = 0;
    const DC_MODE_PUSH_LL: u32 = 1;
    const DC_MODE_PUSH: u32 = 2;
    const DC_SEG_SEND_TO: u32 = 16;
    const DC_SEG_AG: u32 = 32;
    const SEG_OFFSETS: [usize; 6] = [0, 8, 16, 24, 32, 36];
    const SEG_SIZE: usize = 40;
    const HEADER_U64_OFFSETS: [usize; 7] = [0, 64, 128, 136, 144, 160, 176]; // ctl, data, err, timeout_ns, sig, frame, end
    const HEADER_U32_FIRST: usize = 176; // off_status .. off_pflag: 22 u32 in declaration order
    const HEADER_TAIL_U64: [usize; 2] = [264, 272]; // push_stride, push_ag
    const HEADER_SIZE: usize = 280;
    const TREE_OFFSETS: [usize; 4] = [64, 72, 80, 84]; // out, count, world, dtype
    const TREE_SIZE: usize = 88;
    const COPY_SIZE: usize = 24;
    const NORM_SIZE: usize = 64;

    #[test]
    fn layouts_match_the_kernel_header() {
        assert_eq!((ABI_VERSION, MAX_WORLD, THREADS), (DC_ABI_VERSION, DC_MAX_WORLD, DC_THREADS));
        assert_eq!((SEG_WRITE_BACK, SEG_GATHER), (DC_SEG_WRITE_BACK, DC_SEG_GATHER));
        assert_eq!(
            (SEG_SEND, SEG_SCATTER, MODE_PULL, MODE_PUSH_LL),
            (DC_SEG_SEND, DC_SEG_SCATTER, DC_MODE_PULL, DC_MODE_PUSH_LL)
        );
        assert_eq!(
            [
                offset_of!(Seg, ptr),
                offset_of!(Seg, src),
                offset_of!(Seg, frame_off),
                offset_of!(Seg, bytes),
                offset_of!(Seg, peer),
                offset_of!(Seg, flags)
            ],
            SEG_OFFSETS
        );
        assert_eq!(size_of::<Seg>(), SEG_SIZE);
        assert_eq!(
            [
                offset_of!(Header, ctl),
                offset_of!(Header, data),
                offset_of!(Header, err),
                offset_of!(Header, timeout_ns),
                offset_of!(Header, sig),
                offset_of!(Header, frame),
                offset_of!(Header, off_status),
            ],
            HEADER_U64_OFFSETS
        );
        let u32s = [
            offset_of!(Header, off_status),
            offset_of!(Header, off_sig0),
            offset_of!(Header, off_sig1),
            offset_of!(Header, off_ready),
            offset_of!(Header, off_phase2),
            offset_of!(Header, line),
            offset_of!(Header, digest),
            offset_of!(Header, rank),
            offset_of!(Header, world),
            offset_of!(Header, layout_blocks),
            offset_of!(Header, grid),
            offset_of!(Header, dtype),
            offset_of!(Header, tile_bytes),
            offset_of!(Header, nstage),
            offset_of!(Header, nphase1),
            offset_of!(Header, nphase2),
            offset_of!(Header, off_ack),
            offset_of!(Header, off_push),
            offset_of!(Header, off_ll),
            offset_of!(Header, ll_slot),
            offset_of!(Header, mode),
            offset_of!(Header, off_pflag),
        ];
        for (i, o) in u32s.iter().enumerate() {
            assert_eq!(*o, HEADER_U32_FIRST + 4 * i, "u32 field {i} of DcHeader");
        }
        assert_eq!([offset_of!(Header, push_stride), offset_of!(Header, push_ag)], HEADER_TAIL_U64);
        assert_eq!((MODE_PUSH, SEG_SEND_TO, SEG_AG), (DC_MODE_PUSH, DC_SEG_SEND_TO, DC_SEG_AG));
        assert_eq!(size_of::<Header>(), HEADER_SIZE);
        assert_eq!(offset_of!(ParamsSingle, seg), HEADER_SIZE);
        assert_eq!(size_of::<ParamsSingle>(), HEADER_SIZE + DC_SEGS_SINGLE * SEG_SIZE);
        assert_eq!(size_of::<ParamsMany>(), HEADER_SIZE + DC_SEGS_MANY * SEG_SIZE);
        assert_eq!(
            [
                offset_of!(TreeParams, out),
                offset_of!(TreeParams, count),
                offset_of!(TreeParams, world),
                offset_of!(TreeParams, dtype)
            ],
            TREE_OFFSETS
        );
        assert_eq!(size_of::<TreeParams>(), TREE_SIZE);
        assert_eq!(size_of::<CopyParams>(), COPY_SIZE);
        assert_eq!(
            abi_table(),
            [
                DC_ABI_VERSION,
                (HEADER_SIZE + DC_SEGS_SINGLE * SEG_SIZE) as u32,
                (HEADER_SIZE + DC_SEGS_MANY * SEG_SIZE) as u32,
                TREE_SIZE as u32,
                SEG_SIZE as u32,
                COPY_SIZE as u32,
                NORM_SIZE as u32
            ]
        );
    }

    /// The table check: this layout with any set of worlds 1..=8 is taken and gives the set;
    /// another layout word, an empty set or a world outside 1..=8 is refused.
    #[test]
    fn abi_table_check_returns_the_world_set() {
        let table = |worlds: u32| -> [u32; ABI_WORDS] {
            let mut t = [0u32; ABI_WORDS];
            t[..ABI_WORDS - 1].copy_from_slice(&abi_table());
            t[ABI_WORDS - 1] = worlds;
            t
        };
        assert_eq!(check_abi(&table(0x1FE)), Ok(EVERY_WORLD));
        assert_eq!(check_abi(&table(0x6)), Ok(0x6));
        assert_eq!(check_abi(&table(0x110)), Ok(0x110));
        for bad in [0, 1, 0x200, 0x1FF, 0x1_0006] {
            assert!(check_abi(&table(bad)).is_err(), "world set {bad:#x}");
        }
        for word in 0..ABI_WORDS - 1 {
            let mut t = table(0x1FE);
            t[word] += 1;
            assert!(check_abi(&t).unwrap_err().contains("this crate expects"), "word {word}");
        }
    }

    #[test]
    fn packs_tree_launches() {
        let p = TreeParams::pack(&[0x1000, 0x2000, 0x3000, 0x4000], 0x9000, 77, DType::BF16).unwrap();
        assert_eq!(p.input, [0x1000, 0x2000, 0x3000, 0x4000, 0, 0, 0, 0]);
        assert_eq!((p.out, p.count, p.world, p.dtype), (0x9000, 77, 4, DType::BF16 as u32));
        // Two-byte elements need two-byte alignment only.
        assert!(TreeParams::pack(&[0x1002, 0x2006], 0x900A, 1, DType::F16).is_ok());
        for bad in [0usize, 9, 16] {
            let inputs = vec![0x1000u64; bad];
            assert!(matches!(
                TreeParams::pack(&inputs, 0x9000, 1, DType::F32),
                Err(Error::UnsupportedWorldSize { world }) if world == bad
            ));
        }
        assert!(matches!(
            TreeParams::pack(&[0x1000, 0x1002], 0x9000, 1, DType::F32),
            Err(Error::Misaligned { argument: "inputs[i]", addr: 0x1002, align: 4, .. })
        ));
        assert!(matches!(
            TreeParams::pack(&[0x1000], 0x9001, 1, DType::F16),
            Err(Error::Misaligned { argument: "out", addr: 0x9001, align: 2, .. })
        ));
        let d = DType::ALL.into_iter().find(|d| !d.is_reducible()).expect("a dtype without an add");
        assert!(matches!(TreeParams::pack(&[0x1000], 0x9000, 1, d), Err(Error::UnsupportedDtype { .. })));
    }

    fn fixed(world: usize, rank: usize, capacity: usize, blocks: usize) -> (Layout, Fixed) {
        let layout = Layout::new(capacity, blocks).unwrap();
        let mems: Vec<RankMemory> =
            (0..world as u64).map(|q| RankMemory::one_allocation(&layout, 0x1000_0000 * (q + 1))).collect();
        let f = Fixed::new(&layout, &mems, rank, 0xE000, 1_000_000, THREADS);
        (layout, f)
    }

    #[test]
    fn fixed_header_and_grid() {
        let (layout, f) = fixed(4, 2, 1 << 20, 8);
        let h = f.header;
        assert_eq!(&h.ctl[..5], &[0x1000_0000, 0x2000_0000, 0x3000_0000, 0x4000_0000, 0]);
        let f0 = layout.frame(0) as u64;
        assert_eq!(&h.data[..5], &[0x1000_0000 + f0, 0x2000_0000 + f0, 0x3000_0000 + f0, 0x4000_0000 + f0, 0]);
        assert_eq!((h.err, h.timeout_ns, h.rank, h.world, h.layout_blocks), (0xE000, 1_000_000, 2, 4, 8));
        // Frame p of rank q sits at data[q] + frame[p]: the one-allocation layout's frame(p).
        assert_eq!(
            [h.data[1] + h.frame[0], h.data[1] + h.frame[1]],
            [0x2000_0000 + layout.frame(0) as u64, 0x2000_0000 + layout.frame(1) as u64]
        );
        // Split placement: control and frames anywhere.
        let split = [RankMemory { control: 0x100, frames: 0x9000 }, RankMemory { control: 0x200, frames: 0xA000 }];
        let s = Fixed::new(&layout, &split, 1, 0, 1, THREADS).header;
        assert_eq!((&s.ctl[..3], &s.data[..3], s.world), (&[0x100, 0x200, 0][..], &[0x9000, 0xA000, 0][..], 2));
        assert_eq!(h.off_ready as usize, layout.ready(0));
        assert_eq!(h.line as usize, layout.ready(1) - layout.ready(0));
        assert_eq!(h.tile_bytes, TILE_BYTES);
        assert_eq!((f.max_grid, f.threads), (8, THREADS));
        // One block per 8 KiB tile, at least 1, at most max_grid.
        assert_eq!([f.grid(0), f.grid(1), f.grid(8192), f.grid(8193), f.grid(1 << 30)], [1, 1, 1, 2, 8]);
        assert_eq!([copy_grid(0, 4), copy_grid(8193, 4), copy_grid(1 << 30, 4), copy_grid(5, 0)], [1, 2, 4, 1]);
    }

    #[test]
    fn packs_single_lane_plans() {
        let (_, f) = fixed(4, 1, 1 << 20, 8);
        let n = 1000usize;
        // SAFETY: the views are never dereferenced: only their addresses are packed.
        let (input, output) =
            unsafe { (RawRef::from_raw(0xA000, n, DType::F32), RawMut::from_raw(0xB000, n, DType::F32)) };
        let call = validate(Op::AllReduce, &Io::OutOfPlace { input, output }, 1, 4, 1 << 20).unwrap();

        let plan = Plan::single(&call, 1, 4, Route::IpcOneShot).unwrap();
        let p: ParamsSingle = pack(&f, &plan, false, "test").unwrap();
        assert_eq!((p.h.nstage, p.h.nphase1, p.h.nphase2, p.h.grid), (1, 1, 0, 1));
        assert_eq!((p.seg[0].ptr, p.seg[0].frame_off, p.seg[0].bytes), (0xA000, 0, 4000));
        assert_eq!((p.seg[1].ptr, p.seg[1].bytes, p.seg[1].flags), (0xB000, 4000, 0));
        assert_eq!(p.h.sig, plan.sig.pack());
        assert_eq!((p.h.digest, p.h.dtype), (plan.sig.digest(), DType::F32 as u32));

        let plan = Plan::single(&call, 1, 4, Route::IpcReduceScatterAllGather).unwrap();
        let p: ParamsSingle = pack(&f, &plan, false, "test").unwrap();
        assert_eq!((p.h.nstage, p.h.nphase1, p.h.nphase2), (1, 1, 3));
        assert_eq!(p.seg[1].flags, SEG_WRITE_BACK);
        assert!(p.seg[2..5].iter().all(|s| s.flags == SEG_GATHER && s.peer != 1));

        // In-place all_gather: the own shard's gather is dropped.
        // SAFETY: as above.
        let buf = unsafe { RawMut::from_raw(0xC000, 4 * n, DType::BF16) };
        let call = validate(Op::AllGather, &Io::InPlace(buf), 1, 4, 1 << 20).unwrap();
        let plan = Plan::single(&call, 1, 4, Route::IpcOneShot).unwrap();
        let kept: ParamsSingle = pack(&f, &plan, false, "test").unwrap();
        let skipped: ParamsSingle = pack(&f, &plan, true, "test").unwrap();
        assert_eq!((kept.h.nphase1, skipped.h.nphase1), (4, 3));
        assert!(skipped.seg[1..4].iter().all(|s| s.peer != 1 && s.flags == SEG_GATHER));

        // Too few slots: a typed error naming the backend, never a truncated launch.
        match pack::<2>(&f, &plan, false, "test") {
            Err(Error::Backend { backend: "test", .. }) => {}
            other => panic!("expected a Backend error, got {other:?}"),
        }
    }

    /// The fused launch the engine packs for rank 1 of 4 (`f`): an all_reduce of `rows x
    /// hidden` into 0x4000_0000 by `route`, the norm's sum at `sum_off` from it, its residual
    /// `residual_off` bytes from 0x5000_0000; `reads_gathered` as the runtime says.
    fn fused_call(
        f: &Fixed,
        shape: (usize, usize, DType),
        route: Route,
        offsets: (u64, u64),
        reads_gathered: bool,
    ) -> CollectiveNormParams {
        fused_call_tiled(f, shape, route, offsets, reads_gathered, TILE_BYTES)
    }

    /// [`fused_call`] packed with tiles of `tile` bytes.
    fn fused_call_tiled(
        f: &Fixed,
        (rows, hidden, dtype): (usize, usize, DType),
        route: Route,
        (sum_off, residual_off): (u64, u64),
        reads_gathered: bool,
        tile: u32,
    ) -> CollectiveNormParams {
        use crate::norm::NormArgs;
        let n = rows * hidden;
        // SAFETY: never dereferenced: only the addresses are packed.
        let (input, output) =
            unsafe { (RawRef::from_raw(0x10_0000, n, dtype), RawMut::from_raw(0x4000_0000, n, dtype)) };
        let call = validate(Op::AllReduce, &Io::OutOfPlace { input, output }, 1, 4, 1 << 22).unwrap();
        let plan = Plan::single(&call, 1, 4, route).unwrap();
        let p: ParamsSingle = pack_tiled(f, &plan, false, "test", tile).unwrap();
        let args = NormArgs {
            sum: 0x4000_0000 + sum_off,
            residual: 0x5000_0000 + residual_off,
            weight: 0x6000_0000,
            h: 0x7000_0000,
            y: 0x8000_0000,
            rows,
            hidden,
            eps: 1e-6,
            dtype,
        };
        CollectiveNormParams::new(p, NormParams::pack(&args).unwrap(), reads_gathered)
    }

    /// The fused launch's row mapping: the host's `local_group` (which sizes the grid) is the
    /// kernel's `dc_norm_local_group` condition, on plans the engine really packs.
    #[test]
    fn fused_launch_is_local_exactly_when_blocks_reduce_whole_rows() {
        let (_, f) = fixed(4, 1, 1 << 22, 16);
        let fused = |rows: usize, hidden: usize, dtype: DType, route: Route, sum_off: u64| {
            fused_call(&f, (rows, hidden, dtype), route, (sum_off, 0), false)
        };
        for route in [Route::IpcPushLl, Route::IpcOneShot] {
            // A row per 8 KiB tile: block b reduced rows b, b + grid, ...; grid = the protocol's.
            for rows in [1, 3, 8, 16, 64] {
                let c = fused(rows, 4096, DType::BF16, route, 0);
                assert_eq!(c.local_group(), 1, "{route:?} rows {rows}");
                assert_eq!(c.grid(f.max_grid), c.call.h.grid);
                assert_eq!(c.call.h.grid, rows.min(16) as u32);
            }
            assert_eq!(fused(8, 2048, DType::F32, route, 0).local_group(), 1);
            assert_eq!(fused(8, 2048, DType::F16, route, 0).local_group(), 2);
            assert_eq!(fused(8, 64, DType::BF16, route, 0).local_group(), 64);
            // A row across tiles, a row that does not divide the tile: the barrier, more blocks.
            for (hidden, dtype) in [(8192, DType::BF16), (4096, DType::F32), (3000, DType::BF16), (2049, DType::F16)] {
                let c = fused(8, hidden, dtype, route, 0);
                assert_eq!(c.local_group(), 0, "{route:?} {hidden} {dtype:?}");
                assert_eq!(c.grid(f.max_grid), c.call.h.grid.max(8));
            }
            // The norm's sum is not the segment's output (only part of it, e.g. a chunk).
            assert_eq!(fused(8, 4096, DType::BF16, route, 8192).local_group(), 0);
        }
        // Two phases (RS+AG), or the bulk push: blocks write other blocks' rows.
        assert_eq!(fused(8, 4096, DType::BF16, Route::IpcReduceScatterAllGather, 0).local_group(), 0);
        assert_eq!(fused(64, 4096, DType::BF16, Route::IpcPush, 0).local_group(), 0);
    }

    /// The gathered-sum form: on RS+AG and bulk push every phase-2 segment is flagged when the
    /// runtime has the form and the norm is on its vector path, never on one-phase routes or
    /// with a misaligned tensor; `sum_at` maps each peer's shard to where its copy would have
    /// read it (the peer's frame on RS+AG, the own frame's slot on bulk push) and the own shard
    /// to the output; the grid has a block per 16 rows.
    #[test]
    fn fused_launch_reads_the_gathered_sums_on_two_phase_routes() {
        let (_, f) = fixed(4, 1, 1 << 22, 16);
        let shape = (NORM_GATHERED_MIN_ROWS, 4096, DType::BF16);
        for route in [Route::IpcReduceScatterAllGather, Route::IpcPush] {
            let c = fused_call(&f, shape, route, (0, 0), true);
            assert!(c.can_read_gathered() && c.reads_gathered(), "{route:?}");
            let (h, first) = (&c.call.h, (c.call.h.nstage + c.call.h.nphase1) as usize);
            assert_eq!(h.nphase2, 3, "{route:?}: a phase-2 segment per peer");
            for s in &c.call.seg[first..first + 3] {
                assert_eq!(s.flags & SEG_NORM_READ, SEG_NORM_READ);
                for (frame, rel) in [(h.frame[0], 0), (h.frame[1], s.bytes - 16)] {
                    let o = s.ptr - c.norm.sum + rel;
                    let expected = match route {
                        Route::IpcPush => h.data[1] + frame + s.frame_off + rel,
                        _ => h.data[s.peer as usize] + frame + s.frame_off + rel,
                    };
                    assert_eq!(c.sum_at(frame, o), expected, "{route:?} peer {}", s.peer);
                }
            }
            // The own shard (rank 1's, between peer 0's and peer 2's) is read from the output.
            // These rows (whole shards of 4096 in bf16) take a row form inside the protocol, on
            // exactly the collective's grid; f32 rows (of 2048 here) the gathered-sum form, a
            // block per 16 rows.
            assert!(c.shard_rows(), "{route:?}");
            assert_eq!(c.grid(f.max_grid), c.call.h.grid, "{route:?}");
            let f32_rows = fused_call(&f, (512, 2048, DType::F32), route, (0, 0), true);
            assert!(f32_rows.reads_gathered() && !f32_rows.shard_rows(), "{route:?}");
            let grid = f32_rows.call.h.grid.max((512 / 16).min(f.max_grid));
            assert_eq!(f32_rows.grid(f.max_grid), grid, "{route:?}");
            let own = c.call.seg[first].ptr + c.call.seg[first].bytes;
            assert_ne!(c.call.seg[first + 1].ptr, own);
            assert_eq!(c.sum_at(h.frame[1], own - c.norm.sum), own);
            // Not without the runtime's form, off the vector path (a residual one element off,
            // hidden not a multiple of 8) or below the rows: the copies stay, the launch has the
            // block form after its barrier.
            for off in [
                fused_call(&f, shape, route, (0, 0), false),
                fused_call(&f, shape, route, (0, 2), true),
                fused_call(&f, (512, 4092, DType::BF16), route, (0, 0), true),
                fused_call(&f, (NORM_GATHERED_MIN_ROWS - 1, 4096, DType::BF16), route, (0, 0), true),
            ] {
                assert!(!off.reads_gathered(), "{route:?}");
                assert!(off.call.seg.iter().all(|s| s.flags & SEG_NORM_READ == 0));
            }
        }
        for route in [Route::IpcPushLl, Route::IpcOneShot] {
            assert!(!fused_call(&f, (512, 16, DType::BF16), route, (0, 0), true).reads_gathered(), "{route:?}");
        }
    }

    /// The row forms inside the protocol (`dc_norm_bulk_rows`, `dc_norm_rsag_rows`): on bulk
    /// push and RS+AG, f16/bf16 rows of 4096 on the vector path whose shards are whole rows of
    /// a launch's rows, at any row count (the phase-2 segments flagged below the gathered
    /// form's rows too), on exactly the collective's grid; never on other routes or shapes.
    #[test]
    fn shard_rows_forms_take_whole_row_shards_of_one_tile_rows() {
        let (_, f) = fixed(4, 1, 1 << 22, 16);
        for route in [Route::IpcPush, Route::IpcReduceScatterAllGather] {
            for rows in [4, 8, 64, 512] {
                for dtype in [DType::BF16, DType::F16] {
                    let c = fused_call(&f, (rows, 4096, dtype), route, (0, 0), true);
                    let what = format!("{route:?} {rows} {dtype:?}");
                    assert!(c.shard_rows_shape() && c.reads_gathered() && c.shard_rows(), "{what}");
                    assert_eq!(c.grid(f.max_grid), c.call.h.grid, "{what}");
                }
            }
            for (what, c) in [
                ("rows not a multiple of the world", fused_call(&f, (6, 4096, DType::BF16), route, (0, 0), true)),
                ("rows of two tiles", fused_call(&f, (8, 8192, DType::BF16), route, (0, 0), true)),
                ("f32", fused_call(&f, (8, 2048, DType::F32), route, (0, 0), true)),
                ("off the vector path", fused_call(&f, (8, 4096, DType::BF16), route, (0, 2), true)),
                ("the sum a later part of the output", fused_call(&f, (8, 4096, DType::BF16), route, (8192, 0), true)),
            ] {
                assert!(!c.shard_rows(), "{route:?}: {what}");
            }
            // Without the runtime's gathered-sum form nothing is flagged: the shape alone is not the form.
            let c = fused_call(&f, (8, 4096, DType::BF16), route, (0, 0), false);
            assert!(c.shard_rows_shape() && !c.reads_gathered() && !c.shard_rows(), "{route:?}");
            // An input one element off 16 bytes: bulk push reads it with 16-byte loads (a
            // misaligned address fault on the GPU), so not that form; RS+AG reads the staged
            // frame, whatever the input's alignment.
            let mut c = fused_call(&f, (8, 4096, DType::BF16), route, (0, 0), true);
            c.call.seg[c.call.h.nstage as usize].src += 2;
            assert_eq!(c.shard_rows(), route == Route::IpcReduceScatterAllGather, "{route:?}, input off 16 bytes");
        }
        for route in [Route::IpcOneShot, Route::IpcPushLl] {
            assert!(!fused_call(&f, (8, 4096, DType::BF16), route, (0, 0), true).shard_rows(), "{route:?}");
        }
    }

    /// Rows of 8192 in wide tiles (16 KiB, [`WIDE_TILE_BYTES`]): the row forms' cut on bulk
    /// push and RS+AG as rows of 4096 in 8 KiB tiles, a block per tile of the call's bytes;
    /// rows of 4096 in wide tiles when every shard is whole pairs of rows (the forms' pairs),
    /// rows of 8192 in 8 KiB tiles never. The cut leaves out this rank's own addresses (vector
    /// path, input alignment), which only the shape tests.
    #[test]
    fn wide_tiles_cut_rows_of_8192_and_pairs_of_4096() {
        let (_, f) = fixed(4, 1, 1 << 22, 16);
        for route in [Route::IpcPush, Route::IpcReduceScatterAllGather] {
            for rows in [4, 8, 64] {
                for dtype in [DType::BF16, DType::F16] {
                    let c = fused_call_tiled(&f, (rows, 8192, dtype), route, (0, 0), true, WIDE_TILE_BYTES);
                    let what = format!("{route:?} {rows} {dtype:?}");
                    assert_eq!(c.call.h.tile_bytes, WIDE_TILE_BYTES, "{what}");
                    assert!(c.shard_rows_cut() && c.shard_rows_shape() && c.shard_rows(), "{what}");
                    assert_eq!(c.grid(f.max_grid), c.call.h.grid, "{what}");
                    // A block per wide tile: of the slot on bulk push, of the call on RS+AG.
                    let bytes = if route == Route::IpcPush { c.call.h.push_stride } else { (rows * 8192 * 2) as u64 };
                    assert_eq!(c.call.h.grid, f.grid_of_tiles(bytes, WIDE_TILE_BYTES), "{what}");
                    assert_eq!(
                        c.call.h.grid,
                        bytes.div_ceil(16 << 10).clamp(1, u64::from(f.max_grid)) as u32,
                        "{what}"
                    );
                }
            }
            // Pairs of rows of 4096: shards of 2, 16 and 128 rows at world 4 are whole pairs;
            // of 1 or 3 rows not, nor a shard of 2 rows one row into the sum.
            for rows in [8, 64, 512] {
                for dtype in [DType::BF16, DType::F16] {
                    let c = fused_call_tiled(&f, (rows, 4096, dtype), route, (0, 0), true, WIDE_TILE_BYTES);
                    let what = format!("{route:?} {rows} rows of 4096 {dtype:?}");
                    assert!(c.shard_rows_cut() && c.shard_rows_shape() && c.shard_rows(), "{what}");
                    assert_eq!(c.grid(f.max_grid), c.call.h.grid, "{what}");
                }
            }
            for rows in [4, 12] {
                let c = fused_call_tiled(&f, (rows, 4096, DType::BF16), route, (0, 0), true, WIDE_TILE_BYTES);
                assert!(!c.shard_rows_cut(), "{route:?}: {rows} rows of 4096, shards of odd rows");
            }
            let c = fused_call_tiled(&f, (8, 4096, DType::BF16), route, (8192, 0), true, WIDE_TILE_BYTES);
            assert!(!c.shard_rows_cut(), "{route:?}: the sum a row into the output");
            let c = fused_call_tiled(&f, (8, 2048, DType::BF16), route, (0, 0), true, WIDE_TILE_BYTES);
            assert!(!c.shard_rows_cut(), "{route:?}: four rows of 2048 to a wide tile");
            let c = fused_call_tiled(&f, (6, 8192, DType::BF16), route, (0, 0), true, WIDE_TILE_BYTES);
            assert!(!c.shard_rows_cut(), "{route:?}: rows not a multiple of the world");
            // Off the vector path: the cut holds (every rank takes the wide tile), the form not.
            let c = fused_call_tiled(&f, (8, 8192, DType::BF16), route, (0, 2), true, WIDE_TILE_BYTES);
            assert!(c.shard_rows_cut() && !c.shard_rows(), "{route:?}: off the vector path");
        }
    }

    #[test]
    fn packs_many_lane_plans() {
        let (_, f) = fixed(2, 0, 1 << 20, 4);
        // SAFETY: never dereferenced.
        let lanes: Vec<Io<'_>> = (0..3u64)
            .map(|i| unsafe {
                Io::OutOfPlace {
                    input: RawRef::from_raw(0x10_0000 * (i + 1), 64, DType::F16),
                    output: RawMut::from_raw(0x8000_0000 + 0x1000 * i, 32, DType::F16),
                }
            })
            .collect();
        let (calls, sig) = validate_many(&lanes, 0, 2, 1 << 20).unwrap();
        let plan = Plan::many(&calls, sig, 0);
        let p: ParamsMany = pack(&f, &plan, false, "test").unwrap();
        assert_eq!((p.h.nstage, p.h.nphase1, p.h.nphase2), (3, 3, 0));
        assert_eq!(p.seg[0].bytes, 128);
        assert_eq!(p.seg[3].bytes, 64);
        assert_eq!(p.h.grid, 1);
    }
}
