//! [`Config`]: the one configuration of every platform's constructor.
use crate::Routing;
use collective_core::Error;
use detcoll_protocol::{DEFAULT_LL_CAPACITY, Timeouts};

/// Staging bytes per rank when [`Config::with_capacity`] is not called: 16 MiB (two frames of
/// it per rank, see [`Config::capacity`]).
pub const DEFAULT_CAPACITY: usize = 16 << 20;

/// Which GPU a rank of `nvidia::from_bootstrap` / `rocm::from_bootstrap` runs on (features
/// `cuda` / `rocm`: plain names, so the docs of any feature set have no broken link).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DeviceSelect {
    /// `LOCAL_RANK % device count` (torchrun's convention; the default).
    #[default]
    LocalRank,
    /// This device ordinal.
    Ordinal(usize),
}

/// How a collective is built, on every platform. Every rank passes the same values (checked
/// by the agreement; a disagreement is `ConfigMismatch` on every rank).
///
/// ```
/// use collective_factory::{Config, DeviceSelect};
/// use std::time::Duration;
/// let config = Config::new()
///     .with_capacity(4 << 20)
///     .with_timeout(Duration::from_secs(30))
///     .with_device(DeviceSelect::Ordinal(0));
/// assert_eq!(config.capacity(), 4 << 20);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    capacity: usize,
    ll_capacity: usize,
    routing: Option<Routing>,
    timeouts: Option<Timeouts>,
    device: DeviceSelect,
    max_blocks: Option<usize>,
    lockstep: Option<bool>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            capacity: DEFAULT_CAPACITY,
            ll_capacity: DEFAULT_LL_CAPACITY,
            routing: None,
            timeouts: None,
            device: DeviceSelect::LocalRank,
            max_blocks: None,
            lockstep: None,
        }
    }
}

impl Config {
    /// The defaults: [`DEFAULT_CAPACITY`], the platform's routing table (or
    /// `DETCOLL_ROUTING_TABLE`), timeouts from `DETCOLL_TIMEOUT_MS` (else 10 s), device
    /// [`DeviceSelect::LocalRank`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Builder: at most `blocks` thread blocks per collective kernel launch on the IPC routes
    /// (default: the GPU's multiprocessors divided by the ranks sharing it). Ranks that are
    /// threads or processes sharing one GPU with other work (GEMMs between their collectives)
    /// may want fewer, so that kernels waiting for a peer leave that peer's compute most of
    /// the GPU. Every rank must pass the same value (the ranks check it). Taken by the GPU
    /// constructors (the CPU twin has no blocks); 1 to 1024, else construction fails with
    /// `InvalidConfig` on every platform ([`Config::validate`]); ranks sharing a GPU need all their kernels resident at once, so keep
    /// `blocks * ranks` at or below its multiprocessors (more shows as `PeerTimeout`, never as
    /// wrong data).
    pub fn with_max_blocks(mut self, blocks: usize) -> Self {
        self.max_blocks = Some(blocks);
        self
    }

    /// The block cap of [`Config::with_max_blocks`], if set.
    pub fn max_blocks(&self) -> Option<usize> {
        self.max_blocks
    }

    /// Builder: whether GPU ranks that are threads sharing one GPU (`thread_group` on a host
    /// with fewer GPUs than ranks) launch each call together — on by default
    /// (`DETCOLL_LOCKSTEP` when this is not called). With it, each such rank's thread may do
    /// any stream work between calls (pageable copies, allocation, frees) without stalling its
    /// peers, but must be the only thread driving that rank. Turn it off only when one thread
    /// drives several ranks of one GPU and orders every enqueue itself
    /// (docs/running.md, "Ranks as threads sharing one GPU").
    pub fn with_lockstep(mut self, on: bool) -> Self {
        self.lockstep = Some(on);
        self
    }

    /// The lockstep choice of [`Config::with_lockstep`], if made.
    pub fn lockstep(&self) -> Option<bool> {
        self.lockstep
    }

    /// Builder: staging bytes per rank. Each rank keeps two frames of it (plus a few KiB of
    /// flags) on its device for the collective's lifetime; the IPC routes run larger calls in
    /// chunks of it, the NCCL/RCCL transport route takes calls of at most `bytes` per rank and,
    /// when built, grows a workspace of at most about `world * capacity` bytes on first use.
    /// Below 128 bytes (`detcoll_protocol::MIN_CAPACITY`) is refused at construction
    /// (`InvalidConfig`, [`Config::validate`]).
    pub fn with_capacity(mut self, bytes: usize) -> Self {
        self.capacity = bytes;
        self
    }

    /// Builder: payload bytes per rank one call may send on the LL push route
    /// (`ipc_push_ll`, default 512 KiB). Each rank keeps `4 * world * ll_capacity` bytes of LL
    /// receive slots — only when the routing table uses that route. Calls routed there that
    /// send more take the one-shot pull route (same bits).
    pub fn with_ll_capacity(mut self, bytes: usize) -> Self {
        self.ll_capacity = bytes;
        self
    }

    /// Builder: a routing table instead of the platform's default (op × size → route).
    pub fn with_routing(mut self, routing: Routing) -> Self {
        self.routing = Some(routing);
        self
    }

    /// Builder: explicit wait bounds (instead of `DETCOLL_TIMEOUT_MS`).
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = Some(timeouts);
        self
    }

    /// Builder: one bound for every wait for a peer and for close.
    pub fn with_timeout(self, timeout: std::time::Duration) -> Self {
        self.with_timeouts(Timeouts { peer: timeout, close: timeout })
    }

    /// Builder: which GPU a process rank runs on.
    pub fn with_device(mut self, device: DeviceSelect) -> Self {
        self.device = device;
        self
    }

    /// Staging bytes per rank.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// LL push payload bytes per rank ([`Config::with_ll_capacity`]).
    pub fn ll_capacity(&self) -> usize {
        self.ll_capacity
    }

    /// The routing table asked for, if any.
    pub fn routing(&self) -> Option<&Routing> {
        self.routing.as_ref()
    }

    /// The wait bounds asked for (`None`: the environment's, read at construction).
    pub fn timeouts(&self) -> Option<Timeouts> {
        self.timeouts
    }

    /// The device selection.
    pub fn device(&self) -> DeviceSelect {
        self.device
    }

    /// What every constructor checks first (the builders take any value): a capacity of at
    /// least `detcoll_protocol::MIN_CAPACITY` (128) bytes, where every call can be chunked, whose
    /// staging area and LL push slots fit the address space; an LL push capacity of at most
    /// `detcoll_protocol::MAX_LL_CAPACITY`; explicit timeouts of more than 0 and at most
    /// `collective_core::MAX_TIMEOUT`; `max_blocks` in 1..=1024. [`Error::InvalidConfig`] naming
    /// the value otherwise. The constructors of
    /// one process per rank report it through the agreement, so every rank fails at once.
    ///
    /// ```
    /// use collective_factory::Config;
    /// assert!(Config::new().validate().is_ok());
    /// assert!(Config::new().with_capacity(0).validate().is_err());
    /// assert!(Config::new().with_capacity(127).validate().is_err());
    /// assert!(Config::new().with_capacity(128).validate().is_ok());
    /// assert!(Config::new().with_capacity(usize::MAX).validate().is_err());
    /// assert!(Config::new().with_timeout(std::time::Duration::ZERO).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), Error> {
        // The IPC backends' floor (every op, dtype and world can chunk through it); the
        // transport has no smaller use for a capacity.
        detcoll_protocol::check_capacity(self.capacity).map_err(|e| Error::InvalidConfig {
            detail: format!("Config::with_capacity({}): {}", self.capacity, e.config_reason()),
        })?;
        // Refused here, not by a constructor after the world was started: a staging area or LL
        // slots that cannot exist (one rank's, one flag slot: the least any world needs) and
        // explicit timeouts out of range (those from the environment are the constructors').
        let named = |what: String| {
            move |e: Error| Error::InvalidConfig {
                detail: match e {
                    Error::InvalidConfig { detail } => format!("{what}: {detail}"),
                    other => format!("{what}: {other}"),
                },
            }
        };
        detcoll_protocol::Layout::with_ll(self.capacity, 1, 1, self.ll_capacity).map_err(named(format!(
            "Config::with_capacity({}), with_ll_capacity({})",
            self.capacity, self.ll_capacity
        )))?;
        if let Some(t) = &self.timeouts {
            t.check().map_err(named("Config::with_timeouts".into()))?;
        }
        // Checked on every platform, the CPU twin's too (which launches no blocks), so a value
        // that a GPU run would refuse is refused where it is written.
        match self.max_blocks {
            Some(b) if !(1..=detcoll_protocol::MAX_BLOCKS).contains(&b) => Err(Error::InvalidConfig {
                detail: format!("Config::with_max_blocks({b}): expected 1..={}", detcoll_protocol::MAX_BLOCKS),
            }),
            _ => Ok(()),
        }
    }

    /// [`Config::validate`], and a world of 1 to `MAX_WORLD_SIZE` ranks (for the constructors that make
    /// every rank of a world: `thread_group`).
    #[cfg_attr(not(any(feature = "cpu", feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn validate_world(&self, world: usize) -> Result<(), Error> {
        if world == 0 {
            return Err(Error::InvalidConfig { detail: "a world of 0 ranks: a group needs at least one rank".into() });
        }
        // Before any thread is spawned: a group above the tree's limit is refused here, not
        // after thousands of ranks were started.
        collective_core::check_world_size(world)?;
        self.validate()
    }
}
