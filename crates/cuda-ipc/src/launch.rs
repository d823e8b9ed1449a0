//! Kernel parameters (mirrors of the structs in kernels/detcoll_cuda.cu), packing a protocol
//! [`Plan`] into them, the launch shape, and the one `cuLaunchKernel` per call.
use crate::driver::check;
use collective_core::Error;
use collective_core::protocol::{Layout, Phase, Plan};
use cudarc::driver::sys;

/// Must equal `DC_ABI_VERSION` in the kernels (checked when a module is loaded).
pub(crate) const ABI_VERSION: u32 = 2;
/// Threads per block (the kernels' `__launch_bounds__`).
pub(crate) const THREADS: u32 = 512;
/// Frame bytes per tile: tile `t` belongs to block `t % grid` in every phase on every rank.
/// One 16-byte vector per thread of a 512-thread block.
pub(crate) const TILE_BYTES: u32 = 16 * THREADS;
/// Most ranks.
pub(crate) const MAX_WORLD: usize = 8;

pub(crate) const SEG_WRITE_BACK: u32 = 1;
pub(crate) const SEG_GATHER: u32 = 2;

/// One contiguous piece of work (`DcSeg`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Seg {
    pub ptr: u64,
    pub frame_off: u64,
    pub bytes: u64,
    pub peer: u32,
    pub flags: u32,
}

/// Everything but the segments (`DcHeader`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Header {
    pub base: [u64; MAX_WORLD],
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
}

/// `DcParams<N>`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params<const N: usize> {
    pub h: Header,
    pub seg: [Seg; N],
}

/// Single-lane calls: 1 stage + up to 8 phase-1 + 7 phase-2 segments.
pub(crate) type ParamsSingle = Params<16>;
/// `reduce_scatter_many`: up to 16 stage + 16 phase-1 segments.
pub(crate) type ParamsMany = Params<32>;

/// `DcTreeParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TreeParams {
    pub input: [u64; MAX_WORLD],
    pub out: u64,
    pub count: u64,
    pub world: u32,
    pub dtype: u32,
}

/// `DcCopyParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CopyParams {
    pub dst: u64,
    pub src: u64,
    pub bytes: u64,
}

/// Blocks of the world-1 copy kernel for `bytes`: one 16-byte vector per thread, at most
/// `max_grid`.
pub(crate) fn copy_grid(bytes: usize, max_grid: u32) -> u32 {
    (bytes.div_ceil(TILE_BYTES as usize) as u64).clamp(1, u64::from(max_grid.max(1))) as u32
}

const _: () = assert!(size_of::<Seg>() == 32);
const _: () = assert!(size_of::<Header>() == 176);
const _: () = assert!(size_of::<ParamsSingle>() == 176 + 16 * 32);
const _: () = assert!(size_of::<TreeParams>() == 88);

/// Per-rank constants of every launch: filled once at construction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fixed {
    pub header: Header,
    pub max_grid: u32,
    pub threads: u32,
}

impl Fixed {
    /// The constant part of every launch of `rank` over allocations `bases`.
    pub(crate) fn new(layout: &Layout, bases: &[u64], rank: usize, err: u64, timeout_ns: u64, threads: u32) -> Fixed {
        let mut base = [0u64; MAX_WORLD];
        base[..bases.len()].copy_from_slice(bases);
        let header = Header {
            base,
            err,
            timeout_ns,
            sig: [0; 2],
            frame: [layout.frame(0) as u64, layout.frame(1) as u64],
            off_status: layout.status() as u32,
            off_sig0: layout.sig_slot(0) as u32,
            off_sig1: layout.sig_slot(1) as u32,
            off_ready: layout.ready(0) as u32,
            off_phase2: layout.phase2(0) as u32,
            line: (layout.ready(1) - layout.ready(0)) as u32,
            digest: 0,
            rank: rank as u32,
            world: bases.len() as u32,
            layout_blocks: layout.blocks as u32,
            grid: 1,
            dtype: 0,
            tile_bytes: TILE_BYTES,
            nstage: 0,
            nphase1: 0,
            nphase2: 0,
        };
        Fixed { header, max_grid: layout.blocks as u32, threads }
    }

    /// Blocks for a call staging `bytes` per rank: one per tile, at most `max_grid`, at least 1
    /// (every call publishes and waits, empty ones included, so generations stay in step).
    /// A function of the signature and the configuration only, hence equal on every rank.
    pub(crate) fn grid(&self, bytes: u64) -> u32 {
        let tiles = bytes.div_ceil(u64::from(TILE_BYTES));
        tiles.clamp(1, u64::from(self.max_grid)) as u32
    }
}

fn too_many(what: &str) -> Error {
    Error::Backend {
        backend: crate::driver::BACKEND,
        detail: format!("plan has more {what} segments than the kernel parameters hold"),
    }
}

/// Packs `plan` into kernel parameters with `N` segment slots.
///
/// `skip_self_gather`: an in-place all_gather's own shard is already in place, so the copy of
/// this rank's frame back over it is dropped.
pub(crate) fn pack<const N: usize>(fixed: &Fixed, plan: &Plan, skip_self_gather: bool) -> Result<Params<N>, Error> {
    let mut p = Params::<N> { h: fixed.header, seg: [Seg::default(); N] };
    let size = plan.sig.dtype.size() as u64;
    let rank = fixed.header.rank as usize;
    let mut n = 0usize;
    let mut push = |s: Seg, what: &str| -> Result<(), Error> {
        if n >= N {
            return Err(too_many(what));
        }
        p.seg[n] = s;
        n += 1;
        Ok(())
    };
    let mut nstage = 0u32;
    for s in plan.stage.as_slice() {
        push(
            Seg {
                ptr: s.src,
                frame_off: s.frame_offset as u64 * size,
                bytes: s.count as u64 * size,
                peer: 0,
                flags: 0,
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
    p.h.grid = fixed.grid(plan.sig.count * size);
    p.h.nstage = nstage;
    p.h.nphase1 = nphase1;
    // Nonzero exactly on the RS+AG route (world >= 2 there, so every rank gathers from at
    // least one peer); the kernel also uses it to know which phase-2 flags this call uses.
    p.h.nphase2 = nphase2;
    Ok(p)
}

/// One `cuLaunchKernel` of `f` with `params` (a single by-value struct argument).
///
/// # Safety
/// `f` must be a kernel taking exactly one parameter of type `P`'s C twin; every address in
/// `params` must be valid for the kernel's accesses; `stream` must belong to the current
/// context.
pub(crate) unsafe fn launch<P>(
    f: sys::CUfunction,
    grid: u32,
    threads: u32,
    params: &P,
    stream: sys::CUstream,
) -> Result<(), Error> {
    let mut args = [(params as *const P).cast_mut().cast::<core::ffi::c_void>()];
    // SAFETY: forwarded from the caller; the driver copies the parameter bytes before returning.
    let r = unsafe {
        sys::cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, 0, stream, args.as_mut_ptr(), core::ptr::null_mut())
    };
    check(r, "cuLaunchKernel")
}
