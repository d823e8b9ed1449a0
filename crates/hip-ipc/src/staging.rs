//! One rank's protocol memory on a HIP device: TWO allocations per rank (the split placement
//! of the protocol's [`Layout`]): the control block (header, status, signatures, flags, acks)
//! from `hipExtMallocWithFlags` (uncached by default, or fine-grained: [`ControlMemory`]), so
//! that the system-scope release/acquire of the flags is coherent across GPUs, and both frames
//! from plain `hipMalloc` (coarse-grained: full bandwidth, cached). The frames need no
//! fine-grained coherence: a peer reads a frame only after the acquire of the flag the owner
//! released after staging it, and the release/acquire pair at system scope orders the frame
//! bytes too (the owner's release writes back its L2; the reader's acquire invalidates its
//! caches). The kernel ABI carries two bases per rank (`DcHeader::ctl`, `DcHeader::data`).
//!
//! Both allocations are exported by IPC handle, so both are allocated in whole 2 MiB units
//! ([`EXPORT_GRANULE`], [`allocation_sizes`]); the layout's offsets are unchanged. See
//! docs/rocm.md ("First contact") for the sources of each choice.
//!
//! Nothing of this file has run on an AMD GPU (none was available).
use crate::BACKEND;
use crate::runtime::{self, DeviceMemory, IpcMapping};
use crate::sys::{self, HIP_IPC_HANDLE_SIZE};
use collective_core::Error;
use detcoll_protocol::params::RankMemory;
use detcoll_protocol::{Header, Layout};

/// Selects the memory of the control block: `uncached` (default) or `fine-grained`.
pub const CONTROL_MEMORY_ENV: &str = "DETCOLL_HIP_CONTROL_MEMORY";

/// The unit every exported (IPC) HIP allocation is rounded up to: 2 MiB. ROCr's
/// `hipIpcGetMemHandle` refuses an allocation whose size differs from the size it reports for
/// it; AITER found uncached allocations under 2 MiB export only in whole 4 KiB pages
/// (aiter/ops/custom_all_reduce.py), and RCCL rounds every IPC buffer up to `CUDA_IPC_MIN` =
/// 2 MiB (src/include/comm.h, src/transport/p2p.cc). 2 MiB is a multiple of 4 KiB, so it
/// satisfies both.
pub const EXPORT_GRANULE: usize = 2 << 20;

/// `bytes` rounded up to a whole number of [`EXPORT_GRANULE`]s (at least one); `None` when
/// that overflows `usize`.
pub fn export_size(bytes: usize) -> Option<usize> {
    bytes.max(1).checked_next_multiple_of(EXPORT_GRANULE)
}

/// The sizes asked of the allocator for `layout`: `(control block, frames)`, each
/// [`export_size`] of what the layout needs. Only the sizes grow: every offset of the layout
/// (header, status, flags, acks; frame 1 at `frame_stride`) stays where it is.
pub fn allocation_sizes(layout: &Layout) -> Result<(usize, usize), Error> {
    let round = |bytes: usize, what: &str| {
        export_size(bytes).ok_or_else(|| Error::InvalidConfig {
            detail: format!("the {what} of {bytes} bytes cannot be rounded up to 2 MiB"),
        })
    };
    Ok((round(layout.control_bytes(), "control block")?, round(layout.frames_bytes(), "frames")?))
}

/// Where a rank's control block (the flags) lives. Both kinds keep system-scope atomics
/// coherent across GPUs. Uncached is the default because it is what the projects that run on
/// MI300X use for their flags and signals: vLLM's ROCm custom all-reduce and QuickReduce,
/// AITER's signal buffers, RCCL's P2P buffers, mscclpp's semaphores (docs/rocm.md lists the
/// files). Neither kind was tried here (no AMD GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlMemory {
    /// `hipExtMallocWithFlags(hipDeviceMallocFinegrained)`.
    FineGrained,
    /// `hipExtMallocWithFlags(hipDeviceMallocUncached)` (the default).
    Uncached,
}

impl ControlMemory {
    /// `$DETCOLL_HIP_CONTROL_MEMORY`: `fine-grained`, else uncached; an unknown value is an
    /// [`Error::InvalidConfig`] (a typo must not silently pick the other kind).
    pub fn from_env() -> Result<ControlMemory, Error> {
        Self::parse(collective_core::env::var(CONTROL_MEMORY_ENV)?.as_deref())
    }

    fn parse(value: Option<&str>) -> Result<ControlMemory, Error> {
        match value.map(str::trim) {
            None | Some("uncached") => Ok(ControlMemory::Uncached),
            Some("fine-grained") | Some("finegrained") => Ok(ControlMemory::FineGrained),
            Some(other) => Err(Error::InvalidConfig {
                detail: format!("{CONTROL_MEMORY_ENV}={other:?}: expected \"uncached\" or \"fine-grained\""),
            }),
        }
    }

    /// The `hipExtMallocWithFlags` flags of this kind.
    pub fn flags(self) -> u32 {
        match self {
            ControlMemory::FineGrained => sys::HIP_DEVICE_MALLOC_FINEGRAINED,
            ControlMemory::Uncached => sys::HIP_DEVICE_MALLOC_UNCACHED,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ControlMemory::FineGrained => "fine-grained (hipDeviceMallocFinegrained 0x1)",
            ControlMemory::Uncached => "uncached (hipDeviceMallocUncached 0x3)",
        }
    }

    /// Allocates `bytes` of this kind and checks what the runtime says it allocated
    /// ([`check_control_attributes`]): an older CLR gave ordinary memory without an error when
    /// the uncached segment was missing, and flags on ordinary memory are not coherent.
    pub(crate) fn alloc(self, ordinal: usize, bytes: usize) -> Result<DeviceMemory, Error> {
        let memory = match self {
            ControlMemory::FineGrained => DeviceMemory::fine_grained(ordinal, bytes)?,
            ControlMemory::Uncached => DeviceMemory::uncached(ordinal, bytes)?,
        };
        let a = runtime::pointer_attributes(memory.ptr())?;
        check_control_attributes(self, a.memory_type, a.allocation_flags)?;
        Ok(memory)
    }
}

/// Whether an allocation the runtime reports as (`memory_type`, `allocation_flags`)
/// (`hipPointerGetAttributes`) is the control memory `asked` for: device memory
/// (`hipMemoryTypeDevice`) whose recorded flags are exactly `asked`'s. Anything else is an
/// [`Error::Backend`] naming the kind asked and what was got, never a silent fallback: flags
/// in ordinary (coarse-grained) memory would not be coherent across GPUs, and the kernels
/// would wait out their bound instead of failing here. What this cannot see: a runtime that
/// records the requested flags yet maps ordinary memory (CLR saves the flags it was given).
pub fn check_control_attributes(asked: ControlMemory, memory_type: u32, allocation_flags: u32) -> Result<(), Error> {
    if memory_type == sys::HIP_MEMORY_TYPE_DEVICE && allocation_flags == asked.flags() {
        return Ok(());
    }
    let kind = match allocation_flags {
        0 => "ordinary device memory (flags 0: hipMalloc / coarse-grained)".to_string(),
        f if f == sys::HIP_DEVICE_MALLOC_FINEGRAINED => "fine-grained (flags 0x1)".to_string(),
        f if f == sys::HIP_DEVICE_MALLOC_UNCACHED => "uncached (flags 0x3)".to_string(),
        f => format!("flags {f:#x}"),
    };
    Err(Error::Backend {
        backend: BACKEND,
        detail: format!(
            "the control block was allocated as {} but hipPointerGetAttributes reports {kind}, memory type {memory_type} \
             (expected {} = hipMemoryTypeDevice); system-scope flags need fine-grained or uncached memory \
             (try {CONTROL_MEMORY_ENV}=fine-grained or uncached, or a newer ROCm)",
            asked.name(),
            sys::HIP_MEMORY_TYPE_DEVICE
        ),
    })
}

/// One rank's staging: the control block (uncached or fine-grained) and the frames
/// (`hipMalloc`), each a whole number of 2 MiB ([`allocation_sizes`]).
#[derive(Debug)]
pub struct Staging {
    pub(crate) control: DeviceMemory,
    pub(crate) frames: DeviceMemory,
}

impl Staging {
    /// Both allocations, zeroed, header written (synchronous calls: every later launch sees it).
    pub(crate) fn new(ordinal: usize, layout: &Layout, header: &Header, kind: ControlMemory) -> Result<Staging, Error> {
        let (control_bytes, frames_bytes) = allocation_sizes(layout)?;
        let control = kind.alloc(ordinal, control_bytes)?;
        let frames = DeviceMemory::new(ordinal, frames_bytes)?;
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
    fn control_memory_is_uncached_by_default_chosen_by_name_and_a_typo_is_an_error() {
        for v in [None, Some("uncached"), Some(" uncached ")] {
            assert_eq!(ControlMemory::parse(v).unwrap(), ControlMemory::Uncached, "{v:?}");
        }
        for v in [Some("fine-grained"), Some(" finegrained ")] {
            assert_eq!(ControlMemory::parse(v).unwrap(), ControlMemory::FineGrained, "{v:?}");
        }
        for typo in ["uncahced", ""] {
            match ControlMemory::parse(Some(typo)) {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(CONTROL_MEMORY_ENV), "{detail}"),
                other => panic!("{typo:?}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn exported_allocations_are_whole_2_mib_units_and_offsets_stay() {
        assert_eq!(EXPORT_GRANULE, 2 * 1024 * 1024);
        assert_eq!(export_size(0), Some(EXPORT_GRANULE));
        assert_eq!(export_size(1), Some(EXPORT_GRANULE));
        assert_eq!(export_size(EXPORT_GRANULE), Some(EXPORT_GRANULE));
        assert_eq!(export_size(EXPORT_GRANULE + 1), Some(2 * EXPORT_GRANULE));
        assert_eq!(export_size(usize::MAX), None);
        for (capacity, blocks) in
            [(1usize, 1usize), (4096, 1), (1 << 20, 8), (3 << 20, 80), (64 << 20, 304), (1 << 30, 1024)]
        {
            let layout = Layout::new(capacity, blocks).unwrap();
            let (control, frames) = allocation_sizes(&layout).unwrap();
            for (asked, needed) in [(control, layout.control_bytes()), (frames, layout.frames_bytes())] {
                assert_eq!(asked % EXPORT_GRANULE, 0, "capacity {capacity}, blocks {blocks}: {asked}");
                assert!(asked >= needed && asked - needed < EXPORT_GRANULE, "{asked} for {needed}");
            }
            // The control block without an LL area: header, status, two signature slots, ready and
            // phase-2 per block, 8 acks, 2 x 8 push headers and 2 x blocks x 8 bulk push flags,
            // lines of 128 bytes.
            assert_eq!(layout.control_bytes(), (4 + 2 * blocks + 3 * 8 + 16 * blocks) * 128);
            // Every offset the kernels use lies inside what the layout needs, so inside the allocation.
            assert!(layout.ack(7) + 128 <= layout.control_bytes());
            assert!(layout.phase2(blocks - 1) < layout.ack(0));
            // With LL slots (in the control block: fine-grained / uncached like the flags) the
            // control allocation grows by them and stays whole 2 MiB units.
            let ll = Layout::with_ll(capacity, blocks, 8, 512 << 10).unwrap();
            let (control, _) = allocation_sizes(&ll).unwrap();
            assert!(control % EXPORT_GRANULE == 0 && control >= ll.control_bytes());
            assert_eq!(ll.ll_slot(1, 7) + ll.ll_slot_bytes(), ll.control_bytes());
        }
    }

    #[test]
    fn control_attributes_must_be_device_memory_of_the_kind_asked() {
        use ControlMemory::{FineGrained, Uncached};
        let device = sys::HIP_MEMORY_TYPE_DEVICE;
        assert!(check_control_attributes(Uncached, device, 0x3).is_ok());
        assert!(check_control_attributes(FineGrained, device, 0x1).is_ok());
        // (asked, type, flags, what the error must name as got)
        let cases = [
            (Uncached, device, 0x0, "ordinary device memory"),
            (Uncached, device, 0x1, "fine-grained (flags 0x1)"),
            (FineGrained, device, 0x3, "uncached (flags 0x3)"),
            (FineGrained, device, 0x0, "ordinary device memory"),
            (Uncached, 1, 0x3, "memory type 1"),
            (Uncached, 0, 0x3, "memory type 0"),
            (Uncached, device, 0x8, "flags 0x8"),
        ];
        for (asked, ty, flags, got) in cases {
            match check_control_attributes(asked, ty, flags) {
                Err(Error::Backend { detail, .. }) => {
                    assert!(detail.contains(asked.name()), "{detail}");
                    assert!(detail.contains(got), "{detail}");
                    assert!(detail.contains(CONTROL_MEMORY_ENV), "{detail}");
                }
                other => panic!("{asked:?} {ty} {flags:#x}: expected Backend, got {other:?}"),
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
