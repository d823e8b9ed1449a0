//! The LL push route (`DC_MODE_PUSH_LL`): rank r writes its values as LL lines into slot
//! (parity g % 2, sender r) of every peer (reduce_scatter: shard q to peer q only), waits for
//! every sender's push header in its own control block, then reads its own slots — each line
//! valid once all four of its words carry generation g — and reduces in rank order (the own
//! leaf from the caller's input) or gathers. Payload offset `o` of a slot is the LL line at
//! `2 * o` (16 payload bytes per 32-byte line).
use super::memory::{Vec16, ll_load, ll_store, load16, store16, tree};
use super::{Call, for_tiles};
use detcoll_protocol::params::{MAX_WORLD, SEG_GATHER, SEG_SCATTER, Seg};
use detcoll_protocol::status::ERR_TIMEOUT_READY;

/// Address of the LL slot (parity, sender) in `owner`'s control block (`dc_ll_slot`).
fn slot(c: &Call<'_>, owner: u32, parity: u32, sender: u32) -> u64 {
    let h = c.h;
    c.ctl(
        owner,
        u64::from(h.off_ll) + (u64::from(parity) * u64::from(h.world) + u64::from(sender)) * u64::from(h.ll_slot),
    )
}

/// Calls `body(o, n)` for every 16-byte chunk of block `b`'s tiles of `[seg_lo, seg_lo +
/// bytes)`: payload offset `o`, `n` (1..16) bytes from it (`dc_for_chunks`).
fn for_chunks(c: &Call<'_>, b: u32, seg_lo: u64, bytes: u64, mut body: impl FnMut(u64, u64)) {
    for_tiles(seg_lo, bytes, u64::from(c.h.tile_bytes), c.h.grid, b, |lo, hi| {
        let mut o = lo;
        while o < hi {
            body(o, (hi - o).min(16));
            o += 16;
        }
    });
}

/// Rewrites block `b`'s lines of this rank's slot of parity g % 2 in every peer with flag
/// g - 2, which no receiver waits for (`dc_ll_refresh`), before this call's data.
///
/// # Safety
/// The call's invariant (see `collective`).
pub(super) unsafe fn refresh(c: &Call<'_>, b: u32) {
    let zero: Vec16 = [0; 16];
    for_chunks(c, b, 0, u64::from(c.h.ll_slot) / 2, |o, _| {
        for q in c.peers() {
            // SAFETY: a line of this rank's slot in a peer's live LL area.
            unsafe { ll_store(slot(c, q, c.g & 1, c.rank()) + 2 * o, &zero, c.g.wrapping_sub(2)) };
        }
    });
}

/// Runs every block of an LL push call (`dc_push_ll`).
///
/// # Safety
/// The call's invariant.
pub(super) unsafe fn run(c: &Call<'_>) {
    let h = c.h;
    let (nstage, n1) = (h.nstage as usize, h.nphase1 as usize);
    let headers = u64::from(h.off_push) + u64::from(c.g & 1) * 8 * c.line();
    for b in 0..h.grid {
        for s in &c.seg[..nstage] {
            // SAFETY: forwarded.
            unsafe { send(c, s, b) };
        }
        // Every sender makes this call (a mismatching sender's lines are never read).
        if !c.wait(headers, ERR_TIMEOUT_READY, true) {
            return;
        }
        for s in &c.seg[nstage..nstage + n1] {
            // SAFETY: forwarded.
            let ok = unsafe { if s.flags & SEG_GATHER != 0 { gather(c, s, b) } else { reduce(c, s, b) } };
            if !ok {
                return;
            }
        }
    }
}

/// This rank's values of `s` for block `b` into its slot of every peer (`dc_push_send`).
unsafe fn send(c: &Call<'_>, s: &Seg, b: u32) {
    let scatter = s.flags & SEG_SCATTER != 0;
    for_chunks(c, b, s.frame_off, s.bytes, |o, n| {
        let rel = o - s.frame_off;
        // SAFETY: the caller's validated input (a scatter: shard q of it), `n` bytes at `rel`.
        let mut v = unsafe { load16(s.ptr + rel, n) };
        for q in c.peers() {
            if scatter {
                // SAFETY: as above.
                v = unsafe { load16(s.ptr + u64::from(q) * s.bytes + rel, n) };
            }
            // SAFETY: a line of this rank's slot in peer q's live LL area.
            unsafe { ll_store(slot(c, q, c.g & 1, c.rank()) + 2 * o, &v, c.g) };
        }
    });
}

/// The line at payload offset `o` of `peer`'s slot in this rank's memory, waited for.
fn receive(c: &Call<'_>, peer: u32, o: u64) -> Option<Vec16> {
    let line = slot(c, c.rank(), c.g & 1, peer) + 2 * o;
    // SAFETY: a line of this rank's live LL area.
    c.poll(peer, ERR_TIMEOUT_READY, || unsafe { ll_load(line, c.g) }, |_| false)
}

/// The tree over every sender's line and the own input (`dc_push_reduce`).
unsafe fn reduce(c: &Call<'_>, s: &Seg, b: u32) -> bool {
    let world = c.h.world as usize;
    let mut ok = true;
    for_chunks(c, b, s.frame_off, s.bytes, |o, n| {
        if !ok {
            return;
        }
        let rel = o - s.frame_off;
        let mut v = [[0u8; 16]; MAX_WORLD];
        for (q, line) in v.iter_mut().enumerate().take(world) {
            let got = if q as u32 == c.rank() {
                // SAFETY: the own leaf, from the caller's validated input.
                Some(unsafe { load16(s.src + rel, n) })
            } else {
                receive(c, q as u32, o)
            };
            match got {
                Some(x) => *line = x,
                None => {
                    ok = false;
                    return;
                }
            }
        }
        let mut src = [0u64; MAX_WORLD];
        for (x, line) in src.iter_mut().zip(&v) {
            *x = line.as_ptr() as u64;
        }
        let mut out: Vec16 = [0; 16];
        // SAFETY: `n` bytes of each 16-byte line into the 16-byte `out`.
        unsafe { tree(c.h.dtype, &src[..world], out.as_mut_ptr() as u64, n) };
        // SAFETY: the caller's validated output.
        unsafe { store16(s.ptr + rel, &out, n) };
    });
    ok
}

/// The gathered sender's lines (or the own input) to the output (`dc_push_gather`).
unsafe fn gather(c: &Call<'_>, s: &Seg, b: u32) -> bool {
    let mut ok = true;
    for_chunks(c, b, s.frame_off, s.bytes, |o, n| {
        if !ok {
            return;
        }
        let rel = o - s.frame_off;
        let v = if s.peer == c.rank() {
            // SAFETY: the caller's validated input.
            Some(unsafe { load16(s.src + rel, n) })
        } else {
            receive(c, s.peer, o)
        };
        match v {
            // SAFETY: the caller's validated output.
            Some(v) => unsafe { store16(s.ptr + rel, &v, n) },
            None => ok = false,
        }
    });
    ok
}
