//! Construction-time configuration. Everything that shapes which NCCL calls a rank makes is
//! checked equal on every rank at construction; local bounds (`timeouts`, `init_timeout`,
//! `watchdog`) are not.
use crate::comm::CommOptions;
use collective_core::Error;
use collective_core::Timeouts;
use std::time::Duration;

/// Default payload (bytes per rank, all lanes together) up to which `reduce_scatter_many`
/// packs its lanes into one all_gather. A starting point from the seeds' observation that a
/// larger rank-major all_gather can be slower than per-lane calls; `cargo xtask bench`
/// measures the crossover per platform.
pub const DEFAULT_PACK_THRESHOLD: usize = 256 << 10;

/// `DETCOLL_NCCL_BLOCKING`: NCCL's blocking mode when [`TransportConfig::blocking`] is `None`.
pub const BLOCKING_ENV: &str = "DETCOLL_NCCL_BLOCKING";

/// How a transport collective is built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportConfig {
    /// Most bytes one rank contributes to one reducing call (all_reduce, reduce_scatter,
    /// reduce_scatter_many: all lanes together). Bounds the workspace, which is at most about
    /// `world * capacity` bytes (above 8 ranks, all_reduce adds its multi-pass tree's partials,
    /// about `world / 7 * capacity`). all_gather writes straight into the caller's output and
    /// is not bounded by it. Default: unbounded (the workspace grows to what calls need).
    pub capacity: usize,
    /// `reduce_scatter_many` packs its lanes into one all_gather when their payload is at most
    /// this many bytes; above, one all_gather per lane (in one NCCL group).
    pub pack_threshold: usize,
    /// `reduce_scatter` with at least this many input bytes per rank exchanges only the
    /// shards each rank reduces (grouped send/recv, `world` times less traffic) instead of a
    /// rank-ordered all_gather of whole inputs. Same bits either way. Default: never
    /// (`usize::MAX`) until measured.
    pub all_to_all_threshold: usize,
    /// `peer`: bound on any NCCL call staying in progress and the default of
    /// [`crate::TransportCollective::synchronize`]; `close`: bound on close. `None`:
    /// `DETCOLL_TIMEOUT_MS` when set, else [`Timeouts::default`], read at construction.
    pub timeouts: Option<Timeouts>,
    /// Bound on communicator creation (every rank must join within it).
    pub init_timeout: Duration,
    /// NCCL's blocking mode: unbounded waits inside NCCL. `None`: `DETCOLL_NCCL_BLOCKING`
    /// (`1`/`0`, read at construction; any other value is `InvalidConfig`), else off. Non-blocking calls return `ncclInProgress`
    /// and are polled to completion; measured on 2 H200s that costs tens of microseconds per
    /// call at small sizes, so latency-bound users may prefer blocking mode.
    pub blocking: Option<bool>,
    /// An explicit library file, instead of the vendor search (and `$DETCOLL_NCCL_LIBRARY`).
    pub library: Option<String>,
    /// The built-in watchdog: bounds every transport call's device time, also when the caller
    /// waits with its own stream synchronisation (where NCCL's kernels would otherwise wait
    /// forever for a peer that died or made another call). Counted from when the call started
    /// on the device; past the bound the communicator is aborted (its kernels stop) and the
    /// collective poisoned. `None`: `DETCOLL_TRANSPORT_WATCHDOG` when set (read at
    /// construction; an invalid value is `InvalidConfig`), else [`Watchdog::PeerTimeout`]. Local:
    /// not agreed between ranks (it does not change which NCCL calls a rank makes).
    pub watchdog: Option<Watchdog>,
}

/// The transport watchdog's bound (see [`TransportConfig::watchdog`] and [`crate::watchdog`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Watchdog {
    /// No watchdog: no thread, no events, nothing per call. Then only the waits inside the
    /// transport's own calls and [`crate::TransportCollective::synchronize`] are bounded.
    Off,
    /// Bounded by `timeouts.peer` as configured at construction (also after
    /// [`TransportConfig::with_timeouts`]): the bound the IPC routes put on their device waits.
    #[default]
    PeerTimeout,
    /// An explicit bound (positive).
    After(Duration),
}

impl Watchdog {
    /// The environment variable read by [`Watchdog::from_env`].
    pub const ENV: &'static str = "DETCOLL_TRANSPORT_WATCHDOG";

    /// `$DETCOLL_TRANSPORT_WATCHDOG`: `0` turns the watchdog off, a positive number of seconds
    /// (at least a microsecond, at most a day) sets the bound; unset keeps the default
    /// ([`Watchdog::PeerTimeout`]). Anything else is `InvalidConfig` naming the variable: a
    /// malformed value neither turns the watchdog off nor is silently ignored.
    pub fn from_env() -> Result<Self, Error> {
        Self::parse(collective_core::env::var(Self::ENV)?.as_deref())
    }

    fn parse(value: Option<&str>) -> Result<Self, Error> {
        let Some(raw) = value else { return Ok(Watchdog::PeerTimeout) };
        let bad = || collective_core::env::invalid(Self::ENV, raw, "0 (off) or seconds in 0.000001..=86400");
        match raw.trim().parse::<f64>() {
            Ok(0.0) => Ok(Watchdog::Off),
            Ok(s) if (1e-6..=86_400.0).contains(&s) => {
                Duration::try_from_secs_f64(s).map(Watchdog::After).map_err(|_| bad())
            }
            _ => Err(bad()),
        }
    }

    /// The bound under `timeouts`; `None` when off.
    pub fn bound(self, timeouts: &Timeouts) -> Option<Duration> {
        match self {
            Watchdog::Off => None,
            Watchdog::PeerTimeout => Some(timeouts.peer),
            Watchdog::After(d) => Some(d),
        }
    }
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            capacity: usize::MAX,
            pack_threshold: DEFAULT_PACK_THRESHOLD,
            all_to_all_threshold: usize::MAX,
            timeouts: None,
            init_timeout: Duration::from_secs(120),
            blocking: None,
            library: None,
            watchdog: None,
        }
    }
}

impl TransportConfig {
    /// Defaults with `capacity` bytes per rank per reducing call.
    pub fn new(capacity: usize) -> Self {
        TransportConfig { capacity, ..Self::default() }
    }

    /// Builder: the packing crossover of `reduce_scatter_many`.
    pub fn with_pack_threshold(mut self, bytes: usize) -> Self {
        self.pack_threshold = bytes;
        self
    }

    /// Builder: the all-to-all crossover of `reduce_scatter`.
    pub fn with_all_to_all_threshold(mut self, bytes: usize) -> Self {
        self.all_to_all_threshold = bytes;
        self
    }

    /// Builder: wait bounds. The default watchdog ([`Watchdog::PeerTimeout`]) follows
    /// `timeouts.peer`.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = Some(timeouts);
        self
    }

    /// Builder: an explicit library file.
    pub fn with_library(mut self, path: impl Into<String>) -> Self {
        self.library = Some(path.into());
        self
    }

    /// Builder: the watchdog (`Watchdog::Off` disables it).
    pub fn with_watchdog(mut self, watchdog: Watchdog) -> Self {
        self.watchdog = Some(watchdog);
        self
    }

    /// Builder: NCCL's blocking mode on or off (instead of `DETCOLL_NCCL_BLOCKING`).
    pub fn with_blocking(mut self, blocking: bool) -> Self {
        self.blocking = Some(blocking);
        self
    }

    /// This configuration with every `None` replaced by its environment variable or default,
    /// checked. Construction works on the resolved configuration only.
    pub fn resolved(&self) -> Result<TransportConfig, Error> {
        let mut c = self.clone();
        c.timeouts = Some(Timeouts::resolve(self.timeouts)?);
        if c.blocking.is_none() {
            c.blocking =
                Some(collective_core::env::read(BLOCKING_ENV, collective_core::env::parse_bool)?.unwrap_or(false));
        }
        if c.watchdog.is_none() {
            c.watchdog = Some(Watchdog::from_env()?);
        }
        c.check()?;
        Ok(c)
    }

    /// The wait bounds (after [`TransportConfig::resolved`]; the defaults before).
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts.unwrap_or_default()
    }

    /// The watchdog's bound, `None` when off.
    pub fn watchdog_bound(&self) -> Option<Duration> {
        self.watchdog.unwrap_or_default().bound(&self.timeouts())
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        if let Some(t) = self.timeouts {
            t.check()?;
        }
        if self.init_timeout.is_zero() {
            return Err(Error::InvalidConfig { detail: "init_timeout must be positive".into() });
        }
        if self.watchdog == Some(Watchdog::After(Duration::ZERO)) {
            return Err(Error::InvalidConfig {
                detail: "the watchdog's bound must be positive (Watchdog::Off turns it off)".into(),
            });
        }
        Ok(())
    }

    /// What every rank must share (resolved from the environment), `name=value`: for a composer
    /// whose own agreement compares it before building the transport with
    /// [`crate::TransportCollective::with_agreed_device`].
    pub fn agreement(&self) -> Result<Vec<String>, Error> {
        Ok(self.resolved()?.agreement_words().into_iter().map(|(n, v)| format!("{n}={v}")).collect())
    }

    /// Words every rank must share, with their names: what shapes the NCCL calls, and the wait
    /// bounds (so every rank gives up on a dead peer at the same time, as the IPC routes do).
    /// Not `init_timeout` and `watchdog`, which are local.
    pub(crate) fn agreement_words(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("capacity", self.capacity as u64),
            ("pack_threshold", self.pack_threshold as u64),
            ("all_to_all_threshold", self.all_to_all_threshold as u64),
            ("blocking", u64::from(self.blocking.unwrap_or(false))),
            ("timeouts.peer (ns)", self.timeouts().agreement_words()[0]),
            ("timeouts.close (ns)", self.timeouts().agreement_words()[1]),
        ]
    }

    /// The communicator options this configuration implies.
    pub fn comm_options(&self) -> CommOptions {
        CommOptions {
            blocking: self.blocking.unwrap_or(false),
            timeout: self.timeouts().peer,
            init_timeout: self.init_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_env_values() {
        assert_eq!(Watchdog::parse(None).unwrap(), Watchdog::PeerTimeout);
        assert_eq!(Watchdog::parse(Some("0")).unwrap(), Watchdog::Off);
        assert_eq!(Watchdog::parse(Some("0.0")).unwrap(), Watchdog::Off);
        assert_eq!(Watchdog::parse(Some("30")).unwrap(), Watchdog::After(Duration::from_secs(30)));
        assert_eq!(Watchdog::parse(Some(" 0.25 ")).unwrap(), Watchdog::After(Duration::from_millis(250)));
        for bad in ["", "off", "-1", "NaN", "inf", "1e400", "1e-10", "86401"] {
            match Watchdog::parse(Some(bad)) {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(Watchdog::ENV), "{detail}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_default_watchdog_follows_the_peer_timeout() {
        let t = Timeouts { peer: Duration::from_secs(3), close: Duration::from_secs(1) };
        let c = TransportConfig::new(1 << 20).with_watchdog(Watchdog::PeerTimeout).with_timeouts(t);
        assert_eq!(c.watchdog_bound(), Some(Duration::from_secs(3)));
        let c = c.with_watchdog(Watchdog::After(Duration::from_millis(40)));
        assert_eq!(c.watchdog_bound(), Some(Duration::from_millis(40)));
        assert_eq!(c.clone().with_watchdog(Watchdog::Off).watchdog_bound(), None);
        assert!(c.check().is_ok());
        assert!(c.with_watchdog(Watchdog::After(Duration::ZERO)).check().is_err());
    }
}
