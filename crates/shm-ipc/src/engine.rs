//! The host executor of the shared protocol: runs a [`Plan`] over every rank's region.
use crate::region::Region;
use crate::wait::{Peer, wait_flag, wait_ll, wait_value};
use collective_core::protocol::status::LL_EPOCH_MASK;
use collective_core::protocol::{CLOSE_ACK, FlagState, FlagWord, Layout, Phase, Plan, Poison, Segment, Timeouts};
use collective_core::{DType, Error, Route, Signature};
use half::{bf16, f16};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One rank's view of every rank's region, and its protocol state.
#[derive(Debug)]
pub(crate) struct Engine {
    pub rank: usize,
    pub world: usize,
    pub layout: Layout,
    /// Every rank's region, in rank order (this rank's own included).
    regions: Vec<Arc<Region>>,
    peers: Vec<Peer>,
    pub timeouts: Timeouts,
    /// The last generation this rank completed; the lock also serialises calls on one handle.
    generation: Mutex<u32>,
    pub poison: Poison,
}

impl Engine {
    pub(crate) fn new(
        rank: usize,
        layout: Layout,
        regions: Vec<Arc<Region>>,
        peers: Vec<Peer>,
        timeouts: Timeouts,
        start: u32,
    ) -> Engine {
        Engine {
            rank,
            world: regions.len(),
            layout,
            regions,
            peers,
            timeouts,
            generation: Mutex::new(start),
            poison: Poison::default(),
        }
    }

    fn word(&self, rank: usize, offset: usize) -> &AtomicU64 {
        debug_assert!(offset + 8 <= self.regions[rank].len() && offset % 8 == 0);
        // SAFETY: in bounds of a live, 8-aligned region; control words are only accessed atomically.
        unsafe { &*self.regions[rank].base().add(offset).cast::<AtomicU64>() }
    }

    /// Presets `region`'s ready flag, push headers and bulk push flags as if its owner had
    /// completed generation `start` (digest 0), so peers read them as behind for the next call,
    /// and every LL word with flag `start`; phase-2 flags stay 0, as after construction (the
    /// state after `start` one-shot calls of an engine without the refresh in [`Engine::run`]).
    /// Test support: call before any engine uses the region.
    pub(crate) fn preset_generation(layout: &Layout, region: &Region, start: u32) {
        let word = u64::from(start) << 32;
        let at = |off: usize| {
            // SAFETY: every offset below is a control word of the layout (in bounds, 8-aligned);
            // no rank uses the region yet.
            unsafe { &*region.base().add(off).cast::<AtomicU64>() }
        };
        for b in 0..layout.blocks() {
            at(layout.ready(b)).store(word, Ordering::Release);
        }
        // Push headers as published at `start`, and every LL word carrying flag `start` (what
        // the epoch refresh would have left; construction's 0 would read as current at
        // generation 0).
        for parity in 0..2 {
            for q in 0..8 {
                at(layout.push_header(parity, q)).store(word, Ordering::Release);
                at(layout.push_flag(parity, 0, q)).store(word, Ordering::Release);
            }
        }
        if layout.ll_capacity() > 0 {
            let (lo, hi) = (layout.ll_area(), layout.control_bytes());
            for off in (lo..hi).step_by(8) {
                at(off).store(word, Ordering::Relaxed);
            }
        }
    }

    fn frame(&self, rank: usize, parity: usize) -> *mut u8 {
        // SAFETY: the frame offset is inside the region (Layout::total_bytes).
        unsafe { self.regions[rank].base().add(self.layout.frame(parity)) }
    }

    /// Runs one call: stage, publish, wait, reduce/gather (and the RS+AG second phase).
    /// Any protocol failure poisons the engine.
    pub(crate) fn execute(&self, plan: &Plan) -> Result<(), Error> {
        self.poison.check()?;
        let mut generation = self.generation.lock().map_err(|_| Error::Poisoned { cause: "a call panicked".into() })?;
        let g = generation.wrapping_add(1);
        let result = self.run(plan, g);
        // A shared object truncated under its mapping during the call (crate::guard): what the
        // call read from it was zeros, so it fails, whatever the run said.
        let result = match self.fault() {
            Some(e) => Err(e),
            None => result,
        };
        result.map_err(|e| self.poison.record(e))?;
        *generation = g;
        Ok(())
    }

    /// The error for the first region (in rank order) whose shared object was truncated under
    /// this rank's mapping of it — an access faulted and the guard put zero pages there — if
    /// any did. One atomic load while nothing ever faulted in this process.
    fn fault(&self) -> Option<Error> {
        if !crate::guard::any_fault() {
            return None;
        }
        let q = self.regions.iter().position(|r| r.faulted())?;
        const HOW: &str = "while this rank had it mapped (an access faulted with SIGBUS, caught by the guard): what \
                           this rank read from it is lost, the collective fails closed";
        Some(if q == self.rank {
            Error::Backend {
                backend: "shm-ipc",
                detail: format!("this rank's own shared-memory object was truncated by another process {HOW}"),
            }
        } else {
            Error::PeerDied { peer: q, detail: format!("its shared-memory object was truncated {HOW}") }
        })
    }

    /// The LL word `index` (payload bytes `4 * index ..`) of `sender`'s slot of `parity` in
    /// `owner`'s region.
    fn ll_word(&self, owner: usize, parity: usize, sender: usize, index: usize) -> &AtomicU64 {
        self.word(owner, self.layout.ll_slot(parity, sender) + 8 * index)
    }

    /// The duties every call has towards the routes it does not take, so that no flag or LL
    /// word ever falls far behind (the GPU kernels do the same): the push headers in every
    /// peer (a push call's receivers wait on them), and once per 2^30 generations (g mod 2^30
    /// in {0, 1}, one call per parity) every LL word of this rank's slot in every peer,
    /// rewritten with flag g - 2, which no receiver waits for. Called before the call's own
    /// sends, so in the same thread a refreshed word is always overwritten by this call's data.
    fn keep_fresh(&self, plan: &Plan, parity: usize, g: u32, word: u64) {
        for q in (0..self.world).filter(|&q| q != self.rank) {
            self.word(q, self.layout.push_header(parity, self.rank)).store(word, Ordering::Release);
        }
        if (g >> 1) & LL_EPOCH_MASK == 0 {
            // The bulk push flags this call does not use (the GPU kernels' rule).
            let (uses0, uses1) = bulk_phases(plan);
            for (phase, used) in [(0, uses0), (1, uses1)] {
                if !used {
                    for q in (0..self.world).filter(|&q| q != self.rank) {
                        self.word(q, self.layout.push_flag(phase, 0, self.rank)).store(word, Ordering::Release);
                    }
                }
            }
        }
        if self.layout.ll_capacity() > 0 && (g >> 1) & LL_EPOCH_MASK == 0 {
            let stale = u64::from(g.wrapping_sub(2)) << 32;
            for q in (0..self.world).filter(|&q| q != self.rank) {
                for i in 0..self.layout.ll_slot_bytes() / 8 {
                    self.ll_word(q, parity, self.rank, i).store(stale, Ordering::Relaxed);
                }
            }
        }
    }

    /// What both push routes do first: the call's signature in the own slot of `parity`, the
    /// pull flags the call does not use (a push call uses none) rewritten with its word, and
    /// [`Engine::keep_fresh`]. Returns the call's flag word.
    fn push_prologue(&self, plan: &Plan, parity: usize, g: u32) -> u64 {
        let sig_words = plan.sig.pack();
        let slot = self.layout.sig_slot(parity);
        self.word(self.rank, slot).store(sig_words[0], Ordering::Relaxed);
        self.word(self.rank, slot + 8).store(sig_words[1], Ordering::Relaxed);
        let flag = FlagWord::publish(g, &plan.sig).0;
        self.word(self.rank, self.layout.ready(0)).store(flag, Ordering::Release);
        self.word(self.rank, self.layout.phase2(0)).store(flag, Ordering::Release);
        self.keep_fresh(plan, parity, g, flag);
        flag
    }

    /// The LL push route: write this rank's values into its slot of every peer (reduce_scatter:
    /// shard `q` to peer `q`), wait for every sender's push header (same call?), then read the
    /// own slots — each LL word is waited for by its own flag — and reduce or gather.
    fn run_push(&self, plan: &Plan, g: u32) -> Result<(), Error> {
        let parity = (g & 1) as usize;
        let size = plan.sig.dtype.size();
        self.push_prologue(plan, parity, g);
        let high = u64::from(g) << 32;
        for s in plan.stage.as_slice() {
            let first = s.frame_offset * size / 4;
            let bytes = s.count * size;
            for q in (0..self.world).filter(|&q| q != self.rank) {
                let src = match s.phase {
                    Phase::Scatter => s.src + (q * bytes) as u64,
                    _ => s.src,
                };
                for i in 0..bytes.div_ceil(4) {
                    let n = (bytes - 4 * i).min(4);
                    let mut w = [0u8; 4];
                    // SAFETY: `src` is a validated caller view of `bytes` bytes; `4 * i + n <= bytes`.
                    unsafe { core::ptr::copy_nonoverlapping((src as *const u8).add(4 * i), w.as_mut_ptr(), n) };
                    self.ll_word(q, parity, self.rank, first + i)
                        .store(high | u64::from(u32::from_le_bytes(w)), Ordering::Relaxed);
                }
            }
        }
        let header = |q: usize| self.word(self.rank, self.layout.push_header(parity, q));
        self.wait_all_at(&header, g, &plan.sig, parity, "push its input")?;
        for s in plan.phase1.as_slice() {
            self.push_segment(s, plan.sig.dtype, parity, g)?;
        }
        Ok(())
    }

    /// `count` elements of `peer`'s slot from payload offset `frame_offset` into `out` (whole
    /// words), each word waited for by its flag.
    fn read_slot(
        &self,
        peer: usize,
        parity: usize,
        g: u32,
        s: &Segment,
        size: usize,
        out: &mut [u64],
    ) -> Result<(), Error> {
        let first = s.frame_offset * size / 4;
        let words = (s.count * size).div_ceil(4);
        let closed = self.word(self.rank, self.layout.ack(peer));
        let p = self.peers[peer];
        for i in 0..words {
            let word = self.ll_word(self.rank, parity, peer, first + i);
            let v = wait_ll(word, closed, g, p, self.timeouts.peer, &|| self.fault())?;
            // Two payload words per u64 of scratch, little-endian: the bytes in order.
            let shift = 32 * (i & 1);
            out[i / 2] = (out[i / 2] & !(0xFFFF_FFFFu64 << shift)) | (u64::from(v) << shift);
        }
        Ok(())
    }

    /// One receive segment of the push route.
    fn push_segment(&self, s: &Segment, dtype: DType, parity: usize, g: u32) -> Result<(), Error> {
        let size = dtype.size();
        let bytes = s.count * size;
        let words = bytes.div_ceil(8);
        match s.phase {
            Phase::Gather if s.peer == self.rank => {
                if s.src != s.dst {
                    // SAFETY: validated caller views of `bytes` bytes that do not overlap
                    // (out of place: validated; in place: src == dst, skipped).
                    unsafe { core::ptr::copy_nonoverlapping(s.src as *const u8, s.dst as *mut u8, bytes) };
                }
            }
            Phase::Gather => {
                let mut tmp = vec![0u64; words];
                self.read_slot(s.peer, parity, g, s, size, &mut tmp)?;
                // SAFETY: `dst` is a validated caller view of `bytes` bytes; `tmp` holds at least as many.
                unsafe { core::ptr::copy_nonoverlapping(tmp.as_ptr().cast::<u8>(), s.dst as *mut u8, bytes) };
            }
            Phase::Reduce => {
                // Every leaf in scratch (the own one copied too: in place, `dst` is `src`).
                let mut leaves = vec![0u64; words * self.world];
                for (q, leaf) in leaves.chunks_mut(words.max(1)).enumerate().take(self.world) {
                    if q == self.rank {
                        // SAFETY: `src` is a validated caller view of `bytes` bytes.
                        unsafe {
                            core::ptr::copy_nonoverlapping(s.src as *const u8, leaf.as_mut_ptr().cast::<u8>(), bytes)
                        };
                    } else {
                        self.read_slot(q, parity, g, s, size, leaf)?;
                    }
                }
                let mut frames = [core::ptr::null::<u8>(); 8];
                for (q, f) in frames.iter_mut().enumerate().take(self.world) {
                    *f = leaves[q * words..].as_ptr().cast::<u8>();
                }
                let frames = &frames[..self.world];
                match dtype {
                    DType::F32 => reduce::<f32>(frames, s.dst, s.count),
                    DType::F16 => reduce::<f16>(frames, s.dst, s.count),
                    DType::BF16 => reduce::<bf16>(frames, s.dst, s.count),
                    _ => unreachable!("validation admits only reducible dtypes to Reduce"),
                }
            }
            Phase::Stage | Phase::Send | Phase::Scatter | Phase::SendTo => {}
        }
        Ok(())
    }

    /// The bulk push route: copy each slice into its owner's frame (slot of this rank), flag
    /// it (phase 0; all_gather: phase 1), wait for the own flags, reduce the own shard over the
    /// own input and the slots in rank order — all_reduce: also into every peer's reduced-shard
    /// slot, flagged in phase 1 — then copy the gathered slots out.
    fn run_bulk(&self, plan: &Plan, g: u32) -> Result<(), Error> {
        let parity = (g & 1) as usize;
        let size = plan.sig.dtype.size();
        let flag = self.push_prologue(plan, parity, g);
        for s in plan.stage.as_slice() {
            // SAFETY: `src` is a validated caller view of `count` elements; the slot lies in the
            // peer's frame (the plan fits the capacity) and the peer reads it only after our flag.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    s.src as *const u8,
                    self.frame(s.peer, parity).add(s.frame_offset * size),
                    s.count * size,
                )
            };
        }
        let (uses0, _) = bulk_phases(plan);
        let first = if uses0 { 0 } else { 1 };
        self.bulk_round(plan, first, parity, g, flag)?;
        for s in plan.phase1.as_slice() {
            self.bulk_segment(plan, s, parity);
        }
        if !plan.phase2.as_slice().is_empty() {
            self.bulk_round(plan, 1, parity, g, flag)?;
            for s in plan.phase2.as_slice() {
                self.bulk_segment(plan, s, parity);
            }
        }
        Ok(())
    }

    /// Publishes this rank's flag of `phase` in every peer, then waits for every peer's in the
    /// own control block.
    fn bulk_round(&self, plan: &Plan, phase: usize, parity: usize, g: u32, flag: u64) -> Result<(), Error> {
        for q in (0..self.world).filter(|&q| q != self.rank) {
            self.word(q, self.layout.push_flag(phase, 0, self.rank)).store(flag, Ordering::Release);
        }
        let at = |q: usize| self.word(self.rank, self.layout.push_flag(phase, 0, q));
        self.wait_all_at(&at, g, &plan.sig, parity, if phase == 0 { "push its slices" } else { "push its shard" })
    }

    /// One receive segment of the bulk push route.
    fn bulk_segment(&self, plan: &Plan, s: &Segment, parity: usize) {
        let size = plan.sig.dtype.size();
        let bytes = s.count * size;
        let own = self.frame(self.rank, parity);
        match s.phase {
            Phase::Gather if s.peer == self.rank => {
                if s.src != s.dst {
                    // SAFETY: validated caller views that do not overlap (out of place).
                    unsafe { core::ptr::copy_nonoverlapping(s.src as *const u8, s.dst as *mut u8, bytes) };
                }
            }
            Phase::Gather => {
                // SAFETY: the peer's slot of the own frame, published (acquire); `dst` a validated view.
                unsafe { core::ptr::copy_nonoverlapping(own.add(s.frame_offset * size), s.dst as *mut u8, bytes) };
            }
            Phase::Reduce => {
                // The own leaf in scratch: in place, `dst` is `src`.
                let mut mine = vec![0u64; bytes.div_ceil(8)];
                // SAFETY: `src` is a validated caller view of `bytes` bytes.
                unsafe { core::ptr::copy_nonoverlapping(s.src as *const u8, mine.as_mut_ptr().cast::<u8>(), bytes) };
                let mut frames = [core::ptr::null::<u8>(); 8];
                for (q, f) in frames.iter_mut().enumerate().take(self.world) {
                    *f = if q == self.rank {
                        mine.as_ptr().cast::<u8>()
                    } else {
                        // SAFETY: sender q's slot of the own frame (inside the plan's frame use).
                        unsafe { own.add((s.frame_offset + q * plan.slot_stride) * size).cast_const() }
                    };
                }
                let frames = &frames[..self.world];
                match plan.sig.dtype {
                    DType::F32 => reduce::<f32>(frames, s.dst, s.count),
                    DType::F16 => reduce::<f16>(frames, s.dst, s.count),
                    DType::BF16 => reduce::<bf16>(frames, s.dst, s.count),
                    _ => unreachable!("validation admits only reducible dtypes to Reduce"),
                }
                if s.write_back {
                    let slot = (plan.ag_base + self.rank * plan.slot_stride) * size;
                    for q in (0..self.world).filter(|&q| q != self.rank) {
                        // SAFETY: our reduced-shard slot in peer q's frame; q reads it only
                        // after our phase-1 flag.
                        unsafe {
                            core::ptr::copy_nonoverlapping(s.dst as *const u8, self.frame(q, parity).add(slot), bytes)
                        };
                    }
                }
            }
            Phase::Stage | Phase::Send | Phase::Scatter | Phase::SendTo => {}
        }
    }

    fn run(&self, plan: &Plan, g: u32) -> Result<(), Error> {
        if plan.route == Route::IpcPushLl {
            return self.run_push(plan, g);
        }
        if plan.route == Route::IpcPush {
            return self.run_bulk(plan, g);
        }
        let parity = (g & 1) as usize;
        let size = plan.sig.dtype.size();
        let own = self.frame(self.rank, parity);
        for s in plan.stage.as_slice() {
            // SAFETY: `src` is a validated caller view of `count` elements; the frame range lies
            // within capacity (validated) and no peer reads it before our release below.
            unsafe {
                core::ptr::copy_nonoverlapping(s.src as *const u8, own.add(s.frame_offset * size), s.count * size)
            };
        }
        let sig_words = plan.sig.pack();
        let slot = self.layout.sig_slot(parity);
        self.word(self.rank, slot).store(sig_words[0], Ordering::Relaxed);
        self.word(self.rank, slot + 8).store(sig_words[1], Ordering::Relaxed);
        let flag = FlagWord::publish(g, &plan.sig).0;
        self.keep_fresh(plan, parity, g, flag);
        let two_phase = !plan.phase2.as_slice().is_empty();
        if !two_phase {
            // Refresh the phase-2 flag this call does not use (as the GPU kernels do), so it
            // never falls more than one generation behind: after 2^31 calls without RS+AG a
            // stale phase-2 word would read as Corrupt to the next RS+AG call's waiters.
            //
            // Safe with double-buffered frames: a peer making this same call never waits on
            // phase 2 (same signature, same plan). A peer still finishing call g-1's phase 2
            // waits for our phase-2 word >= g-1; it now sees g ("Passed") and reads our frame of
            // parity g-1, which holds our g-1 reduced shard: we published that (release) before
            // this store, this call writes only the other frame, and we overwrite frame g-1
            // only in call g+1, after seeing that peer's ready flag of call g — published once
            // it finished reading call g-1. A peer making a different call sees our digest at
            // its ready wait and reports a mismatch before it ever reaches phase 2.
            self.word(self.rank, self.layout.phase2(0)).store(flag, Ordering::Release);
        }
        self.word(self.rank, self.layout.ready(0)).store(flag, Ordering::Release);
        self.wait_all(self.layout.ready(0), g, &plan.sig, parity, "publish its input")?;
        for s in plan.phase1.as_slice() {
            self.segment(s, plan.sig.dtype, parity);
        }
        if two_phase {
            self.word(self.rank, self.layout.phase2(0)).store(flag, Ordering::Release);
            self.wait_all(self.layout.phase2(0), g, &plan.sig, parity, "publish its reduced shard")?;
            for s in plan.phase2.as_slice() {
                self.segment(s, plan.sig.dtype, parity);
            }
        }
        Ok(())
    }

    fn wait_all(&self, offset: usize, g: u32, sig: &Signature, parity: usize, what: &'static str) -> Result<(), Error> {
        self.wait_all_at(&|q| self.word(q, offset), g, sig, parity, what)
    }

    /// Waits for every peer's flag `flag_of(peer)` to show generation `g` with `sig`'s digest.
    fn wait_all_at<'a>(
        &'a self,
        flag_of: &dyn Fn(usize) -> &'a AtomicU64,
        g: u32,
        sig: &Signature,
        parity: usize,
        what: &'static str,
    ) -> Result<(), Error> {
        let digest = sig.digest();
        for peer in self.peers.iter().filter(|p| p.rank != self.rank) {
            let closed = self.word(self.rank, self.layout.ack(peer.rank));
            let fault = || self.fault();
            let state = match wait_flag(flag_of(peer.rank), closed, g, digest, *peer, self.timeouts.peer, what, &fault)
            {
                Ok(state) => state,
                Err(e @ (Error::PeerClosed { .. } | Error::PeerDied { .. })) => {
                    // A truncated object (crate::guard): its flags are zero pages now, no
                    // culprit can be read there.
                    if let Some(f) = self.fault() {
                        return Err(f);
                    }
                    // A peer that saw a mismatched call fails and may close or exit before this
                    // rank looked at the culprit: report the mismatch, the cause, when one shows.
                    let culprit = self.peers.iter().filter(|p| p.rank != self.rank).find(|p| {
                        FlagWord(flag_of(p.rank).load(Ordering::Acquire)).check(g, digest) == FlagState::Mismatch
                    });
                    return Err(culprit.map_or(e, |p| self.mismatch(p.rank, sig, parity)));
                }
                Err(e) => return Err(e),
            };
            match state {
                FlagState::Ready | FlagState::Passed => {}
                FlagState::Mismatch => return Err(self.mismatch(peer.rank, sig, parity)),
                FlagState::Behind | FlagState::Corrupt => {
                    return Err(Error::Backend {
                        backend: "shm-ipc",
                        detail: format!(
                            "rank {} is more than one generation ahead of generation {g}: the ranks' call sequences diverged",
                            peer.rank
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The error for rank `peer`, which published another call's signature with frame `parity`.
    fn mismatch(&self, peer: usize, sig: &Signature, parity: usize) -> Error {
        let slot = self.layout.sig_slot(parity);
        let w = [self.word(peer, slot).load(Ordering::Relaxed), self.word(peer, slot + 8).load(Ordering::Relaxed)];
        match Signature::unpack(w) {
            Some(theirs) => Error::SignatureMismatch { peer, ours: *sig, theirs },
            None => {
                Error::Backend { backend: "shm-ipc", detail: format!("rank {peer} published an unreadable signature") }
            }
        }
    }

    /// Executes one reduce or gather segment of generation parity `parity`.
    fn segment(&self, s: &Segment, dtype: DType, parity: usize) {
        let size = dtype.size();
        let at = |rank: usize| {
            // SAFETY: offset within the frame (validated against capacity).
            unsafe { self.frame(rank, parity).add(s.frame_offset * size) }
        };
        match s.phase {
            Phase::Stage | Phase::Send | Phase::Scatter | Phase::SendTo => {}
            Phase::Gather => {
                // SAFETY: the peer published this range (acquire) and does not rewrite it before
                // it has seen our next generation's flag; `dst` is a validated caller view.
                unsafe { core::ptr::copy_nonoverlapping(at(s.peer), s.dst as *mut u8, s.count * size) };
            }
            Phase::Reduce => {
                let mut frames = [core::ptr::null::<u8>(); 8];
                for (q, f) in frames.iter_mut().enumerate().take(self.world) {
                    *f = at(q).cast_const();
                }
                let frames = &frames[..self.world];
                match dtype {
                    DType::F32 => reduce::<f32>(frames, s.dst, s.count),
                    DType::F16 => reduce::<f16>(frames, s.dst, s.count),
                    DType::BF16 => reduce::<bf16>(frames, s.dst, s.count),
                    _ => unreachable!("validation admits only reducible dtypes to Reduce"),
                }
                if s.write_back {
                    // SAFETY: our own frame range; only this rank reads it during phase 1.
                    unsafe { core::ptr::copy_nonoverlapping(s.dst as *const u8, at(self.rank), s.count * size) };
                }
            }
        }
    }

    /// Tells every peer this rank will never read its region again.
    pub(crate) fn acknowledge(&self) {
        for q in (0..self.world).filter(|&q| q != self.rank) {
            self.word(q, self.layout.ack(self.rank)).store(CLOSE_ACK, Ordering::Release);
        }
    }

    /// Close: acknowledge every peer, then wait (bounded) for every peer's acknowledgement
    /// before this rank's region may be freed. Returns whether all acknowledged.
    pub(crate) fn close(&self) -> Result<(), Error> {
        self.acknowledge();
        for peer in self.peers.iter().filter(|p| p.rank != self.rank) {
            wait_value(
                self.word(self.rank, self.layout.ack(peer.rank)),
                CLOSE_ACK,
                *peer,
                self.timeouts.close,
                "acknowledge close",
                &|| self.fault(),
            )?;
        }
        Ok(())
    }
}

/// Which bulk push flag phases `plan` waits on: (phase 0: slices for the own shard, phase 1:
/// gathered data — all_gather's inputs, all_reduce's reduced shards).
fn bulk_phases(plan: &Plan) -> (bool, bool) {
    if plan.route != Route::IpcPush {
        return (false, false);
    }
    let gathered = plan.sig.op == collective_core::Op::AllGather;
    (!gathered, gathered || !plan.phase2.as_slice().is_empty())
}

/// The fixed tree over `frames` (one per rank, in rank order), `count` elements, into `dst`.
fn reduce<T: fixed_tree::Element>(frames: &[*const u8], dst: u64, count: usize) {
    const CHUNK: usize = 4096;
    let mut done = 0;
    while done < count {
        let n = CHUNK.min(count - done);
        let mut ranks: [&[T]; 8] = [&[]; 8];
        for (slot, f) in ranks.iter_mut().zip(frames) {
            // SAFETY: published peer frames, aligned to T (frames are page aligned, offsets are
            // element multiples), not written until every reader moved on.
            *slot = unsafe { core::slice::from_raw_parts(f.cast::<T>().add(done), n) };
        }
        // SAFETY: `dst` is a validated, aligned caller view of `count` elements; it may alias
        // this rank's own input but never the frames being read.
        let out = unsafe { core::slice::from_raw_parts_mut((dst as *mut T).add(done), n) };
        // The world size was validated, so the reference accepts these slices.
        let _ = fixed_tree::reduce(&ranks[..frames.len()], out);
        done += n;
    }
}
