//! Construction: N ranks as threads of one process (one GPU or several, peer pointers used
//! directly), or one process per rank over a bootstrap (HIP IPC handles). The HIP twin of
//! `cuda-ipc/src/group.rs`.
//!
//! Staging: TWO allocations per rank (the split placement of the protocol's [`Layout`]): the
//! control block (header, status, signatures, flags, acks) from
//! `hipExtMallocWithFlags(hipDeviceMallocFinegrained)`, so that the system-scope
//! release/acquire of the flags is coherent across GPUs, and both frames from plain
//! `hipMalloc` (coarse-grained: full bandwidth, cached). The frames need no fine-grained
//! coherence: a peer reads a frame only after the acquire of the flag the owner released after
//! staging it, and the release/acquire pair at system scope orders the frame bytes too (the
//! owner's release writes back its L2; the reader's acquire invalidates its caches). The kernel
//! ABI carries two bases per rank (`DcHeader::ctl`, `DcHeader::data`); see docs/rocm.md.
use crate::BACKEND;
use crate::collective::{GroupShared, HipIpcCollective, IpcState, Kernels, Owner};
use crate::result::api;
use crate::runtime::{self, DeviceMemory, HostMapped, IpcMapping};
use crate::sys::HIP_IPC_HANDLE_SIZE;
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::params::{Fixed, RankMemory, THREADS};
use collective_core::protocol::status::RECORD_WORDS;
use collective_core::protocol::{Header, IpcConfig, Layout, Poison, close};
use collective_core::{Error, SUPPORTED_WORLD_SIZES};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

fn check_world(world: usize) -> Result<(), Error> {
    if SUPPORTED_WORLD_SIZES.contains(&world) { Ok(()) } else { Err(Error::UnsupportedWorldSize { world }) }
}

fn timeout_ns(config: &IpcConfig) -> u64 {
    u64::try_from(config.timeouts().peer.as_nanos()).unwrap_or(u64::MAX)
}

fn check_ordinal(ordinal: usize) -> Result<(), Error> {
    let n = runtime::device_count()?;
    if ordinal < n {
        Ok(())
    } else {
        Err(Error::InvalidConfig { detail: format!("HIP device {ordinal} does not exist ({n} visible)") })
    }
}

/// A rank of world 1: a copy (or nothing in place), no IPC state. The copy kernel is used when
/// a code object loads, `hipMemcpyAsync` otherwise.
fn local(ordinal: usize, config: &IpcConfig) -> HipIpcCollective {
    HipIpcCollective {
        rank: 0,
        world: 1,
        device: ordinal,
        config: config.clone(),
        ipc: None,
        local_copy: Kernels::load(ordinal).ok(),
        poison: Poison::default(),
        closed: AtomicBool::new(false),
        close_once: Default::default(),
    }
}

fn assemble(rank: usize, ordinal: usize, config: &IpcConfig, state: IpcState) -> HipIpcCollective {
    HipIpcCollective {
        rank,
        world: state.mems.len(),
        device: ordinal,
        config: config.clone(),
        ipc: Some(state),
        local_copy: None,
        poison: Poison::default(),
        closed: AtomicBool::new(false),
        close_once: Default::default(),
    }
}

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

    fn alloc(self, ordinal: usize, bytes: usize) -> Result<DeviceMemory, Error> {
        match self {
            ControlMemory::FineGrained => DeviceMemory::fine_grained(ordinal, bytes),
            ControlMemory::Uncached => DeviceMemory::uncached(ordinal, bytes),
        }
    }
}

/// One rank's staging: the control block (fine-grained or uncached) and the frames
/// (`hipMalloc`).
#[derive(Debug)]
pub(crate) struct Staging {
    pub(crate) control: DeviceMemory,
    pub(crate) frames: DeviceMemory,
}

impl Staging {
    /// Both allocations, zeroed, header written (synchronous calls: every later launch sees it).
    fn new(ordinal: usize, layout: &Layout, header: &Header, kind: ControlMemory) -> Result<Staging, Error> {
        let control = kind.alloc(ordinal, layout.control_bytes())?;
        let frames = DeviceMemory::new(ordinal, layout.frames_bytes())?;
        let mut bytes = Vec::with_capacity(56);
        for w in header.to_words() {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        runtime::copy_to_device(&bytes, control.ptr() + layout.header() as u64)?;
        Ok(Staging { control, frames })
    }
    fn memory(&self) -> RankMemory {
        RankMemory { control: self.control.ptr(), frames: self.frames.ptr() }
    }
    /// The two IPC handles a peer process opens: control block, then frames.
    fn ipc_handles(&self) -> Result<Vec<u8>, Error> {
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
fn open_peer(q: usize, handles: &[u8]) -> Result<[IpcMapping; 2], Error> {
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

impl HipIpcCollective {
    /// `world` ranks as threads sharing device `ordinal`. Returns [`Error::LibraryMissing`]
    /// when there is no HIP runtime (instead of panicking).
    pub fn group_on_ordinal(ordinal: usize, world: usize, config: &IpcConfig) -> Result<Vec<HipIpcCollective>, Error> {
        Self::group(&vec![ordinal; world], config)
    }

    /// One rank per entry of `ordinals` (rank `r` runs on HIP device `ordinals[r]`), all in
    /// this process. Ranks on different devices get peer access enabled (an error if the
    /// devices cannot reach each other); peers' allocations are used directly, never through
    /// IPC handles.
    ///
    /// Each returned rank is meant to be driven by its own thread with its own stream; all
    /// ranks must make the same calls in the same order. Ranks sharing one GPU wait for each
    /// other inside their kernels, so their kernels must run concurrently (one stream per rank,
    /// no device-wide synchronising calls while a peer may have a collective in flight); a
    /// violation shows as `PeerTimeout`, never as wrong data.
    pub fn group(ordinals: &[usize], config: &IpcConfig) -> Result<Vec<HipIpcCollective>, Error> {
        api()?;
        config.check()?;
        let control = ControlMemory::from_env()?;
        let world = ordinals.len();
        check_world(world)?;
        for &o in ordinals {
            check_ordinal(o)?;
        }
        if world == 1 {
            return Ok(vec![local(ordinals[0], config)]);
        }
        // Blocks: every rank's kernel must be resident at once on devices shared by ranks.
        let blocks = match config.max_blocks {
            Some(b) => b,
            None => {
                let mut b = usize::MAX;
                for &o in ordinals {
                    let sharing = ordinals.iter().filter(|&&p| p == o).count();
                    b = b.min((runtime::multiprocessors(o)? / sharing).max(1));
                }
                b
            }
        };
        let config =
            IpcConfig { max_blocks: Some(blocks), timeouts: Some(config.resolved_timeouts()?), ..config.clone() };
        let layout = Layout::new(config.capacity, blocks)?;
        for &a in ordinals {
            for &b in ordinals {
                runtime::enable_peer_access(a, b)?;
            }
        }
        // One code object per distinct device.
        let mut kernels: Vec<(usize, Arc<Kernels>)> = Vec::new();
        for &o in ordinals {
            if !kernels.iter().any(|(k, _)| *k == o) {
                kernels.push((o, Kernels::load(o)?));
            }
        }
        let pid = u64::from(std::process::id());
        let mut staging = Vec::with_capacity(world);
        for (r, &o) in ordinals.iter().enumerate() {
            let header = Header {
                world: world as u64,
                rank: r as u64,
                capacity: config.capacity as u64,
                blocks: blocks as u64,
                pid,
            };
            staging.push(Staging::new(o, &layout, &header, control)?);
        }
        let mems: Vec<RankMemory> = staging.iter().map(Staging::memory).collect();
        let shared = Arc::new(GroupShared { staging });
        let mut out = Vec::with_capacity(world);
        for (r, &o) in ordinals.iter().enumerate() {
            runtime::set_device(o)?;
            let err = HostMapped::new(RECORD_WORDS)?;
            let k = kernels.iter().find(|(k, _)| *k == o).map(|(_, k)| k.clone()).ok_or_else(|| Error::Backend {
                backend: BACKEND,
                detail: "kernels of a device went missing".into(),
            })?;
            let fixed = Fixed::new(&layout, &mems, r, err.device_ptr(), timeout_ns(&config), THREADS);
            let state =
                IpcState { kernels: k, layout, fixed, mems: mems.clone(), err, owner: Owner::Group(shared.clone()) };
            out.push(assemble(r, o, &config, state));
        }
        Ok(out)
    }

    /// One rank of a group with one process per rank: allocations are exchanged as HIP IPC
    /// handles through `boot` and opened once. Every rank must pass the same `config`
    /// (capacity, block count, RS+AG threshold; checked: [`Error::ConfigMismatch`]).
    ///
    /// With `max_blocks: None` the block count is the smallest compute-unit count over the
    /// ranks' devices, i.e. one rank per GPU is assumed (the binding has no device UUID to
    /// detect ranks sharing a GPU); processes sharing a GPU must set `max_blocks` to at most
    /// `CUs / ranks on that GPU`, or their kernels may not be resident together and time out.
    pub fn new(boot: Box<dyn Bootstrap>, ordinal: usize, config: &IpcConfig) -> Result<HipIpcCollective, Error> {
        api()?;
        config.check()?;
        let control = ControlMemory::from_env()?;
        let (rank, world) = (boot.rank(), boot.world_size());
        check_world(world)?;
        check_ordinal(ordinal)?;
        if world == 1 {
            return Ok(local(ordinal, config));
        }
        // Exchange 1: what every rank must agree on, and its compute units.
        let cus = runtime::multiprocessors(ordinal)? as u64;
        let mut mine = Vec::with_capacity(32);
        for w in config.agreement_words() {
            mine.extend_from_slice(&w.to_le_bytes());
        }
        mine.extend_from_slice(&cus.to_le_bytes());
        let all = boot.all_gather_bytes(&mine)?;
        // The agreement words first, then this rank's device facts.
        let agreed = 8 * config.agreement_words().len();
        for (q, theirs) in all.iter().enumerate() {
            if theirs.len() != mine.len() || theirs[..agreed] != mine[..agreed] {
                return Err(Error::ConfigMismatch {
                    detail: format!(
                        "rank {q}'s configuration (capacity, max_blocks, rsag_threshold, timeouts) differs from rank {rank}'s"
                    ),
                });
            }
        }
        let blocks = match config.max_blocks {
            Some(b) => b,
            None => all
                .iter()
                .map(|t| u64::from_le_bytes(t[agreed..agreed + 8].try_into().unwrap_or([0; 8])) as usize)
                .min()
                .unwrap_or(1)
                .max(1),
        };
        let config =
            IpcConfig { max_blocks: Some(blocks), timeouts: Some(config.resolved_timeouts()?), ..config.clone() };
        let layout = Layout::new(config.capacity, blocks)?;
        let kernels = Kernels::load(ordinal)?;
        let header = Header {
            world: world as u64,
            rank: rank as u64,
            capacity: config.capacity as u64,
            blocks: blocks as u64,
            pid: u64::from(std::process::id()),
        };
        let own = Staging::new(ordinal, &layout, &header, control)?;
        // Exchange 2: IPC handles (control block and frames), opened once.
        let handles = boot.all_gather_bytes(&own.ipc_handles()?)?;
        runtime::set_device(ordinal)?;
        let mut mappings = Vec::with_capacity(2 * (world - 1));
        let mut mems = vec![own.memory(); world];
        for (q, h) in handles.iter().enumerate() {
            if q == rank {
                continue;
            }
            let [c, f] = open_peer(q, h)?;
            mems[q] = RankMemory { control: c.ptr(), frames: f.ptr() };
            // The peer's header must describe the same layout.
            let mut raw = [0u8; 56];
            runtime::copy_to_host(c.ptr() + layout.header() as u64, &mut raw)?;
            let mut words = [0u64; 7];
            for (w, c) in words.iter_mut().zip(raw.chunks_exact(8)) {
                *w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            }
            close::check_peer_header(words, q, &header)?;
            mappings.extend([c, f]);
        }
        let err = HostMapped::new(RECORD_WORDS)?;
        let fixed = Fixed::new(&layout, &mems, rank, err.device_ptr(), timeout_ns(&config), THREADS);
        // Nobody launches before everyone has opened (and zeroed) everything.
        boot.barrier()?;
        let owner = Owner::Process { own: Mutex::new(Some(own)), mappings: Mutex::new(mappings), boot };
        let state = IpcState { kernels, layout, fixed, mems, err, owner };
        Ok(assemble(rank, ordinal, &config, state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collective_core::bootstrap::BootstrapError;

    /// A bootstrap that must never be reached: construction fails before any exchange.
    #[derive(Debug)]
    struct Unreachable;
    impl Bootstrap for Unreachable {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            2
        }
        fn local_rank(&self) -> usize {
            0
        }
        fn local_world_size(&self) -> usize {
            2
        }
        fn all_gather_bytes(&self, _mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
            unreachable!("construction must fail before the first exchange")
        }
    }

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

    #[test]
    fn no_runtime_is_library_missing() {
        if crate::result::runtime_present() {
            eprintln!("skipped: libamdhip64 is present");
            return;
        }
        let config = IpcConfig::new(1 << 20);
        for world in [1, 2, 8] {
            match HipIpcCollective::group_on_ordinal(0, world, &config) {
                Err(Error::LibraryMissing { .. }) => {}
                other => panic!("world {world}: expected LibraryMissing, got {other:?}"),
            }
        }
        match HipIpcCollective::group(&[0, 1], &config) {
            Err(Error::LibraryMissing { .. }) => {}
            other => panic!("expected LibraryMissing, got {other:?}"),
        }
        match HipIpcCollective::new(Box::new(Unreachable), 0, &config) {
            Err(Error::LibraryMissing { .. }) => {}
            other => panic!("expected LibraryMissing, got {other:?}"),
        }
    }
}
