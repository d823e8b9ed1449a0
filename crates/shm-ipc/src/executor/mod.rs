//! The reference executor of the kernel ABI: one launch of `detcoll_collective_s` /
//! `detcoll_collective_m` (a packed header and its segments, exactly as `dc_collective` in
//! `kernels/detcoll_protocol.h` reads them), run on the host by the calling thread.
//!
//! Why: the CPU twin is one more device of the engine ([`crate::HostDevice`]), so the engine's
//! whole host path — validation, plans, chunks, packing, the error record, poison, close — runs
//! in CI without a GPU, and a protocol change is made in the kernel and in this one executor.
//! The port is line for line where it can be: the same three modes (pull, LL push, bulk push),
//! the same flags, tiles, LL lines, epoch refresh and error codes. What differs is only what a
//! host thread is: a block's threads become loops, the grid's blocks run one after another
//! (every rank walks them in the same order, so every wait is met), and a wait also notices a
//! peer process that exited (`Watch`), which a GPU cannot see.
mod bulk;
mod ll;
pub(crate) mod memory;
mod pull;

use detcoll_protocol::params::{Header, MODE_PUSH, MODE_PUSH_LL, Seg};
use detcoll_protocol::status::{
    ERR_CORRUPT, ERR_HOST_FAULT, ERR_MISMATCH, ERR_PEER_CLOSED, ERR_PEER_EXITED, ERR_PEER_FAILED, LL_EPOCH_MASK,
    ST_ABORT, ST_GEN, ST_REFRESH,
};
use detcoll_protocol::{CLOSE_ACK, FlagState, FlagWord};
use memory::word;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

/// What a host wait can see beyond the protocol's words.
pub(crate) trait Watch {
    /// The process id of rank `peer` when it has exited (never for ranks that are threads).
    fn exited(&self, peer: usize) -> Option<u32>;
    /// Whether a shared object this rank reads was truncated under its mapping: what the
    /// call reads now is zeros, so it ends (the device reports which object).
    fn faulted(&self) -> bool;
}

/// One launch in flight: the header, its segments and the values of its prologue.
pub(super) struct Call<'a> {
    pub h: &'a Header,
    pub seg: &'a [Seg],
    /// This rank's status line.
    pub status: u64,
    /// The call's generation and its flag word `g << 32 | digest`.
    pub g: u32,
    pub word: u64,
    /// Offset of frame `g % 2` from every rank's frame 0.
    pub frame: u64,
    watch: &'a dyn Watch,
}

/// This rank's status word (`ST_ABORT`): nonzero once a failure stopped it — its own, with a
/// record, or `Collective::abandon` from the host, without one.
///
/// # Safety
/// As [`collective`]: `h` was packed for a live group.
pub(crate) unsafe fn own_abort(h: &Header) -> u64 {
    // SAFETY: the status line of this rank's live staging (caller).
    unsafe { word(h.ctl[h.rank as usize] + u64::from(h.off_status) + 8 * ST_ABORT as u64) }.load(Ordering::Acquire)
}

/// Runs one collective launch of `h` with `seg` (its `nstage + nphase1 + nphase2` segments)
/// on the calling thread. A failure is recorded in the launching rank's error record and its
/// status word (as `dc_fail` does), never returned: the engine reads the record. Returns the
/// call's frame offset (`frame[g % 2]`, where a fused norm reads the gathered sums).
///
/// # Safety
/// `h` and `seg` were packed by the engine for a live group: every address in them is valid
/// for the accesses the protocol makes (see `memory`).
pub(crate) unsafe fn collective(h: &Header, seg: &[Seg], watch: &dyn Watch) -> u64 {
    let status = h.ctl[h.rank as usize] + u64::from(h.off_status);
    // SAFETY: the status line of this rank's live staging (caller).
    let st = |i: usize| unsafe { word(status + 8 * i as u64) };
    let abort = st(ST_ABORT).load(Ordering::Relaxed);
    let gen_word = st(ST_GEN).load(Ordering::Relaxed);
    let refresh_left = st(ST_REFRESH).load(Ordering::Relaxed);
    let g = (gen_word as u32).wrapping_add(1);
    let refresh = (g >> 1) & LL_EPOCH_MASK == 0 || refresh_left != 0;
    let frame = h.frame[(g & 1) as usize];
    if abort != 0 {
        return frame; // later calls of a failed rank touch nothing
    }
    let call = Call { h, seg, status, g, word: FlagWord::of(g, h.digest).0, frame, watch };
    // SAFETY: forwarded (caller).
    unsafe {
        call.prologue(refresh);
        match h.mode {
            MODE_PUSH_LL => ll::run(&call),
            MODE_PUSH => bulk::run(&call),
            _ => pull::run(&call),
        }
    }
    // The last block to finish (here: after every block) advances the generation and counts a
    // requested refresh down.
    if refresh_left != 0 {
        st(ST_REFRESH).store(refresh_left - 1, Ordering::Relaxed);
    }
    st(ST_GEN).store(u64::from(g), Ordering::Release);
    frame
}

impl Call<'_> {
    fn rank(&self) -> u32 {
        self.h.rank
    }

    fn peers(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.h.world).filter(|&q| q != self.h.rank)
    }

    /// Address `off` of rank `q`'s control block.
    fn ctl(&self, q: u32, off: u64) -> u64 {
        self.h.ctl[q as usize] + off
    }

    /// Address of frame `g % 2` of rank `q`, plus `off`.
    fn data(&self, q: u32, off: u64) -> u64 {
        self.h.data[q as usize] + self.frame + off
    }

    fn line(&self) -> u64 {
        u64::from(self.h.line)
    }

    fn aborted(&self) -> bool {
        // SAFETY: this rank's status line (the call's invariant).
        unsafe { word(self.status + 8 * ST_ABORT as u64) }.load(Ordering::Relaxed) != 0
    }

    /// What block 0 does before any block's work (`dc_collective_mode`'s prologue): the LL
    /// epoch refresh; the signature; the push headers (LL calls, and every call once per epoch);
    /// on a refresh, every flag this call does not use rewritten with its word; otherwise, on
    /// the push routes, the word in the first pull flags (a pull peer meets it as a mismatch).
    ///
    /// # Safety
    /// The call's invariant (see [`collective`]).
    unsafe fn prologue(&self, refresh: bool) {
        let h = self.h;
        let push = h.mode != detcoll_protocol::params::MODE_PULL;
        let w = self.word;
        let store = |addr: u64, v: u64, o: Ordering| {
            // SAFETY: a control word of a live staging (the call's invariant).
            unsafe { word(addr) }.store(v, o)
        };
        if refresh && h.ll_slot != 0 {
            for b in 0..h.grid {
                // SAFETY: forwarded.
                unsafe { ll::refresh(self, b) };
            }
        }
        let sig = u64::from(if self.g & 1 == 1 { h.off_sig1 } else { h.off_sig0 });
        store(self.ctl(self.rank(), sig), h.sig[0], Ordering::Relaxed);
        store(self.ctl(self.rank(), sig + 8), h.sig[1], Ordering::Relaxed);
        if h.mode == MODE_PUSH_LL || refresh {
            let at = u64::from(h.off_push) + (u64::from(self.g & 1) * 8 + u64::from(self.rank())) * self.line();
            for q in self.peers() {
                store(self.ctl(q, at), w, Ordering::Relaxed);
            }
        }
        if refresh {
            let own = |off: u32, k: u32| self.ctl(self.rank(), u64::from(off) + u64::from(k) * self.line());
            let used = if push { 0 } else { h.grid };
            for k in used..h.layout_blocks {
                store(own(h.off_ready, k), w, Ordering::Relaxed);
            }
            let from = if h.nphase2 != 0 && !push { h.grid } else { 0 };
            for k in from..h.layout_blocks {
                store(own(h.off_phase2, k), w, Ordering::Relaxed);
            }
            let bulk = h.mode == MODE_PUSH;
            let gathered = bulk && h.nstage > 0 && self.seg[0].flags & detcoll_protocol::params::SEG_AG != 0;
            for k in 0..2u32 {
                let used = bulk && if k == 0 { !gathered } else { gathered || h.nphase2 > 0 };
                for blk in (if used { h.grid } else { 0 })..h.layout_blocks {
                    for q in self.peers() {
                        store(bulk::flag(self, q, k, blk, self.rank()), w, Ordering::Relaxed);
                    }
                }
            }
        } else if push {
            store(self.ctl(self.rank(), u64::from(h.off_ready)), w, Ordering::Relaxed);
            store(self.ctl(self.rank(), u64::from(h.off_phase2)), w, Ordering::Relaxed);
        }
    }

    /// Records this rank's first failure (`dc_fail`): the status word decides the winner, the
    /// winner fills the host record, the code last.
    fn fail(&self, code: u64, peer: u32, observed: u64) {
        // SAFETY: this rank's status line (the call's invariant).
        let abort = unsafe { word(self.status + 8 * ST_ABORT as u64) };
        if abort.compare_exchange(0, code, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        // SAFETY: the launching rank's error record, RECORD_WORDS words (the call's invariant).
        let e = |i: u64| unsafe { word(self.h.err + 8 * i) };
        e(1).store(u64::from(peer), Ordering::Relaxed);
        e(2).store(u64::from(self.g), Ordering::Relaxed);
        e(3).store(observed, Ordering::Relaxed);
        e(4).store(self.h.sig[0], Ordering::Relaxed);
        e(5).store(self.h.sig[1], Ordering::Relaxed);
        if code == ERR_MISMATCH {
            // The peer stores its signature before the flag we saw, without a fence on the push
            // routes: read until its digest is the flag's (bounded).
            let sig = u64::from(if self.g & 1 == 1 { self.h.off_sig1 } else { self.h.off_sig0 });
            // SAFETY: the peer's signature slot, in its live staging.
            let theirs = |i: u64| unsafe { word(self.ctl(peer, sig + 8 * i)) }.load(Ordering::Acquire);
            let start = Instant::now();
            let (mut a, mut b) = (theirs(0), theirs(1));
            while collective_core::Signature::digest_of([a, b]) != observed as u32 && !self.past(start) {
                (a, b) = (theirs(0), theirs(1));
            }
            e(6).store(a, Ordering::Relaxed);
            e(7).store(b, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        e(0).store(code, Ordering::Release);
    }

    /// A pull wait found a mismatch (`dc_publish_mismatch`): the signature, then this rank's
    /// word in every ready line, before the abort, so a peer waiting on any of our lines reads
    /// the mismatch itself and names both calls, not only our failure (the kernels' blocks may
    /// not have published the line a peer watches yet; here every block before the finding one
    /// has, so this only keeps the two executions one protocol). Our word never reads as ready
    /// to a rank whose call differs; a rank whose call is ours fails on the mismatching rank's
    /// line, so no rank reduces a line published without its data.
    fn publish_mismatch(&self) {
        let h = self.h;
        let at = |off: u64| {
            // SAFETY: a control word of this rank's live staging (the call's invariant).
            unsafe { word(self.ctl(self.rank(), off)) }
        };
        let sig = u64::from(if self.g & 1 == 1 { h.off_sig1 } else { h.off_sig0 });
        at(sig).store(h.sig[0], Ordering::Relaxed);
        at(sig + 8).store(h.sig[1], Ordering::Relaxed);
        fence(Ordering::SeqCst);
        for k in 0..h.layout_blocks {
            at(u64::from(h.off_ready) + u64::from(k) * self.line()).store(self.word, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
    }

    /// Whether a wait that started at `start` is past the bound.
    fn past(&self, start: Instant) -> bool {
        start.elapsed() > Duration::from_nanos(self.h.timeout_ns)
    }

    /// Waits until every peer's flag shows this call's generation with its digest (or the next
    /// one), `dc_wait`: at `off` of every peer's control block, or (`local`) at `off + q * line`
    /// of this rank's own (flags the senders write into the receiver). Returns false if the call
    /// must end (a failure recorded by this wait or seen in this rank's status).
    fn wait(&self, off: u64, timeout_code: u64, local: bool) -> bool {
        for t in self.peers() {
            let flag = if local { self.ctl(self.rank(), off + u64::from(t) * self.line()) } else { self.ctl(t, off) };
            // SAFETY: a flag word of a live staging (the call's invariant).
            let flag = unsafe { word(flag) };
            let digest = self.h.digest;
            let g = self.g;
            let probe = || {
                let v = flag.load(Ordering::Acquire);
                match FlagWord(v).check(g, digest) {
                    FlagState::Behind => None,
                    state => Some((state, v)),
                }
            };
            let got = self.poll(t, timeout_code, probe, |&(state, _)| state == FlagState::Mismatch);
            match got {
                Some((FlagState::Ready | FlagState::Passed, _)) => {}
                Some((state, v)) => {
                    if !local && state == FlagState::Mismatch {
                        self.publish_mismatch();
                    }
                    if local && state == FlagState::Mismatch {
                        // As `dc_wait`: our own word into this peer's line first (what our
                        // publisher writes there; a mismatching peer can only read it as a
                        // mismatch), ordered before our abort, so the peer finds the mismatch
                        // itself even when our publisher has not yet run.
                        let ours = self.ctl(t, off + u64::from(self.rank()) * self.line());
                        // SAFETY: a flag word of the peer's live staging (the call's invariant).
                        unsafe { word(ours) }.store(self.word, Ordering::Relaxed);
                        fence(Ordering::SeqCst);
                    }
                    self.fail(if state == FlagState::Mismatch { ERR_MISMATCH } else { ERR_CORRUPT }, t, v);
                    return false;
                }
                None => return false,
            }
        }
        true
    }

    /// Polls `probe` until it yields: spinning, then yielding, then sleeping (a host thread must
    /// not starve the peer it waits for); ends early — recording why, except when this rank
    /// already failed — when this rank or `peer` recorded a failure, `peer` closed its handle or
    /// its process exited, or the bound passed (recorded as `timeout_code`). A closed or exited
    /// peer's last publications are visible: `probe` is asked once more first. So is it after
    /// `peer`'s failure, whose answer counts only where `after_failure` accepts it (`wait`: a
    /// mismatch, which a failing peer publishes before its failure).
    fn poll<T>(
        &self,
        peer: u32,
        timeout_code: u64,
        mut probe: impl FnMut() -> Option<T>,
        after_failure: impl Fn(&T) -> bool,
    ) -> Option<T> {
        for _ in 0..256 {
            if let Some(v) = probe() {
                return Some(v);
            }
            core::hint::spin_loop();
        }
        let start = Instant::now();
        let closed = self.ctl(self.rank(), u64::from(self.h.off_ack) + u64::from(peer) * self.line());
        // SAFETY: status line and ack line of live stagings (the call's invariant).
        let (peer_abort, closed) =
            unsafe { (word(self.ctl(peer, u64::from(self.h.off_status) + 8 * ST_ABORT as u64)), word(closed)) };
        let mut polls = 0u32;
        loop {
            std::thread::yield_now();
            if let Some(v) = probe() {
                return Some(v);
            }
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(16) {
                continue;
            }
            if self.aborted() {
                return None;
            }
            if self.watch.faulted() {
                self.fail(ERR_HOST_FAULT, peer, 0);
                return None;
            }
            let pa = peer_abort.load(Ordering::Acquire);
            if pa != 0 {
                if let Some(v) = probe().filter(&after_failure) {
                    return Some(v);
                }
                // A peer that failed and has since exited is gone: PeerDied, not PeerFailed
                // (which says the peer is alive).
                match self.watch.exited(peer as usize) {
                    Some(pid) => self.fail(ERR_PEER_EXITED, peer, u64::from(pid)),
                    None => self.fail(ERR_PEER_FAILED, peer, pa),
                }
                return None;
            }
            if self.past(start) {
                self.fail(timeout_code, peer, 0);
                return None;
            }
            if closed.load(Ordering::Acquire) == CLOSE_ACK {
                let last = probe();
                if last.is_none() {
                    self.fail(ERR_PEER_CLOSED, peer, 0);
                }
                return last;
            }
            if let Some(pid) = self.watch.exited(peer as usize) {
                let last = probe();
                if last.is_none() {
                    self.fail(ERR_PEER_EXITED, peer, u64::from(pid));
                }
                return last;
            }
            if start.elapsed() > Duration::from_millis(2) {
                // A long wait: stop burning a core the peer may need.
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// Calls `body(lo, hi)` for every piece of `[seg_lo, seg_lo + bytes)` in a tile of block `b`
/// (`dc_for_tiles`: tile `t` belongs to block `t % grid` in every phase and on every rank).
fn for_tiles(seg_lo: u64, bytes: u64, tile: u64, grid: u32, b: u32, mut body: impl FnMut(u64, u64)) {
    if bytes == 0 {
        return;
    }
    let (grid, b) = (u64::from(grid), u64::from(b));
    let seg_hi = seg_lo + bytes;
    let mut t = seg_lo / tile;
    let r = t % grid;
    t += (b + grid - r) % grid;
    while t * tile < seg_hi {
        body((t * tile).max(seg_lo), ((t + 1) * tile).min(seg_hi));
        t += grid;
    }
}

pub(crate) use memory::tree;
