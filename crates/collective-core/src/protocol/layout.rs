//! Where everything sits in one rank's allocation.
//!
//! Every flag has its own [`LINE`]-byte line so that a peer polling one flag never contends
//! with the owner writing another. Staging is two frames of `capacity` bytes (double-buffered
//! by generation parity), [`Layout::frame_stride`] bytes apart.
//!
//! Two placements use this layout. The CPU and CUDA twins put everything in one allocation of
//! [`Layout::total_bytes`]: the control block at offset 0, frame `p` at [`Layout::frame`]`(p)`.
//! The HIP twin splits it: the control block ([`Layout::control_bytes`]) in fine-grained memory,
//! where system-scope atomics are coherent across GPUs, and the frames
//! ([`Layout::frames_bytes`]) in ordinary device memory, frame `p` at `p * frame_stride()`.
//! Control offsets (header, status, flags, acks) are from the start of the control block.

/// Bytes per flag line (covers 128-byte GPU cache lines and 64-byte CPU lines).
pub const LINE: usize = 128;
/// First word of a header: "DETCOLL\0".
pub const HEADER_MAGIC: u64 = u64::from_le_bytes(*b"DETCOLL\0");
/// Bumped whenever the layout or the flag encoding changes.
pub const PROTOCOL_VERSION: u64 = 1;
use crate::Error;

/// Value a peer stores into `ack[peer]` at close.
pub const CLOSE_ACK: u64 = 0xC105_EDAC;
const FRAME_ALIGN: usize = 4096;
const MAX_WORLD: usize = 8;
/// Most flag slots per phase (blocks of one call); keeps every control offset far below
/// `u32::MAX`, the width the kernels carry offsets in.
pub const MAX_BLOCKS: usize = 1024;
/// Largest allocation a layout may describe: `isize::MAX` (Rust's allocation limit), which
/// also bounds every offset the kernels compute in 64 bits.
const MAX_TOTAL: usize = isize::MAX as usize;

/// The owner's description of its allocation, stored in line 0 so peers can check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub world: u64,
    pub rank: u64,
    pub capacity: u64,
    pub blocks: u64,
    /// Process id of the owner (the CPU twin uses it to notice a dead peer early).
    pub pid: u64,
}

impl Header {
    /// The header as words: `[magic, version, world, rank, capacity, blocks, pid]`.
    pub const fn to_words(&self) -> [u64; 7] {
        [HEADER_MAGIC, PROTOCOL_VERSION, self.world, self.rank, self.capacity, self.blocks, self.pid]
    }
    /// Parses [`Header::to_words`]; `None` if magic or version differ.
    pub const fn from_words(w: [u64; 7]) -> Option<Header> {
        if w[0] != HEADER_MAGIC || w[1] != PROTOCOL_VERSION {
            return None;
        }
        Some(Header { world: w[2], rank: w[3], capacity: w[4], blocks: w[5], pid: w[6] })
    }
}

/// Offsets of one rank's control block and frames. Identical on every rank (checked).
///
/// Only [`Layout::new`] makes one, and it checks every size computation: once a `Layout`
/// exists, none of its offsets or sizes can overflow, so the offset methods stay plain
/// arithmetic on the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    capacity: usize,
    blocks: usize,
}

impl Layout {
    /// A layout for `capacity` staging bytes and `blocks` flag slots per phase (`1..=`
    /// `MAX_BLOCKS`, 1024).
    ///
    /// [`Error::InvalidConfig`] when `blocks` is out of range or the allocation this layout
    /// describes ([`Layout::total_bytes`], control block and two page-aligned frames) would not
    /// fit in `isize::MAX` bytes — before anything is allocated. Without this check a capacity
    /// near `usize::MAX` wrapped to a tiny allocation that calls then overran.
    pub fn new(capacity: usize, blocks: usize) -> Result<Layout, Error> {
        if blocks == 0 || blocks > MAX_BLOCKS {
            return Err(Error::InvalidConfig {
                detail: format!("{blocks} flag slots per phase (blocks): expected 1..={MAX_BLOCKS}"),
            });
        }
        match Self::checked_total(capacity, blocks) {
            Some(total) if total <= MAX_TOTAL => Ok(Layout { capacity, blocks }),
            _ => Err(Error::InvalidConfig {
                detail: format!(
                    "a staging capacity of {capacity} bytes needs two page-aligned frames of it plus the \
                     control block, which does not fit in the address space (at most {MAX_TOTAL} bytes)"
                ),
            }),
        }
    }

    /// [`Layout::total_bytes`] in checked arithmetic, `None` on overflow.
    const fn checked_total(capacity: usize, blocks: usize) -> Option<usize> {
        let control = (4 + 2 * blocks + MAX_WORLD) * LINE; // blocks <= MAX_BLOCKS: no overflow
        let Some(stride) = checked_round_up(capacity, FRAME_ALIGN) else { return None };
        let Some(frames) = stride.checked_mul(2) else { return None };
        let Some(first) = checked_round_up(control, FRAME_ALIGN) else { return None };
        first.checked_add(frames)
    }

    /// Staging bytes per frame: the most one rank contributes to one call.
    pub const fn capacity(&self) -> usize {
        self.capacity
    }

    /// Flag slots per phase: the most blocks (GPU) or workers (CPU) one call uses.
    pub const fn blocks(&self) -> usize {
        self.blocks
    }

    /// Header line.
    pub const fn header(&self) -> usize {
        0
    }
    /// Status line: error code, peer and generation recorded by the owner.
    pub const fn status(&self) -> usize {
        LINE
    }
    /// Full signature of the call published with frame `parity` (two words).
    pub const fn sig_slot(&self, parity: usize) -> usize {
        (2 + (parity & 1)) * LINE
    }
    /// Ready flag of `block` (phase 1).
    pub const fn ready(&self, block: usize) -> usize {
        (4 + block) * LINE
    }
    /// Phase-2 flag of `block` (reduced shard published, RS+AG route).
    pub const fn phase2(&self, block: usize) -> usize {
        (4 + self.blocks + block) * LINE
    }
    /// Close acknowledgement written by `peer` into this allocation.
    pub const fn ack(&self, peer: usize) -> usize {
        (4 + 2 * self.blocks + peer) * LINE
    }
    /// Bytes of the control block (all lines).
    pub const fn control_bytes(&self) -> usize {
        (4 + 2 * self.blocks + MAX_WORLD) * LINE
    }
    /// Bytes from the start of frame 0 to the start of frame 1 (page-aligned).
    pub const fn frame_stride(&self) -> usize {
        round_up(self.capacity, FRAME_ALIGN)
    }
    /// Bytes of both frames, when they are allocated on their own.
    pub const fn frames_bytes(&self) -> usize {
        2 * self.frame_stride()
    }
    /// Start of staging frame `parity` in the one-allocation placement.
    pub const fn frame(&self, parity: usize) -> usize {
        let first = round_up(self.control_bytes(), FRAME_ALIGN);
        first + (parity & 1) * self.frame_stride()
    }
    /// Bytes of the whole allocation in the one-allocation placement.
    pub const fn total_bytes(&self) -> usize {
        self.frame(0) + self.frames_bytes()
    }
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

const fn checked_round_up(x: usize, to: usize) -> Option<usize> {
    x.div_ceil(to).checked_mul(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_disjoint_and_frames_aligned() {
        let l = Layout::new(1000, 4).unwrap();
        let mut offs = vec![l.header(), l.status(), l.sig_slot(0), l.sig_slot(1)];
        offs.extend((0..4).map(|b| l.ready(b)));
        offs.extend((0..4).map(|b| l.phase2(b)));
        offs.extend((0..8).map(|p| l.ack(p)));
        let mut sorted = offs.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), offs.len());
        assert!(offs.iter().all(|o| o % LINE == 0 && o + LINE <= l.control_bytes()));
        assert_eq!(l.frame(0) % 4096, 0);
        assert!(l.frame(0) >= l.control_bytes());
        assert!(l.frame(1) >= l.frame(0) + 1000);
        assert!(l.total_bytes() >= l.frame(1) + 1000);
        assert_eq!(l.frame(1) - l.frame(0), l.frame_stride());
        assert_eq!((l.frame_stride(), l.frames_bytes()), (4096, 8192));
        assert_eq!(l.total_bytes(), l.frame(0) + l.frames_bytes());
        assert_eq!(
            Header::from_words(Header { world: 2, rank: 1, capacity: 9, blocks: 4, pid: 3 }.to_words()).unwrap().rank,
            1
        );
    }

    #[test]
    fn sizes_that_do_not_fit_are_refused_before_allocation() {
        for capacity in [usize::MAX, 1 << 63, isize::MAX as usize, (isize::MAX as usize) / 2] {
            match Layout::new(capacity, 1) {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(&capacity.to_string()), "{detail}"),
                other => panic!("capacity {capacity}: {other:?}"),
            }
        }
        for blocks in [0, MAX_BLOCKS + 1, usize::MAX] {
            assert!(matches!(Layout::new(4096, blocks), Err(Error::InvalidConfig { .. })), "{blocks}");
        }
        // The largest capacities that fit still give consistent, non-wrapping offsets.
        let l = Layout::new((isize::MAX as usize) / 2 - (1 << 20), MAX_BLOCKS).unwrap();
        assert!(l.total_bytes() > l.frame(1) && l.frame(1) > l.frame(0) && l.frame(0) >= l.control_bytes());
        assert_eq!(Layout::new(0, 1).unwrap().frames_bytes(), 0);
    }
}
