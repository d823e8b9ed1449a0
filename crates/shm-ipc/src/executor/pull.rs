//! The pull route (`DC_MODE_PULL`), per block: stage the block's tiles of the input into the
//! own frame, publish the signature and release `ready[b]`, wait for every peer's `ready[b]`,
//! then phase 1 (the tree over every rank's frame in rank order, or gathers) and, for RS+AG,
//! phase 2 (release `phase2[b]`, wait, gather the peers' reduced shards).
use super::memory::{copy, tree, word};
use super::{Call, for_tiles};
use detcoll_protocol::params::{MAX_WORLD, SEG_GATHER, SEG_NORM_READ, SEG_WRITE_BACK, Seg};
use detcoll_protocol::status::{ERR_TIMEOUT_PHASE2, ERR_TIMEOUT_READY};
use std::sync::atomic::Ordering;

/// Runs every block of a pull call.
///
/// # Safety
/// The call's invariant (see `collective`).
pub(super) unsafe fn run(c: &Call<'_>) {
    let h = c.h;
    let tile = u64::from(h.tile_bytes);
    let (nstage, n1, n2) = (h.nstage as usize, h.nphase1 as usize, h.nphase2 as usize);
    for b in 0..h.grid {
        for s in &c.seg[..nstage] {
            for_tiles(s.frame_off, s.bytes, tile, h.grid, b, |lo, hi| {
                // SAFETY: the block's tiles of the caller's validated input into the own frame,
                // which no peer reads before this block's release below.
                unsafe { copy(c.data(c.rank(), lo), s.ptr + (lo - s.frame_off), hi - lo) };
            });
        }
        let line = |off: u32| c.ctl(c.rank(), u64::from(off) + u64::from(b) * c.line());
        // SAFETY: this rank's ready flag of block b (the call's invariant). The signature slot
        // was written by the prologue; the release orders the staging stores before the flag.
        unsafe { word(line(h.off_ready)) }.store(c.word, Ordering::Release);
        let ready = u64::from(h.off_ready) + u64::from(b) * c.line();
        if !c.wait(ready, ERR_TIMEOUT_READY, false) {
            return;
        }
        for s in &c.seg[nstage..nstage + n1] {
            // SAFETY: forwarded.
            unsafe { segment(c, s, b, s.flags & SEG_GATHER != 0) };
        }
        if n2 > 0 {
            // SAFETY: as the ready flag.
            unsafe { word(line(h.off_phase2)) }.store(c.word, Ordering::Release);
            let phase2 = u64::from(h.off_phase2) + u64::from(b) * c.line();
            if !c.wait(phase2, ERR_TIMEOUT_PHASE2, false) {
                return;
            }
            // A fused norm launch reads the segments it flagged in place (the norm's sum_at).
            for s in c.seg[nstage + n1..nstage + n1 + n2].iter().filter(|s| s.flags & SEG_NORM_READ == 0) {
                // SAFETY: forwarded.
                unsafe { segment(c, s, b, true) };
            }
        }
    }
}

/// Phase-1/phase-2 work of one segment for block `b`'s tiles (`dc_run_segment`): a gather
/// copies the peer's frame range to the caller; a reduce runs the tree over every rank's
/// frame range (and, with write-back, also stores it into the own frame for phase 2).
///
/// # Safety
/// The call's invariant; every peer published the block's range (acquire).
unsafe fn segment(c: &Call<'_>, s: &Seg, b: u32, gather: bool) {
    let h = c.h;
    for_tiles(s.frame_off, s.bytes, u64::from(h.tile_bytes), h.grid, b, |lo, hi| {
        let dst = s.ptr + (lo - s.frame_off);
        if gather {
            // SAFETY: the peer's published frame range into the caller's validated output.
            unsafe { copy(dst, c.data(s.peer, lo), hi - lo) };
        } else {
            let mut src = [0u64; MAX_WORLD];
            for (q, x) in src.iter_mut().enumerate().take(h.world as usize) {
                *x = c.data(q as u32, lo);
            }
            // SAFETY: every rank's published frame range; the validated output.
            unsafe { tree(h.dtype, &src[..h.world as usize], dst, hi - lo) };
            if s.flags & SEG_WRITE_BACK != 0 {
                // SAFETY: the own frame range, read by peers only after the phase-2 release.
                unsafe { copy(c.data(c.rank(), lo), dst, hi - lo) };
            }
        }
    });
}
