//! [`ShmCollective`]: the CPU twin's implementation of the collective trait.
use crate::config::ShmConfig;
use crate::engine::Engine;
use crate::region::{Handle, Region, Share};
use crate::wait::Peer;
use collective_core::bootstrap::Bootstrap;
use collective_core::process::ProcessOwner;
use collective_core::protocol::close::CloseOnce;
use collective_core::protocol::{Chunks, HEADER_WORDS, Header, Layout, Timeouts};
use collective_core::{
    Capabilities, Collective, Error, Io, Op, Route, RouteSelect, SUPPORTED_WORLD_SIZES, host_identity, ipc_route_for,
    validate, validate_many,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A deterministic collective over host shared memory (stream type `()`: calls complete
/// before they return).
#[derive(Debug)]
pub struct ShmCollective {
    rank: usize,
    world: usize,
    config: ShmConfig,
    /// `None` for world size 1, which needs no IPC state.
    engine: Option<Engine>,
    closed: AtomicBool,
    /// The outcome of the first [`Collective::close`]: a later close reports its failure again
    /// ([`Error::CloseFailed`]) instead of `Ok`; a concurrent close waits for it.
    close_once: CloseOnce,
    /// Held for the whole of every call (all its chunks): calls of several threads on one
    /// handle never interleave, each is atomic, in one order per handle.
    calls: Mutex<()>,
    /// The process that built this handle: it fails closed in a forked child.
    owner: ProcessOwner,
}

fn check_world(world: usize) -> Result<(), Error> {
    if SUPPORTED_WORLD_SIZES.contains(&world) { Ok(()) } else { Err(Error::UnsupportedWorldSize { world }) }
}

fn write_header(region: &Region, layout: &Layout, h: Header) {
    for (i, w) in h.to_words().into_iter().enumerate() {
        // SAFETY: the header line is in bounds and 8-aligned; no peer maps it yet.
        unsafe { region.base().add(layout.header() + 8 * i).cast::<u64>().write(w) };
    }
}

fn read_header(region: &Region, layout: &Layout) -> Option<Header> {
    let mut w = [0u64; HEADER_WORDS];
    for (i, x) in w.iter_mut().enumerate() {
        // SAFETY: in bounds; written by the owner before the bootstrap exchange that told us its name.
        *x = unsafe { region.base().add(layout.header() + 8 * i).cast::<u64>().read_volatile() };
    }
    Header::from_words(w)
}

/// What each rank tells the others at construction; ranks must agree on all but handle and pid.
struct Hello {
    handle: Handle,
    capacity: usize,
    rs_ag_threshold: usize,
    ll_capacity: usize,
    timeouts: Timeouts,
    pid: u32,
    host: String,
}

/// First line of every construction message of this version.
const VERSION: &str = "shm-ipc/4";
/// Second line of a message reporting success; a failure has [`FAILED`] there.
const OK: &str = "ok";
const FAILED: &str = "failed";

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let [peer, close] = self.timeouts.agreement_words();
        format!(
            "{VERSION}\n{OK}\n{}\n{}\n{}\n{}\n{peer}\n{close}\n{}\n{}",
            self.handle.encode(),
            self.capacity,
            self.rs_ag_threshold,
            self.ll_capacity,
            self.pid,
            self.host
        )
        .into_bytes()
    }
    fn decode(b: &[u8]) -> Option<Hello> {
        let s = std::str::from_utf8(b).ok()?;
        let mut it = s.split('\n');
        if it.next()? != VERSION || it.next()? != OK {
            return None;
        }
        Some(Hello {
            handle: Handle::decode(it.next()?)?,
            capacity: it.next()?.parse().ok()?,
            rs_ag_threshold: it.next()?.parse().ok()?,
            ll_capacity: it.next()?.parse().ok()?,
            timeouts: Timeouts {
                peer: std::time::Duration::from_nanos(it.next()?.parse().ok()?),
                close: std::time::Duration::from_nanos(it.next()?.parse().ok()?),
            },
            pid: it.next()?.parse().ok()?,
            host: it.next()?.to_string(),
        })
    }
}

/// A construction step that failed on one rank, as sent to the others in place of its hello
/// or its "mapped" report, so every rank returns at once with an error of the same kind instead
/// of waiting for the bootstrap's timeout.
fn encode_failure(e: &Error) -> Vec<u8> {
    let (kind, bytes, errno, msg) = match e {
        Error::OutOfMemory { what, bytes, source } => ("oom", *bytes, source.raw_os_error().unwrap_or(0), what.clone()),
        Error::InvalidConfig { detail } => ("invalid", 0, 0, detail.clone()),
        Error::ConfigMismatch { detail } => ("mismatch", 0, 0, detail.clone()),
        other => ("other", 0, 0, other.to_string()),
    };
    format!("{VERSION}\n{FAILED}\n{kind}\n{bytes}\n{errno}\n{msg}").into_bytes()
}

/// Rank `q`'s failure report, rebuilt as this rank's error; `None` if `b` is no failure report.
fn decode_failure(q: usize, b: &[u8]) -> Option<Error> {
    let s = std::str::from_utf8(b).ok()?;
    let mut it = s.splitn(6, '\n');
    if it.next()? != VERSION || it.next()? != FAILED {
        return None;
    }
    let kind = it.next()?;
    let bytes: usize = it.next()?.parse().ok()?;
    let errno: i32 = it.next()?.parse().ok()?;
    let msg = it.next()?;
    Some(match kind {
        "oom" => Error::OutOfMemory {
            what: format!("on rank {q}, {msg}"),
            bytes,
            source: if errno != 0 {
                std::io::Error::from_raw_os_error(errno)
            } else {
                std::io::ErrorKind::OutOfMemory.into()
            },
        },
        "invalid" => Error::InvalidConfig { detail: format!("on rank {q}: {msg}") },
        "mismatch" => Error::ConfigMismatch { detail: format!("seen by rank {q}: {msg}") },
        _ => Error::Backend { backend: "shm-ipc", detail: format!("rank {q} failed to construct: {msg}") },
    })
}

/// The first failure reported in `all` (one message per rank), if any.
fn first_failure(all: &[Vec<u8>]) -> Option<Error> {
    all.iter().enumerate().find_map(|(q, b)| decode_failure(q, b))
}

/// This rank's half of construction: everything before the first exchange.
struct Own {
    layout: Layout,
    config: ShmConfig,
    region: Arc<Region>,
    share: Share,
    hello: Hello,
}

impl Own {
    fn prepare(rank: usize, world: usize, config: ShmConfig) -> Result<Own, Error> {
        config.check()?;
        let timeouts = Timeouts::resolve(config.timeouts)?;
        let config = ShmConfig { timeouts: Some(timeouts), ..config };
        let layout = Layout::with_ll(config.capacity, 1, world, config.ll_capacity)?;
        let pid = std::process::id();
        let nonce =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let (region, share) = Region::create_shared(&format!("detcoll-{pid}-{rank}-{nonce:x}"), layout.total_bytes())?;
        write_header(
            &region,
            &layout,
            Header {
                world: world as u64,
                rank: rank as u64,
                capacity: config.capacity as u64,
                blocks: 1,
                pid: pid.into(),
                ll_capacity: layout.ll_capacity() as u64,
            },
        );
        let hello = Hello {
            handle: share.handle.clone(),
            capacity: config.capacity,
            rs_ag_threshold: config.rs_ag_threshold,
            ll_capacity: config.ll_capacity,
            timeouts,
            pid,
            host: host_identity()?,
        };
        Ok(Own { layout, config, region: Arc::new(region), share, hello })
    }
}

impl ShmCollective {
    /// One process per rank: this rank's region is a shared-memory file in `/dev/shm` that
    /// peers open through the handle `boot` carries; every rank maps every peer's. Collective:
    /// every rank of `boot` must call it with the same `config`, or all fail with
    /// [`Error::ConfigMismatch`]. A failure on one rank (a full `/dev/shm`: [`Error::OutOfMemory`];
    /// a truncated peer object: [`Error::ConfigMismatch`]; a capacity below
    /// [`collective_core::protocol::MIN_CAPACITY`]: [`Error::InvalidConfig`]) is sent to the
    /// others in its place in the exchange, so every rank returns an error at once.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use collective_core::bootstrap::TcpBootstrap;
    /// use shm_ipc::{ShmCollective, ShmConfig};
    /// // In each process started by `detcoll-run --nproc 4 -- ...` or torchrun:
    /// let comm = ShmCollective::new(&TcpBootstrap::from_env()?, ShmConfig::new(1 << 20))?;
    /// # let _ = comm; Ok(()) }
    /// ```
    pub fn new(boot: &dyn Bootstrap, config: ShmConfig) -> Result<Self, Error> {
        let (rank, world) = (boot.rank(), boot.world_size());
        check_world(world)?;
        if world == 1 {
            config.check()?;
            return Ok(Self::local(config));
        }
        // `prepare` checks the configuration; its failure reaches every rank in the exchange.
        let own = Own::prepare(rank, world, config);
        let mine = match &own {
            Ok(o) => o.hello.encode(),
            Err(e) => encode_failure(e),
        };
        let all = match boot.all_gather_bytes(&mine) {
            Ok(all) => all,
            Err(e) => return Err(own.err().unwrap_or(e.into())),
        };
        let own = own?;
        if let Some(e) = first_failure(&all) {
            return Err(e);
        }
        let mapped = Self::map_peers(rank, world, &own, &all);
        let report = match &mapped {
            Ok(_) => format!("{VERSION}\n{OK}").into_bytes(),
            Err(e) => encode_failure(e),
        };
        let reports = match boot.all_gather_bytes(&report) {
            Ok(r) => r,
            Err(e) => return Err(mapped.err().unwrap_or(e.into())),
        };
        let (regions, peers) = mapped?;
        if let Some(e) = first_failure(&reports) {
            return Err(e);
        }
        // Every rank has mapped every region: the descriptor (or the fallback's name) that let
        // peers find ours is no longer needed.
        drop(own.share);
        let Own { layout, config, hello, .. } = own;
        Ok(ShmCollective {
            rank,
            world,
            config,
            engine: Some(Engine::new(rank, layout, regions, peers, hello.timeouts, 0)),
            closed: AtomicBool::new(false),
            close_once: CloseOnce::default(),
            calls: Mutex::new(()),
            owner: ProcessOwner::current(),
        })
    }

    /// Checks every peer's hello against ours and maps its region.
    fn map_peers(
        rank: usize,
        world: usize,
        own: &Own,
        all: &[Vec<u8>],
    ) -> Result<(Vec<Arc<Region>>, Vec<Peer>), Error> {
        let hello = &own.hello;
        let hellos: Vec<Hello> = all
            .iter()
            .enumerate()
            .map(|(q, b)| {
                Hello::decode(b).ok_or_else(|| Error::ConfigMismatch {
                    detail: format!("rank {q} is not a shm-ipc rank of this version ({VERSION})"),
                })
            })
            .collect::<Result<_, _>>()?;
        for (q, h) in hellos.iter().enumerate() {
            if h.capacity != hello.capacity
                || h.rs_ag_threshold != hello.rs_ag_threshold
                || h.ll_capacity != hello.ll_capacity
            {
                return Err(Error::ConfigMismatch {
                    detail: format!(
                        "rank {q} has capacity {}, RS+AG threshold {} and LL capacity {}, rank {rank} has {}, {} and {}",
                        h.capacity,
                        h.rs_ag_threshold,
                        h.ll_capacity,
                        hello.capacity,
                        hello.rs_ag_threshold,
                        hello.ll_capacity
                    ),
                });
            }
            if h.timeouts != hello.timeouts {
                return Err(Error::ConfigMismatch {
                    detail: format!(
                        "rank {q} has timeouts {:?}, rank {rank} has {:?} (DETCOLL_TIMEOUT_MS differs?)",
                        h.timeouts, hello.timeouts
                    ),
                });
            }
            if h.host != hello.host {
                return Err(Error::InvalidConfig {
                    detail: format!(
                        "the CPU twin needs every rank on one host; rank {q} runs on {}, rank {rank} on {}",
                        h.host, hello.host
                    ),
                });
            }
        }
        let layout = &own.layout;
        let mut regions = Vec::with_capacity(world);
        for (q, h) in hellos.iter().enumerate() {
            if q == rank {
                regions.push(own.region.clone());
                continue;
            }
            let r = Region::open_shared(q, &h.handle, layout.total_bytes())?;
            match read_header(&r, layout) {
                Some(hd)
                    if hd.rank == q as u64
                        && hd.world == world as u64
                        && hd.capacity == own.config.capacity as u64
                        && hd.ll_capacity == layout.ll_capacity() as u64 => {}
                other => {
                    return Err(Error::ConfigMismatch { detail: format!("rank {q}'s region header is {other:?}") });
                }
            }
            regions.push(Arc::new(r));
        }
        let peers = hellos.iter().enumerate().map(|(q, h)| Peer { rank: q, pid: Some(h.pid) }).collect();
        Ok((regions, peers))
    }

    /// A world of `world` ranks as threads of this process: regions are heap memory that every
    /// rank reads directly. Hand one handle to each thread.
    ///
    /// ```
    /// use collective_core::{Collective, Io};
    /// use shm_ipc::{ShmCollective, ShmConfig};
    /// let ranks = ShmCollective::group(2, ShmConfig::new(1 << 16)).unwrap();
    /// std::thread::scope(|s| for comm in &ranks { s.spawn(move || {
    ///     let mut out = [0f32; 4];
    ///     comm.all_reduce(Io::host(&[comm.rank() as f32 + 0.5; 4], &mut out), &()).unwrap();
    ///     assert_eq!(out[0].to_bits(), (0.5f32 + 1.5).to_bits());
    /// }); });
    /// ```
    pub fn group(world: usize, config: ShmConfig) -> Result<Vec<ShmCollective>, Error> {
        Self::group_at_generation(world, config, 0)
    }

    /// [`ShmCollective::group`] in the state reached after `start` one-shot calls (test
    /// support for generation wrap-around): every rank's generation counter, ready flag and
    /// push headers at `start` (digest 0), every LL word with flag `start`, phase-2 flags 0 as
    /// after construction.
    #[doc(hidden)]
    pub fn group_at_generation(world: usize, config: ShmConfig, start: u32) -> Result<Vec<ShmCollective>, Error> {
        check_world(world)?;
        config.check()?;
        if world == 1 {
            return Ok(vec![Self::local(config)]);
        }
        let timeouts = Timeouts::resolve(config.timeouts)?;
        let config = ShmConfig { timeouts: Some(timeouts), ..config };
        let layout = Layout::with_ll(config.capacity, 1, world, config.ll_capacity)?;
        let regions: Vec<Arc<Region>> =
            (0..world).map(|_| Region::heap(layout.total_bytes()).map(Arc::new)).collect::<Result<_, _>>()?;
        for r in &regions {
            Engine::preset_generation(&layout, r, start);
        }
        let peers: Vec<Peer> = (0..world).map(|q| Peer { rank: q, pid: None }).collect();
        Ok((0..world)
            .map(|rank| ShmCollective {
                rank,
                world,
                config,
                engine: Some(Engine::new(rank, layout, regions.clone(), peers.clone(), timeouts, start)),
                closed: AtomicBool::new(false),
                close_once: CloseOnce::default(),
                calls: Mutex::new(()),
                owner: ProcessOwner::current(),
            })
            .collect())
    }

    fn local(config: ShmConfig) -> Self {
        ShmCollective {
            rank: 0,
            world: 1,
            config,
            engine: None,
            closed: AtomicBool::new(false),
            close_once: CloseOnce::default(),
            calls: Mutex::new(()),
            owner: ProcessOwner::current(),
        }
    }

    /// Bytes of staging and control this rank keeps for its lifetime.
    pub fn workspace_bytes(&self) -> usize {
        self.engine.as_ref().map_or(0, |e| e.layout.total_bytes())
    }

    fn check_open(&self) -> Result<(), Error> {
        self.owner.check()?;
        if self.closed.load(Ordering::Acquire) { Err(Error::Closed) } else { Ok(()) }
    }

    /// Takes this handle's call lock (see `calls`); a thread that panicked inside a call left
    /// the protocol state unknown, so the handle fails closed.
    fn lock_call(&self) -> Result<MutexGuard<'_, ()>, Error> {
        self.calls.lock().map_err(|_| {
            let e =
                Error::Backend { backend: "shm-ipc", detail: "a thread panicked inside a call of this handle".into() };
            match &self.engine {
                Some(engine) => engine.poison.record(e),
                None => e,
            }
        })
    }

    /// One single-lane call by `route` (`None`: the configured RS+AG threshold decides).
    fn single(&self, op: Op, io: Io<'_>, route: Option<Route>) -> Result<(), Error> {
        self.check_open()?;
        let _call = self.lock_call()?;
        if let Some(e) = &self.engine {
            e.poison.check()?;
        }
        // No capacity limit: a call above the staging capacity runs in chunks (`Chunks`).
        let call = validate(op, &io, self.rank, self.world, usize::MAX)?;
        let Some(engine) = &self.engine else {
            // World 1: a copy, or nothing in place.
            if !call.in_place {
                // SAFETY: validated, non-overlapping caller views of `bytes_out` bytes.
                unsafe { core::ptr::copy_nonoverlapping(call.src as *const u8, call.dst as *mut u8, call.bytes_out()) };
            }
            return Ok(());
        };
        let route = match route {
            None => self.route(op, call.bytes_in()),
            Some(r @ (Route::IpcOneShot | Route::IpcReduceScatterAllGather | Route::IpcPushLl | Route::IpcPush))
                if r == ipc_route_for(op, r) =>
            {
                r
            }
            Some(r) => {
                return Err(Error::InvalidConfig { detail: format!("{op} cannot take route {r:?} on the CPU twin") });
            }
        };
        // A push call beyond its slots: the one-shot pull route, same bits; beyond the frame:
        // chunks of it, one generation each, with the same bits as one call.
        let chunks =
            Chunks::single(&call, self.rank, self.world, route, self.config.capacity, engine.layout.ll_capacity())?;
        Self::execute_all(engine, chunks)
    }

    /// Executes the plans of one call in order.
    fn execute_all(engine: &Engine, chunks: Chunks) -> Result<(), Error> {
        for plan in chunks {
            engine.execute(&plan?)?;
        }
        Ok(())
    }
}

impl RouteSelect for ShmCollective {
    fn call_on_route(&self, op: Op, io: Io<'_>, route: Route, _: &()) -> Result<(), Error> {
        if op == Op::ReduceScatterMany {
            return Err(Error::InvalidConfig { detail: "reduce_scatter_many takes reduce_scatter_many's call".into() });
        }
        let route = if self.world == 1 { None } else { Some(route) };
        self.single(op, io, route)
    }
    fn reduce_scatter_many_on_route(&self, lanes: &[Io<'_>], route: Route, _: &()) -> Result<(), Error> {
        self.many(lanes, route)
    }
}

impl Collective for ShmCollective {
    type Stream = ();

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn capabilities(&self) -> Capabilities {
        // Calls of any size: above the staging capacity they run in chunks, and every capacity
        // construction accepts (at least `MIN_CAPACITY`) chunks every call.
        Capabilities::strict(self.config.capacity, false).with_max_call_bytes(usize::MAX)
    }
    fn route(&self, op: Op, bytes: usize) -> Route {
        if self.world == 1 {
            Route::Local
        } else if op == Op::AllReduce && bytes >= self.config.rs_ag_threshold {
            Route::IpcReduceScatterAllGather
        } else {
            Route::IpcOneShot
        }
    }
    fn all_reduce(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.single(Op::AllReduce, io, None)
    }
    fn all_gather(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.single(Op::AllGather, io, None)
    }
    fn reduce_scatter(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.single(Op::ReduceScatter, io, None)
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], _: &()) -> Result<(), Error> {
        self.many(lanes, Route::IpcOneShot)
    }
    /// Calls run to completion before they return, so a failure is also their own error;
    /// `check` reports it again (poisoned), or `Closed` after close.
    fn check(&self) -> Result<(), Error> {
        self.check_open()?;
        self.engine.as_ref().map_or(Ok(()), |e| e.poison.check())
    }
    fn synchronize(&self, _: &()) -> Result<(), Error> {
        Collective::check(self)
    }
    fn close(&self) -> Result<(), Error> {
        if !self.owner.is_current() {
            // A forked child: the peers' memory and the ack lines are the parent's.
            return Err(self.owner.foreign());
        }
        self.close_once.run(|| {
            self.closed.store(true, Ordering::Release);
            match &self.engine {
                Some(e) => e.close(),
                None => Ok(()),
            }
        })
    }
}

impl ShmCollective {
    /// `reduce_scatter_many` by `route`: the LL push route when it is asked for and the lanes'
    /// shards fit the LL slots, the one-shot pull route otherwise (in groups of lanes and
    /// chunks of lanes when they exceed the staging capacity).
    fn many(&self, lanes: &[Io<'_>], route: Route) -> Result<(), Error> {
        self.check_open()?;
        let _call = self.lock_call()?;
        if let Some(e) = &self.engine {
            e.poison.check()?;
        }
        let (calls, sig) = validate_many(lanes, self.rank, self.world, usize::MAX)?;
        let Some(engine) = &self.engine else {
            for l in calls.iter().filter(|l| !l.call.in_place) {
                // SAFETY: validated, non-overlapping caller views.
                unsafe {
                    core::ptr::copy_nonoverlapping(l.call.src as *const u8, l.call.dst as *mut u8, l.call.bytes_out())
                };
            }
            return Ok(());
        };
        let (capacity, ll) = (self.config.capacity, engine.layout.ll_capacity());
        Self::execute_all(engine, Chunks::many(&calls, sig, self.rank, self.world, route, capacity, ll))
    }
}

impl Drop for ShmCollective {
    /// Acknowledges every peer without waiting for theirs: host regions outlive every reader
    /// on their own (threads share them reference-counted; a peer process keeps its mapping of
    /// a `/dev/shm` object valid after the owner unmaps it), so dropping a whole group in one
    /// thread, one handle after another, must not wait on handles not yet dropped.
    /// [`Collective::close`] is the collective, waiting form.
    fn drop(&mut self) {
        if !self.owner.is_current() {
            return; // a forked child acknowledges nothing on the parent's behalf
        }
        if !self.closed.swap(true, Ordering::AcqRel) {
            if let Some(e) = &self.engine {
                e.acknowledge();
            }
        }
    }
}
