//! Construction: N ranks as threads of one process (one GPU or several, peer pointers used
//! directly), or one process per rank over a bootstrap (IPC handles exchanged once).
use crate::collective::IpcCollective;
use crate::lockstep::Lockstep;
use crate::order::StreamOrder;
use crate::state::{IpcState, Owner};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use collective_core::process::ProcessOwner;
use detcoll_protocol::IpcDevice;
use detcoll_protocol::params::{Fixed, RankMemory, THREADS};
use detcoll_protocol::{HEADER_WORDS, Header, IpcConfig, Layout, Poison, close, failure};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

fn check_world(world: usize) -> Result<(), Error> {
    collective_core::check_node_world_size(world)
}

/// `config` with the block count and the timeouts every rank settled on.
fn resolved(config: &IpcConfig, blocks: usize) -> Result<IpcConfig, Error> {
    let mut c = config.clone();
    c.max_blocks = Some(blocks);
    c.timeouts = Some(config.resolved_timeouts()?);
    Ok(c)
}

/// `DETCOLL_LOCKSTEP` (a boolean, default on; a bad value is an error): whether ranks that are
/// threads sharing one device launch each call together ([`IpcCollective::group`]), where
/// `IpcConfig::lockstep` does not say. Turn it
/// off only where the caller already orders every enqueue and makes no blocking device call
/// between calls — one host thread driving several ranks of one GPU, say — and to reproduce,
/// for diagnosis, what the lockstep prevents.
pub const LOCKSTEP_ENV: &str = "DETCOLL_LOCKSTEP";

impl<D: IpcDevice> IpcCollective<D> {
    fn assemble(rank: usize, world: usize, device: &D, config: &IpcConfig, ipc: Option<IpcState<D>>) -> Self {
        // World 1: the copy kernel when the kernels load, the runtime's copy otherwise.
        let local_copy = if ipc.is_none() { device.kernels(world).ok() } else { None };
        IpcCollective {
            rank,
            world,
            device: device.clone(),
            // The route policy bound to this world (a world of one: every call local) and to
            // this backend (transport ranges of a factory's table run as the IPC route with the
            // same bits): per call, only a lookup.
            config: config.clone().with_routes(config.routes.clone().for_world(world).without_transport()),
            ipc,
            local_copy,
            poison: Poison::default(),
            closed: AtomicBool::new(false),
            close_once: Default::default(),
            calls: Mutex::new(StreamOrder::default()),
            lockstep: None,
            process: ProcessOwner::current(),
        }
    }

    /// `world` ranks as threads sharing `device`.
    ///
    /// Ranks that are threads sharing one context launch each call together: see
    /// [`IpcCollective::group`].
    pub fn group_on(device: &D, world: usize, config: &IpcConfig) -> Result<Vec<Self>, Error> {
        Self::group(&vec![device.clone(); world], config)
    }

    /// One rank per entry of `devices` (rank `r` runs on `devices[r]`), all in this process.
    /// Ranks on the same device share it; ranks on different devices get peer access enabled
    /// (an error if the devices cannot reach each other). Peers' allocations are used directly,
    /// never through IPC handles.
    ///
    /// Each returned rank is meant to be driven by its own thread with its own stream; all
    /// ranks must make the same calls in the same order.
    ///
    /// Ranks sharing one GPU wait for each other inside their kernels, so their kernels must
    /// run concurrently: give every rank its own stream (CUDA: set `CUDA_DEVICE_MAX_CONNECTIONS`
    /// to at least the number of streams in use before the context is created; HIP: as many
    /// `GPU_MAX_HW_QUEUES`), do not allocate/free device memory, instantiate graphs or load
    /// modules while a peer may have a collective in flight (those calls can wait for the
    /// device to go idle; with CUDA's default lazy module loading the first launch of any
    /// kernel, a library's GEMM too, loads it: set `CUDA_MODULE_LOADING=EAGER`), and enqueue
    /// runtime copies only on a stream whose collectives have completed. A violation shows as
    /// `PeerTimeout`, never as wrong data.
    ///
    /// Ranks sharing one device launch every call together (the engine's lockstep, see
    /// `lockstep.rs`): no such rank launches call `k` before every one of them has reached it,
    /// and none returns from call `k` before every one has launched it, so ordinary stream
    /// work between calls (pageable copies, stream-ordered allocation and free, memset, module
    /// loading) can never leave a peer's kernel queued behind a spinning one. Hence each rank
    /// sharing a device must be driven by its own thread, and callers must not serialise
    /// those ranks' calls themselves (turn-taking, or one thread driving several of them):
    /// that waits for the peer timeout and fails with `PeerTimeout`. One process per GPU, MPS
    /// processes and threads on different GPUs have no lockstep.
    pub fn group(devices: &[D], config: &IpcConfig) -> Result<Vec<Self>, Error> {
        config.check()?;
        let world = devices.len();
        check_world(world)?;
        if world == 1 {
            return Ok(vec![Self::assemble(0, 1, &devices[0], config, None)]);
        }
        // Blocks: every rank's kernel must be resident at once on devices shared by ranks.
        let blocks = match config.max_blocks {
            Some(b) => b,
            None => {
                let mut b = usize::MAX;
                for d in devices {
                    let sharing = devices.iter().filter(|o| o.same_device(d)).count();
                    b = b.min((d.multiprocessors()? / sharing).max(1));
                }
                b
            }
        };
        let config = resolved(config, blocks)?;
        let layout = Layout::with_ll(config.capacity, blocks, world, config.ll_capacity)?;
        for a in devices {
            for b in devices {
                a.enable_peer_access(b)?;
            }
        }
        let pid = u64::from(std::process::id());
        let mut staging = Vec::with_capacity(world);
        for (r, d) in devices.iter().enumerate() {
            let header = Header {
                world: world as u64,
                rank: r as u64,
                capacity: config.capacity as u64,
                blocks: blocks as u64,
                pid,
                ll_capacity: layout.ll_capacity() as u64,
            };
            staging.push(d.alloc_staging(&layout, &header)?);
        }
        let mems: Vec<RankMemory> = staging.iter().map(|s| D::staging_memory(s, &layout)).collect();
        let shared = Arc::new(staging);
        let mut out = Vec::with_capacity(world);
        for (r, d) in devices.iter().enumerate() {
            let kernels = d.kernels(world)?;
            let err = d.error_record()?;
            let bound = d.wait_bound(config.timeouts().peer)?;
            let fixed = Fixed::new(&layout, &mems, r, D::record_address(&err), bound, THREADS);
            let state =
                IpcState { kernels, layout, fixed, mems: mems.clone(), err, owner: Owner::Group(shared.clone()) };
            out.push(Self::assemble(r, world, d, &config, Some(state)));
        }
        // One lockstep per device shared by two or more ranks, its members in rank order. The
        // variable is read only where a device is shared (never by the CPU twin, whose ranks
        // are devices of their own): a bad value fails the jobs it would configure, no other.
        let mut placed = vec![false; world];
        let mut shared_devices = Vec::new();
        for r in 0..world {
            if placed[r] {
                continue;
            }
            let sharing: Vec<usize> = (r..world).filter(|&q| devices[q].same_device(&devices[r])).collect();
            for &q in &sharing {
                placed[q] = true;
            }
            if sharing.len() > 1 {
                shared_devices.push(sharing);
            }
        }
        if !shared_devices.is_empty() {
            let lockstep = match config.lockstep {
                Some(on) => on,
                None => collective_core::env::read(LOCKSTEP_ENV, collective_core::env::parse_bool)?.unwrap_or(true),
            };
            if lockstep {
                for sharing in shared_devices {
                    for (q, member) in sharing.iter().zip(Lockstep::members(sharing.clone())) {
                        out[*q].lockstep = Some(member);
                    }
                }
            }
        }
        // Staging was zeroed with synchronous calls: every rank's first launch sees it.
        Ok(out)
    }

    /// One rank of a group with one process per rank: allocations are exchanged as IPC
    /// handles through `boot` and opened once. Every rank must pass the same `config` (the
    /// factory's agreement checks it; here, what the staging must share — capacity, block
    /// count, LL capacity — is checked in every peer's header: [`Error::ConfigMismatch`]; ranks
    /// whose thresholds differ route a call differently, which the kernels report as a
    /// signature mismatch).
    /// With `max_blocks: None` the block count is the smallest of `multiprocessors / ranks
    /// sharing that GPU` over the ranks (ranks tell their GPUs apart by
    /// [`IpcDevice::identity`]). Ranks sharing a GPU need it to run their kernels concurrently
    /// (CUDA: MPS, with a small `CUDA_DEVICE_MAX_CONNECTIONS` per process — 2 works for 8
    /// processes on an H200; with 32, worlds of 4 or more fail at context creation with
    /// `CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED`).
    pub fn new(boot: Box<dyn Bootstrap>, device: D, config: &IpcConfig) -> Result<Self, Error> {
        let mut c = Self::connect(&*boot, device, config)?;
        if let Some(IpcState { owner: Owner::Process { boot: kept, .. }, .. }) = &mut c.ipc {
            *kept = Some(boot);
        }
        Ok(c)
    }

    /// [`IpcCollective::new`] for a caller that keeps the bootstrap alive itself (its
    /// connections, and the peers' view of this rank as alive, as long as the collective).
    ///
    /// Every exchange carries either this rank's message or its failure (an invalid
    /// configuration, an allocation or mapping that failed, a peer header that disagrees), so
    /// a failure on one rank fails every rank at once with an error of the same kind naming
    /// that rank, instead of leaving the others waiting for the bootstrap's timeout.
    pub fn connect(boot: &dyn Bootstrap, device: D, config: &IpcConfig) -> Result<Self, Error> {
        let (rank, world) = (boot.rank(), boot.world_size());
        check_world(world)?;
        if world == 1 {
            config.check()?;
            return Ok(Self::assemble(0, 1, &device, config, None));
        }
        // Exchange 1: this rank's device facts (multiprocessors, GPU identity), which size the
        // grid. The configuration itself is agreed once, by the caller's agreement (the
        // factory's); what the ranks' staging must share (world, capacity, blocks, LL area) is
        // checked in every peer's header at exchange 3, so a rank built otherwise still fails
        // every rank with ConfigMismatch before any call.
        let mine = config.check().and_then(|()| {
            let mut mine = Vec::with_capacity(24);
            mine.extend_from_slice(&(device.multiprocessors()? as u64).to_le_bytes());
            mine.extend_from_slice(&device.identity()?);
            Ok(mine)
        });
        let all = exchange(boot, mine)?;
        // Every rank's facts: 8 bytes of multiprocessors, then a 16-byte identity.
        if let Some(q) = all.iter().position(|m| m.len() != 24) {
            return Err(Error::Backend {
                backend: D::BACKEND,
                detail: format!(
                    "rank {q} sent {} bytes of device facts, not 24: another detcoll version?",
                    all[q].len()
                ),
            });
        }
        let blocks = match config.max_blocks {
            Some(b) => b,
            None => {
                let mut b = usize::MAX;
                for theirs in &all {
                    let sms = u64::from_le_bytes(theirs[..8].try_into().unwrap_or([0; 8])) as usize;
                    let sharing = all.iter().filter(|o| o[8..] == theirs[8..]).count();
                    b = b.min((sms / sharing.max(1)).max(1));
                }
                b
            }
        };
        // Exchange 2: this rank's staging, allocated and exported (or why not).
        let header = Header {
            world: world as u64,
            rank: rank as u64,
            capacity: config.capacity as u64,
            blocks: blocks as u64,
            pid: u64::from(std::process::id()),
            ll_capacity: 0,
        };
        let prepared = resolved(config, blocks).and_then(|config| {
            let layout = Layout::with_ll(config.capacity, blocks, world, config.ll_capacity)?;
            let kernels = device.kernels(world)?;
            let header = Header { ll_capacity: layout.ll_capacity() as u64, ..header };
            let own = device.alloc_staging(&layout, &header)?;
            let exported = device.export_staging(&own)?;
            Ok((config, layout, kernels, header, own, exported))
        });
        let (message, prepared) = match prepared {
            Ok((config, layout, kernels, header, own, exported)) => {
                (Ok(exported), Some((config, layout, kernels, header, own)))
            }
            Err(e) => (Err(e), None),
        };
        let handles = exchange(boot, message)?;
        let Some((config, layout, kernels, header, own)) = prepared else {
            unreachable!("the exchange returns a failed rank's own failure")
        };
        // Exchange 3: every peer mapped and its header checked (or why not); nobody launches
        // before everyone has opened (and zeroed) everything.
        let mut mappings = Vec::with_capacity(world - 1);
        let mut mems = vec![D::staging_memory(&own, &layout); world];
        let opened = (|| {
            for (q, h) in handles.iter().enumerate() {
                if q == rank {
                    continue;
                }
                let m = device.import_staging(q, h)?;
                mems[q] = D::mapping_memory(&m, &layout);
                // The peer's header must describe the same layout.
                let mut words = [0u64; HEADER_WORDS];
                device.read_words(mems[q].control + layout.header() as u64, &mut words)?;
                mappings.push(m);
                close::check_peer_header(words, q, &header)?;
            }
            Ok(Vec::new())
        })();
        exchange(boot, opened)?;
        let err = device.error_record()?;
        let bound = device.wait_bound(config.timeouts().peer)?;
        let fixed = Fixed::new(&layout, &mems, rank, D::record_address(&err), bound, THREADS);
        let owner = Owner::Process { own: Mutex::new(Some(own)), mappings: Mutex::new(mappings), boot: None };
        let state = IpcState { kernels, layout, fixed, mems, err, owner };
        Ok(Self::assemble(rank, world, &device, &config, Some(state)))
    }
}

/// One construction exchange: this rank's message (or its failure) to every rank; every rank's
/// message, or the first failure in rank order (this rank's own first).
fn exchange(boot: &dyn Bootstrap, mine: Result<Vec<u8>, Error>) -> Result<Vec<Vec<u8>>, Error> {
    let all = boot.all_gather_bytes(&failure::encode(mine.as_ref().map(Clone::clone)))?;
    // A failed rank returns its own error as it happened (its peers rebuild it from the message).
    mine?;
    failure::decode(all, "ipc-engine")
}
