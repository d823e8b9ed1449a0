//! The bulk push route (`DC_MODE_PUSH`), per block: copy each slice of the input straight into
//! its owner's frame (slot of this rank), release the phase-0 flag in that peer, wait for the
//! own flags, reduce the own shard over [own input, slot 0, slot 1, ...] in rank order into the
//! output — all_reduce: also into every peer's reduced-shard slot, flagged in phase 1 — then
//! copy the gathered slots out. all_gather is the second half alone.
use super::memory::{copy, tree, word};
use super::{Call, for_tiles};
use detcoll_protocol::params::{MAX_WORLD, SEG_AG, SEG_GATHER, SEG_NORM_READ, SEG_WRITE_BACK, Seg};
use detcoll_protocol::status::{ERR_TIMEOUT_PHASE2, ERR_TIMEOUT_READY};
use std::sync::atomic::{Ordering, fence};

/// Address of the bulk flag (phase, block, sender) in `owner`'s control block (`dc_pflag`).
pub(super) fn flag(c: &Call<'_>, owner: u32, phase: u32, block: u32, sender: u32) -> u64 {
    let h = c.h;
    let index =
        (u64::from(phase) * u64::from(h.layout_blocks) + u64::from(block)) * MAX_WORLD as u64 + u64::from(sender);
    c.ctl(owner, u64::from(h.off_pflag) + index * c.line())
}

/// Runs every block of a bulk push call (`dc_push_bulk`).
///
/// # Safety
/// The call's invariant (see `collective`).
pub(super) unsafe fn run(c: &Call<'_>) {
    let h = c.h;
    let tile = u64::from(h.tile_bytes);
    let (nstage, n1, n2) = (h.nstage as usize, h.nphase1 as usize, h.nphase2 as usize);
    let first_phase = u32::from(nstage > 0 && c.seg[0].flags & SEG_AG != 0);
    for b in 0..h.grid {
        for s in &c.seg[..nstage] {
            for_tiles(0, s.bytes, tile, h.grid, b, |lo, hi| {
                // SAFETY: the caller's validated input into this rank's slot of the owner's
                // frame, which the owner reads only after this block's flag.
                unsafe { copy(c.data(s.peer, s.frame_off + lo), s.ptr + lo, hi - lo) };
            });
        }
        if !signal_and_wait(c, first_phase, b, ERR_TIMEOUT_READY) {
            return;
        }
        for s in &c.seg[nstage..nstage + n1] {
            if s.flags & SEG_GATHER != 0 {
                // SAFETY: forwarded.
                unsafe { gather(c, s, b) };
            } else {
                // SAFETY: forwarded.
                unsafe { reduce(c, s, b) };
            }
        }
        if n2 > 0 {
            if !signal_and_wait(c, 1, b, ERR_TIMEOUT_PHASE2) {
                return;
            }
            // A fused norm launch reads the segments it flagged in place (the norm's sum_at).
            for s in c.seg[nstage + n1..nstage + n1 + n2].iter().filter(|s| s.flags & SEG_NORM_READ == 0) {
                // SAFETY: forwarded.
                unsafe { gather(c, s, b) };
            }
        }
    }
}

/// Block `b`'s flag of `phase` into every peer after the block's stores (`dc_bulk_signal`: one
/// release fence, then relaxed stores), then the wait for every peer's in the own control block.
fn signal_and_wait(c: &Call<'_>, phase: u32, b: u32, code: u64) -> bool {
    fence(Ordering::Release);
    for q in c.peers() {
        // SAFETY: this rank's flag in peer q's live control block.
        unsafe { word(flag(c, q, phase, b, c.rank())) }.store(c.word, Ordering::Relaxed);
    }
    let off = u64::from(c.h.off_pflag)
        + (u64::from(phase) * u64::from(c.h.layout_blocks) + u64::from(b)) * MAX_WORLD as u64 * c.line();
    c.wait(off, code, true)
}

/// The own shard's tree over [own input, every sender's slot] for block `b`'s tiles
/// (`dc_bulk_reduce`); with write-back, the result also into this rank's reduced-shard slot of
/// every peer's frame.
unsafe fn reduce(c: &Call<'_>, s: &Seg, b: u32) {
    let h = c.h;
    let world = h.world as usize;
    let push = s.flags & SEG_WRITE_BACK != 0;
    let slot = |owner: u32, lo: u64| c.data(owner, h.push_ag + u64::from(c.rank()) * h.push_stride + lo);
    for_tiles(0, s.bytes, u64::from(h.tile_bytes), h.grid, b, |lo, hi| {
        let mut src = [0u64; MAX_WORLD];
        for (q, x) in src.iter_mut().enumerate().take(world) {
            *x = if q as u32 == c.rank() {
                s.src + lo
            } else {
                c.data(c.rank(), s.frame_off + q as u64 * h.push_stride + lo)
            };
        }
        let dst = s.ptr + lo;
        // SAFETY: the own input (which an in-place call's output aliases: the tree reads every
        // element before writing it) and the senders' published slots; the validated output.
        unsafe { tree(h.dtype, &src[..world], dst, hi - lo) };
        if push {
            for t in c.peers() {
                // SAFETY: this rank's reduced-shard slot in peer t's frame, read by t only after
                // this block's phase-1 flag.
                unsafe { copy(slot(t, lo), dst, hi - lo) };
            }
        }
    });
}

/// A peer's slot of the own frame (or, for this rank, its own input) to the output
/// (`dc_bulk_gather`).
unsafe fn gather(c: &Call<'_>, s: &Seg, b: u32) {
    let h = c.h;
    let from = if s.peer == c.rank() { s.src } else { c.data(c.rank(), s.frame_off) };
    for_tiles(0, s.bytes, u64::from(h.tile_bytes), h.grid, b, |lo, hi| {
        // SAFETY: the published slot (or the own input) into the validated output.
        unsafe { copy(s.ptr + lo, from + lo, hi - lo) };
    });
}
