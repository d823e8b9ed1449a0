//! The host executor of the shared protocol: runs a [`Plan`] over every rank's region.
use crate::region::Region;
use crate::wait::{Peer, wait_flag, wait_value};
use collective_core::protocol::{CLOSE_ACK, FlagState, FlagWord, Layout, Phase, Plan, Poison, Segment, Timeouts};
use collective_core::{DType, Error, Signature};
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

    /// Presets `region`'s ready flag as if its owner had completed generation `start` (digest
    /// 0), so peers read it as behind for the next call; phase-2 flags stay 0, as after
    /// construction (the state after `start` one-shot calls of an engine without the refresh
    /// in [`Engine::run`]). Test support: call before any engine uses the region.
    pub(crate) fn preset_generation(layout: &Layout, region: &Region, start: u32) {
        let word = u64::from(start) << 32;
        for b in 0..layout.blocks() {
            // SAFETY: the ready line is in bounds and 8-aligned; no rank uses the region yet.
            let w = unsafe { &*region.base().add(layout.ready(b)).cast::<AtomicU64>() };
            w.store(word, Ordering::Release);
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
        self.run(plan, g).map_err(|e| self.poison.record(e))?;
        *generation = g;
        Ok(())
    }

    fn run(&self, plan: &Plan, g: u32) -> Result<(), Error> {
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
        let digest = sig.digest();
        for peer in self.peers.iter().filter(|p| p.rank != self.rank) {
            let closed = self.word(self.rank, self.layout.ack(peer.rank));
            let state =
                match wait_flag(self.word(peer.rank, offset), closed, g, digest, *peer, self.timeouts.peer, what) {
                    Ok(state) => state,
                    Err(e @ (Error::PeerClosed { .. } | Error::PeerDied { .. })) => {
                        // A peer that saw a mismatched call fails and may close or exit before this
                        // rank looked at the culprit: report the mismatch, the cause, when one shows.
                        let culprit = self.peers.iter().filter(|p| p.rank != self.rank).find(|p| {
                            FlagWord(self.word(p.rank, offset).load(Ordering::Acquire)).check(g, digest)
                                == FlagState::Mismatch
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
            Phase::Stage => {}
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
            )?;
        }
        Ok(())
    }
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
