//! One rank's protocol memory on a HIP device: TWO allocations per rank (the split placement
//! of the protocol's [`Layout`]): the control block (header, status, signatures, flags, acks)
//! from `hipExtMallocWithFlags` (fine-grained or uncached: [`ControlMemory`]), so that the
//! system-scope release/acquire of the flags is coherent across GPUs, and both frames from
//! plain `hipMalloc` (coarse-grained: full bandwidth, cached). The frames need no fine-grained
//! coherence: a peer reads a frame only after the acquire of the flag the owner released after
//! staging it, and the release/acquire pair at system scope orders the frame bytes too (the
//! owner's release writes back its L2; the reader's acquire invalidates its caches). The kernel
//! ABI carries two bases per rank (`DcHeader::ctl`, `DcHeader::data`); see docs/rocm.md.
//!
//! Nothing of this file has run on an AMD GPU (none was available).
use crate::BACKEND;
use crate::runtime::{self, DeviceMemory, IpcMapping};
use crate::sys::HIP_IPC_HANDLE_SIZE;
use collective_core::Error;
use collective_core::protocol::params::RankMemory;
use collective_core::protocol::{Header, Layout};

/// Selects the memory of the control block: `fine-grained` (default) or `uncached`.
pub const CONTROL_MEMORY_ENV: &str = "DETCOLL_HIP_CONTROL_MEMORY";

/// Where a rank's control block (the flags) lives. Both kinds keep system-scope atomics
/// coherent across GPUs; the switch exists because reports differ on which one a given
/// ROCm/part combination accepts for IPC (neither was tried here: no AMD GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMemory {
    /// `hipExtMallocWithFlags(hipDeviceMallocFinegrained)`.
    FineGrained,
    /// `hipExtMallocWithFlags(hipDeviceMallocUncached)` (what RCCL uses for its flags).
    Uncached,
}

impl ControlMemory {
    /// `$DETCOLL_HIP_CONTROL_MEMORY`: `uncached`, else fine-grained; an unknown value is an
    /// [`Error::InvalidConfig`] (a typo must not silently pick the other kind).
    pub fn from_env() -> Result<ControlMemory, Error> {
        Self::parse(collective_core::env::var(CONTROL_MEMORY_ENV)?.as_deref())
    }

    fn parse(value: Option<&str>) -> Result<ControlMemory, Error> {
        match value.map(str::trim) {
            None | Some("fine-grained") | Some("finegrained") => Ok(ControlMemory::FineGrained),
            Some("uncached") => Ok(ControlMemory::Uncached),
            Some(other) => Err(Error::InvalidConfig {
                detail: format!("{CONTROL_MEMORY_ENV}={other:?}: expected \"fine-grained\" or \"uncached\""),
            }),
        }
    }

    pub(crate) fn alloc(self, ordinal: usize, bytes: usize) -> Result<DeviceMemory, Error> {
        match self {
            ControlMemory::FineGrained => DeviceMemory::fine_grained(ordinal, bytes),
            ControlMemory::Uncached => DeviceMemory::uncached(ordinal, bytes),
        }
    }
}

/// One rank's staging: the control block (fine-grained or uncached) and the frames
/// (`hipMalloc`).
#[derive(Debug)]
pub struct Staging {
    pub(crate) control: DeviceMemory,
    pub(crate) frames: DeviceMemory,
}

impl Staging {
    /// Both allocations, zeroed, header written (synchronous calls: every later launch sees it).
    pub(crate) fn new(ordinal: usize, layout: &Layout, header: &Header, kind: ControlMemory) -> Result<Staging, Error> {
        let control = kind.alloc(ordinal, layout.control_bytes())?;
        let frames = DeviceMemory::new(ordinal, layout.frames_bytes())?;
        let mut bytes = Vec::with_capacity(56);
        for w in header.to_words() {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        runtime::copy_to_device(&bytes, control.ptr() + layout.header() as u64)?;
        Ok(Staging { control, frames })
    }
    pub(crate) fn memory(&self) -> RankMemory {
        RankMemory { control: self.control.ptr(), frames: self.frames.ptr() }
    }
    /// The two IPC handles a peer process opens: control block, then frames.
    pub(crate) fn ipc_handles(&self) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(2 * HIP_IPC_HANDLE_SIZE);
        out.extend_from_slice(&self.control.ipc_handle()?);
        out.extend_from_slice(&self.frames.ipc_handle()?);
        Ok(out)
    }
    /// Keeps both allocations forever (a peer may still read them).
    pub(crate) fn leak(&mut self) {
        self.control.leak();
        self.frames.leak();
    }
}

/// A peer's two handles (from [`Staging::ipc_handles`]), opened.
pub(crate) fn open_peer(q: usize, handles: &[u8]) -> Result<[IpcMapping; 2], Error> {
    if handles.len() != 2 * HIP_IPC_HANDLE_SIZE {
        return Err(Error::Backend {
            backend: BACKEND,
            detail: format!(
                "rank {q} sent {} bytes of IPC handles, expected {}",
                handles.len(),
                2 * HIP_IPC_HANDLE_SIZE
            ),
        });
    }
    let (c, f) = handles.split_at(HIP_IPC_HANDLE_SIZE);
    Ok([IpcMapping::open(c)?, IpcMapping::open(f)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_memory_is_chosen_by_name_and_a_typo_is_an_error() {
        for v in [None, Some("fine-grained"), Some(" finegrained ")] {
            assert_eq!(ControlMemory::parse(v).unwrap(), ControlMemory::FineGrained, "{v:?}");
        }
        assert_eq!(ControlMemory::parse(Some("uncached")).unwrap(), ControlMemory::Uncached);
        for typo in ["uncahced", ""] {
            match ControlMemory::parse(Some(typo)) {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(CONTROL_MEMORY_ENV), "{detail}"),
                other => panic!("{typo:?}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn peer_handles_of_the_wrong_length_are_refused_before_any_hip_call() {
        for len in [0, HIP_IPC_HANDLE_SIZE, 2 * HIP_IPC_HANDLE_SIZE - 1, 3 * HIP_IPC_HANDLE_SIZE] {
            match open_peer(3, &vec![0u8; len]) {
                Err(Error::Backend { detail, .. }) => {
                    assert!(detail.contains("rank 3") && detail.contains(&len.to_string()), "{detail}")
                }
                other => panic!("{len} bytes: expected a Backend error, got {other:?}"),
            }
        }
    }
}
