//! Where everything sits in one rank's allocation.
//!
//! Every flag has its own [`LINE`]-byte line so that a peer polling one flag never contends
//! with the owner writing another. Staging is two frames of `capacity` bytes (double-buffered
//! by generation parity), [`Layout::frame_stride`] bytes apart.
//!
//! Two placements use this layout. The CPU and CUDA twins put everything in one allocation of
//! [`Layout::total_bytes`]: the control block at offset 0, frame `p` at [`Layout::frame`]`(p)`.
//! The HIP twin splits it: the control block ([`Layout::control_bytes`]) in uncached (default)
//! or fine-grained memory, where system-scope atomics are coherent across GPUs, and the frames
//! ([`Layout::frames_bytes`]) in ordinary device memory, frame `p` at `p * frame_stride()`.
//! Control offsets (header, status, flags, acks) are from the start of the control block.
//!
//! The push route's receive area lives in the control block too (after the acks, page-aligned):
//! per generation parity and per sender, one slot of LL lines ([`Layout::ll_slot`]). Senders
//! write into it over IPC, the owner polls it locally; on AMD it must be fine-grained
//! (uncached) memory like the flags, which is where the control block already is.

/// Bytes per flag line (covers 128-byte GPU cache lines and 64-byte CPU lines).
pub const LINE: usize = 128;
/// First word of a header: "DETCOLL\0".
pub const HEADER_MAGIC: u64 = u64::from_le_bytes(*b"DETCOLL\0");
/// Bumped whenever the layout or the flag encoding changes.
pub const PROTOCOL_VERSION: u64 = 2;
/// Words of the header line ([`Header::to_words`]).
pub const HEADER_WORDS: usize = 8;
/// Most payload bytes per sender one LL push call may carry ([`Layout::with_ll`]): keeps the LL
/// area (`4 * world * ll_capacity` bytes) and every control offset within `u32`.
pub const MAX_LL_CAPACITY: usize = 64 << 20;
/// LL bytes per payload byte: every 4-byte payload word travels with a 4-byte flag.
pub const LL_EXPANSION: usize = 2;
use collective_core::Error;

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
    /// Payload bytes per sender of the LL push area (0: none).
    pub ll_capacity: u64,
}

impl Header {
    /// The header as words: `[magic, version, world, rank, capacity, blocks, pid, ll_capacity]`.
    pub const fn to_words(&self) -> [u64; HEADER_WORDS] {
        [HEADER_MAGIC, PROTOCOL_VERSION, self.world, self.rank, self.capacity, self.blocks, self.pid, self.ll_capacity]
    }
    /// Parses [`Header::to_words`]; `None` if magic or version differ.
    pub const fn from_words(w: [u64; HEADER_WORDS]) -> Option<Header> {
        if w[0] != HEADER_MAGIC || w[1] != PROTOCOL_VERSION {
            return None;
        }
        Some(Header { world: w[2], rank: w[3], capacity: w[4], blocks: w[5], pid: w[6], ll_capacity: w[7] })
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
    /// Ranks with an LL slot (0 when there is no LL area).
    world: usize,
    /// Payload bytes per sender and call on the LL push route (0: no LL area).
    ll_capacity: usize,
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
        Self::with_ll(capacity, blocks, 0, 0)
    }

    /// [`Layout::new`] plus an LL push receive area for `world` senders of up to `ll_capacity`
    /// payload bytes each (at most [`MAX_LL_CAPACITY`]), double-buffered by generation parity:
    /// `2 * world` slots of [`Layout::ll_slot_bytes`] in the control block.
    pub fn with_ll(capacity: usize, blocks: usize, world: usize, ll_capacity: usize) -> Result<Layout, Error> {
        if ll_capacity > MAX_LL_CAPACITY {
            return Err(Error::InvalidConfig {
                detail: format!(
                    "an LL push capacity of {ll_capacity} bytes per rank (Config::with_ll_capacity): expected at most \
                     {MAX_LL_CAPACITY} bytes"
                ),
            });
        }
        if world > MAX_WORLD {
            return Err(Error::InvalidConfig {
                detail: format!("LL push slots for {world} ranks: expected at most {MAX_WORLD}"),
            });
        }
        let (world, ll_capacity) = if ll_capacity == 0 || world == 0 { (0, 0) } else { (world, ll_capacity) };
        if blocks == 0 || blocks > MAX_BLOCKS {
            return Err(Error::InvalidConfig {
                detail: format!("{blocks} flag slots per phase (blocks): expected 1..={MAX_BLOCKS}"),
            });
        }
        match Self::checked_total(capacity, blocks, world, ll_capacity) {
            Some(total) if total <= MAX_TOTAL => Ok(Layout { capacity, blocks, world, ll_capacity }),
            _ => Err(Error::InvalidConfig {
                detail: format!(
                    "a staging capacity of {capacity} bytes needs two page-aligned frames of it plus the \
                     control block, which does not fit in the address space (at most {MAX_TOTAL} bytes)"
                ),
            }),
        }
    }

    /// [`Layout::total_bytes`] in checked arithmetic, `None` on overflow.
    const fn checked_total(capacity: usize, blocks: usize, world: usize, ll_capacity: usize) -> Option<usize> {
        // blocks <= MAX_BLOCKS, world <= 8, ll_capacity <= MAX_LL_CAPACITY: no overflow here.
        let control = Self::control_for(blocks, world, ll_capacity);
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

    /// Payload bytes per sender one LL push call may carry (0: this layout has no LL area).
    pub const fn ll_capacity(&self) -> usize {
        self.ll_capacity
    }

    /// Push header of `sender` for generation parity `parity`: the sender stores its flag word
    /// (`generation << 32 | digest`) here, in the receiver's control block, so the receiver
    /// learns from its own memory whether the sender makes the same call.
    pub const fn push_header(&self, parity: usize, sender: usize) -> usize {
        (4 + 2 * self.blocks + MAX_WORLD + (parity & 1) * MAX_WORLD + sender) * LINE
    }

    /// Bulk push flag of `sender` for `block` (`phase` 0: its slices for this rank's shard have
    /// landed in this rank's frame; 1: its reduced shard has), written by the sender (release)
    /// into the receiver's control block.
    pub const fn push_flag(&self, phase: usize, block: usize, sender: usize) -> usize {
        (4 + 2 * self.blocks + 3 * MAX_WORLD + ((phase & 1) * self.blocks + block) * MAX_WORLD + sender) * LINE
    }

    /// Bytes of one LL slot: [`LL_EXPANSION`] times the payload capacity, rounded to 256.
    pub const fn ll_slot_bytes(&self) -> usize {
        Self::slot_for(self.ll_capacity)
    }

    /// The LL slot in this rank's control block that `sender` writes during generations of
    /// parity `parity`. Payload byte `o` of a segment at slot offset `s` travels in the 8-byte
    /// LL word at `ll_slot(..) + 2 * (s + o) / 4 * 4`: payload word in the low half, flag in the
    /// high half (little-endian), so one naturally aligned 8-byte store carries both.
    pub const fn ll_slot(&self, parity: usize, sender: usize) -> usize {
        self.ll_area() + ((parity & 1) * self.world + sender) * self.ll_slot_bytes()
    }

    /// Start of the LL area in the control block (page-aligned).
    pub const fn ll_area(&self) -> usize {
        round_up(Self::lines(self.blocks) * LINE, FRAME_ALIGN)
    }

    const fn slot_for(ll_capacity: usize) -> usize {
        round_up(ll_capacity * LL_EXPANSION, 256)
    }

    /// Lines of the control block before the LL area: header, status, 2 signature slots, ready
    /// and phase-2 per block, acks, 2 x 8 push headers, 2 x blocks x 8 bulk push flags.
    const fn lines(blocks: usize) -> usize {
        4 + 2 * blocks + 3 * MAX_WORLD + 2 * blocks * MAX_WORLD
    }

    const fn control_for(blocks: usize, world: usize, ll_capacity: usize) -> usize {
        let lines = Self::lines(blocks) * LINE;
        if world == 0 { lines } else { round_up(lines, FRAME_ALIGN) + 2 * world * Self::slot_for(ll_capacity) }
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
    /// Bytes of the control block (all lines, and the LL area when there is one).
    pub const fn control_bytes(&self) -> usize {
        Self::control_for(self.blocks, self.world, self.ll_capacity)
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
        offs.extend((0..16).map(|i| l.push_header(i / 8, i % 8)));
        offs.extend((0..64).map(|i| l.push_flag(i / 32, (i / 8) % 4, i % 8)));
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
            Header::from_words(Header { world: 2, rank: 1, capacity: 9, blocks: 4, pid: 3, ll_capacity: 5 }.to_words()),
            Some(Header { world: 2, rank: 1, capacity: 9, blocks: 4, pid: 3, ll_capacity: 5 })
        );
        assert_eq!(l.ll_capacity(), 0);
    }

    #[test]
    fn ll_slots_are_disjoint_inside_the_control_block() {
        let l = Layout::with_ll(1 << 20, 8, 4, 1000).unwrap();
        assert_eq!(l.ll_slot_bytes(), 2048);
        assert!(l.ll_area() >= l.push_header(1, 7) + LINE && l.ll_area().is_multiple_of(4096));
        let mut slots: Vec<usize> =
            (0..2).flat_map(|p| (0..4).map(move |q| (p, q))).map(|(p, q)| l.ll_slot(p, q)).collect();
        slots.sort();
        assert!(slots.windows(2).all(|w| w[1] - w[0] == l.ll_slot_bytes()));
        assert_eq!(slots[7] + l.ll_slot_bytes(), l.control_bytes());
        assert!(l.frame(0) >= l.control_bytes());
        // Too large an LL capacity is refused, zero means no LL area.
        assert!(Layout::with_ll(1 << 20, 8, 8, MAX_LL_CAPACITY + 1).is_err());
        assert_eq!(Layout::with_ll(1 << 20, 8, 8, 0).unwrap(), Layout::new(1 << 20, 8).unwrap());
        let big = Layout::with_ll(1 << 20, 1024, 8, MAX_LL_CAPACITY).unwrap();
        assert!(big.control_bytes() <= u32::MAX as usize);
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
        let l = Layout::new((isize::MAX as usize) / 2 - (16 << 20), MAX_BLOCKS).unwrap();
        assert!(l.total_bytes() > l.frame(1) && l.frame(1) > l.frame(0) && l.frame(0) >= l.control_bytes());
        assert_eq!(Layout::new(0, 1).unwrap().frames_bytes(), 0);
    }
}
