//! Construction: N ranks as threads of one process (one GPU or several), or one process per
//! rank over a bootstrap (CUDA IPC handles).
use crate::collective::{CudaIpcCollective, GroupShared, IpcState, Owner};
use crate::config::CudaIpcConfig;
use crate::driver::{self, BACKEND, check};
use crate::kernels::Module;
use crate::launch::{Fixed, RankMemory, THREADS};
use crate::memory::{self, ErrorRecord, IpcMapping, Staging};
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::{Header, Layout, Poison, close};
use collective_core::{Error, SUPPORTED_WORLD_SIZES};
use cudarc::driver::{CudaContext, sys};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

fn check_world(world: usize) -> Result<(), Error> {
    if SUPPORTED_WORLD_SIZES.contains(&world) { Ok(()) } else { Err(Error::UnsupportedWorldSize { world }) }
}

/// The kernels' view of one-allocation staging (control block and frames together): CUDA's
/// system-scope atomics are coherent on any device memory, so nothing is split.
fn rank_memory(layout: &Layout, bases: &[u64]) -> Vec<RankMemory> {
    bases.iter().map(|&b| RankMemory::one_allocation(layout, b)).collect()
}

fn timeout_ns(config: &CudaIpcConfig) -> u64 {
    u64::try_from(config.timeouts().peer.as_nanos()).unwrap_or(u64::MAX)
}

/// A rank of world 1: a copy (or nothing in place), no IPC state. The copy kernel is used when
/// the kernels load, the driver's copy otherwise.
fn local(ctx: &Arc<CudaContext>, config: &CudaIpcConfig) -> CudaIpcCollective {
    CudaIpcCollective {
        rank: 0,
        world: 1,
        ctx: ctx.clone(),
        config: config.clone(),
        ipc: None,
        local_copy: Module::load(ctx).ok(),
        poison: Poison::default(),
        closed: AtomicBool::new(false),
        close_once: Default::default(),
    }
}

fn assemble(rank: usize, ctx: &Arc<CudaContext>, config: &CudaIpcConfig, state: IpcState) -> CudaIpcCollective {
    CudaIpcCollective {
        rank,
        world: state.bases.len(),
        ctx: ctx.clone(),
        config: config.clone(),
        ipc: Some(state),
        local_copy: None,
        poison: Poison::default(),
        closed: AtomicBool::new(false),
        close_once: Default::default(),
    }
}

/// Enables access from `from`'s device to `to`'s (no-op on the same device).
fn enable_peer_access(from: &Arc<CudaContext>, to: &Arc<CudaContext>) -> Result<(), Error> {
    if from.cu_device() == to.cu_device() {
        return Ok(());
    }
    let mut can = 0i32;
    // SAFETY: out-pointer to a local; valid device handles.
    check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.cu_device(), to.cu_device()) }, "cuDeviceCanAccessPeer")?;
    if can == 0 {
        return Err(Error::InvalidConfig {
            detail: format!(
                "device {} cannot access device {} (no peer access): in-process IPC needs it",
                from.ordinal(),
                to.ordinal()
            ),
        });
    }
    driver::bind(from)?;
    // SAFETY: `to` is a live context; flags must be 0.
    let r = unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) };
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check(r, "cuCtxEnablePeerAccess")
}

impl CudaIpcCollective {
    /// `world` ranks as threads sharing device `ordinal` (its primary context). Returns
    /// [`Error::LibraryMissing`] when there is no CUDA driver (instead of panicking).
    ///
    /// Ranks that are threads sharing one context must enqueue in call order: see
    /// [`CudaIpcCollective::group`].
    pub fn group_on_ordinal(
        ordinal: usize,
        world: usize,
        config: &CudaIpcConfig,
    ) -> Result<Vec<CudaIpcCollective>, Error> {
        let ctx = driver::open_device(ordinal)?;
        Self::group(&vec![ctx; world], config)
    }

    /// `world` ranks as threads sharing one context's device.
    ///
    /// Ranks that are threads sharing one context must enqueue in call order: see
    /// [`CudaIpcCollective::group`].
    pub fn group_on_device(
        ctx: &Arc<CudaContext>,
        world: usize,
        config: &CudaIpcConfig,
    ) -> Result<Vec<CudaIpcCollective>, Error> {
        Self::group(&vec![ctx.clone(); world], config)
    }

    /// One rank per entry of `ctxs` (rank `r` runs in `ctxs[r]`), all in this process. Ranks
    /// on the same device share it; ranks on different devices get peer access enabled (an
    /// error if the devices cannot reach each other). Peers' allocations are used directly
    /// through unified addressing, never through IPC handles.
    ///
    /// Each returned rank is meant to be driven by its own thread with its own stream; all
    /// ranks must make the same calls in the same order.
    ///
    /// Ranks sharing one GPU wait for each other inside their kernels, so their kernels must
    /// run concurrently: give every rank its own stream, set `CUDA_DEVICE_MAX_CONNECTIONS` to
    /// at least the number of streams in use (e.g. 32) before the context is created (with
    /// fewer hardware queues than streams, two ranks' kernels can be serialised behind each
    /// other), do not allocate/free device memory, instantiate graphs or load modules while a
    /// peer may have a collective in flight (those calls can wait for the device to go idle),
    /// and enqueue driver copies/memsets only on a stream whose collectives have completed (a
    /// copy queued behind a pending collective waits in a copy-engine queue shared with the
    /// other ranks, where it can block a copy a peer needs before its next launch).
    ///
    /// Ranks that are threads sharing one context must enqueue in call order, e.g. call `k`
    /// of ranks 0, 1, ..., world-1 before call `k + 1` of any rank, as one host thread driving
    /// every rank would (or threads taking turns): with ranks enqueuing independently, one rank
    /// two or more calls ahead of another can hold a peer's flag unpublished behind the
    /// context's shared queues (measured with 8 ranks on an H200). One process per GPU or MPS
    /// processes (one context each) have no such requirement.
    ///
    /// A violation of any of these shows as `PeerTimeout`, never as wrong data. One rank per
    /// GPU has none of these constraints.
    pub fn group(ctxs: &[Arc<CudaContext>], config: &CudaIpcConfig) -> Result<Vec<CudaIpcCollective>, Error> {
        driver::ensure_driver()?;
        config.check()?;
        let world = ctxs.len();
        check_world(world)?;
        if world == 1 {
            return Ok(vec![local(&ctxs[0], config)]);
        }
        // Blocks: every rank's kernel must be resident at once on devices shared by ranks.
        let blocks = match config.max_blocks {
            Some(b) => b,
            None => {
                let mut b = usize::MAX;
                for c in ctxs {
                    let sharing = ctxs.iter().filter(|o| o.cu_device() == c.cu_device()).count();
                    b = b.min((driver::multiprocessors(c)? / sharing).max(1));
                }
                b
            }
        };
        let config =
            CudaIpcConfig { max_blocks: Some(blocks), timeouts: Some(config.resolved_timeouts()?), ..config.clone() };
        let layout = Layout::new(config.capacity, blocks)?;
        for a in ctxs {
            for b in ctxs {
                enable_peer_access(a, b)?;
            }
        }
        // One module per distinct context.
        let mut modules: Vec<(sys::CUcontext, Arc<Module>)> = Vec::new();
        for c in ctxs {
            if !modules.iter().any(|(k, _)| *k == c.cu_ctx()) {
                modules.push((c.cu_ctx(), Module::load(c)?));
            }
        }
        let pid = u64::from(std::process::id());
        let mut staging = Vec::with_capacity(world);
        for (r, c) in ctxs.iter().enumerate() {
            let header = Header {
                world: world as u64,
                rank: r as u64,
                capacity: config.capacity as u64,
                blocks: blocks as u64,
                pid,
            };
            staging.push(Staging::new(c, &layout, &header)?);
        }
        let bases: Vec<u64> = staging.iter().map(Staging::ptr).collect();
        let shared = Arc::new(GroupShared { staging });
        let mut out = Vec::with_capacity(world);
        for (r, c) in ctxs.iter().enumerate() {
            let err = ErrorRecord::new(c)?;
            let module = modules.iter().find(|(k, _)| *k == c.cu_ctx()).map(|(_, m)| m.clone()).ok_or_else(|| {
                Error::Backend { backend: BACKEND, detail: "module of a context went missing".into() }
            })?;
            let fixed =
                Fixed::new(&layout, &rank_memory(&layout, &bases), r, err.device_ptr(), timeout_ns(&config), THREADS);
            let state =
                IpcState { module, layout, fixed, bases: bases.clone(), err, owner: Owner::Group(shared.clone()) };
            out.push(assemble(r, c, &config, state));
        }
        // Staging was zeroed with synchronous calls: every rank's first launch sees it.
        Ok(out)
    }

    /// One rank of a group with one process per rank: allocations are exchanged as CUDA IPC
    /// handles through `boot` and opened once. Every rank must pass the same `config`
    /// (capacity, block count, RS+AG threshold; checked: [`Error::ConfigMismatch`]). Ranks
    /// sharing a GPU need MPS (or they cannot run concurrently and will time out). MPS shares
    /// a limited number of connections among its clients: run each process with a small
    /// `CUDA_DEVICE_MAX_CONNECTIONS` (2 works for 8 processes on an H200; with 32, worlds of 4
    /// or more fail at context creation with `CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED`).
    pub fn new(
        boot: Box<dyn Bootstrap>,
        ctx: &Arc<CudaContext>,
        config: &CudaIpcConfig,
    ) -> Result<CudaIpcCollective, Error> {
        driver::ensure_driver()?;
        config.check()?;
        let (rank, world) = (boot.rank(), boot.world_size());
        check_world(world)?;
        if world == 1 {
            return Ok(local(ctx, config));
        }
        // Exchange 1: what every rank must agree on, and its device.
        let uuid = driver::uuid(ctx)?;
        let sms = driver::multiprocessors(ctx)? as u64;
        let mut mine = Vec::with_capacity(64);
        for w in config.agreement_words() {
            mine.extend_from_slice(&w.to_le_bytes());
        }
        mine.extend_from_slice(&sms.to_le_bytes());
        mine.extend_from_slice(&uuid);
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
            None => {
                let mut b = usize::MAX;
                for theirs in &all {
                    let sms_q = u64::from_le_bytes(theirs[agreed..agreed + 8].try_into().unwrap_or([0; 8])) as usize;
                    let sharing = all.iter().filter(|o| o[agreed + 8..] == theirs[agreed + 8..]).count();
                    b = b.min((sms_q / sharing.max(1)).max(1));
                }
                b
            }
        };
        let config =
            CudaIpcConfig { max_blocks: Some(blocks), timeouts: Some(config.resolved_timeouts()?), ..config.clone() };
        let layout = Layout::new(config.capacity, blocks)?;
        let module = Module::load(ctx)?;
        let header = Header {
            world: world as u64,
            rank: rank as u64,
            capacity: config.capacity as u64,
            blocks: blocks as u64,
            pid: u64::from(std::process::id()),
        };
        let own = Staging::new(ctx, &layout, &header)?;
        // Exchange 2: IPC handles, opened once.
        let handles = boot.all_gather_bytes(&own.ipc_handle()?)?;
        let mut mappings = Vec::with_capacity(world - 1);
        let mut bases = vec![0u64; world];
        for (q, h) in handles.iter().enumerate() {
            if q == rank {
                bases[q] = own.ptr();
                continue;
            }
            let m = IpcMapping::open(ctx, h)?;
            bases[q] = m.ptr();
            // The peer's header must describe the same layout.
            let mut words = [0u64; 7];
            memory::read_words(ctx, m.ptr() + layout.header() as u64, &mut words)?;
            close::check_peer_header(words, q, &header)?;
            mappings.push(m);
        }
        let err = ErrorRecord::new(ctx)?;
        let fixed =
            Fixed::new(&layout, &rank_memory(&layout, &bases), rank, err.device_ptr(), timeout_ns(&config), THREADS);
        // Nobody launches before everyone has opened (and zeroed) everything.
        boot.barrier()?;
        let owner = Owner::Process { own: Mutex::new(Some(own)), mappings: Mutex::new(mappings), boot };
        let state = IpcState { module, layout, fixed, bases, err, owner };
        Ok(assemble(rank, ctx, &config, state))
    }

    /// [`CudaIpcCollective::new`] on device `ordinal` (its primary context); returns
    /// [`Error::LibraryMissing`] without a CUDA driver.
    pub fn new_on_ordinal(
        boot: Box<dyn Bootstrap>,
        ordinal: usize,
        config: &CudaIpcConfig,
    ) -> Result<CudaIpcCollective, Error> {
        let ctx = driver::open_device(ordinal)?;
        Self::new(boot, &ctx, config)
    }
}
