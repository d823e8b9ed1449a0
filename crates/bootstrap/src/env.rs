//! Parsing of the torchrun launcher variables, with typed errors.
//!
//! | variable | meaning | required |
//! | --- | --- | --- |
//! | `RANK` | global rank, `0..WORLD_SIZE` | yes |
//! | `WORLD_SIZE` | number of ranks, `>= 1` | yes |
//! | `LOCAL_RANK` | index among the ranks on this host | yes |
//! | `LOCAL_WORLD_SIZE` | number of ranks on this host, `1..=WORLD_SIZE` | yes |
//! | `MASTER_ADDR` | host (name or IP) where rank 0 serves the rendezvous | yes |
//! | `MASTER_PORT` | its TCP port, `1..=65535` | yes |
//! | `DETCOLL_BOOTSTRAP_TIMEOUT_MS` | when set, both the connect timeout and the per-exchange timeout, in milliseconds (`1..=86400000`, at most [`MAX_BOOTSTRAP_TIMEOUT`]) | no (defaults: connect 60 000 ms, exchange 30 000 ms) |
//! | `DETCOLL_JOB_TOKEN` | the job's identity, 1 to 256 bytes of UTF-8, the same for every rank: rank 0 admits only ranks that prove it (the token itself is never sent) | no (`detcoll-run` and `cargo xtask bench` set a random one) |
//! | `TORCHELASTIC_RUN_ID` | set by torchrun; without `DETCOLL_JOB_TOKEN` the token is derived from it and `MASTER_PORT` | no |
//!
//! Without `DETCOLL_JOB_TOKEN` the token is derived from public facts: `TORCHELASTIC_RUN_ID`
//! and `MASTER_PORT` under torchrun, else `MASTER_ADDR` and `MASTER_PORT`. A derived token only
//! keeps apart jobs that differ in those facts (e.g. two torchrun jobs that picked the same
//! port); it is no secret. On a network shared with untrusted users, give every rank a secret
//! `DETCOLL_JOB_TOKEN`.
//!
//! A value that is not valid UTF-8 is [`BootstrapError::BadEnv`] naming the variable: never
//! converted lossily, so two job tokens (or run ids) that differ only in bytes that are not
//! UTF-8 cannot become the same token.
//!
//! The parser takes a lookup closure so it can be tested without touching the process
//! environment; [`TorchrunEnv::from_env`] reads the process environment.

use std::time::Duration;

use crate::deadline::MAX_BOOTSTRAP_TIMEOUT;
use crate::tcp::{TcpBootstrap, TcpConfig};
use crate::token;
use crate::{BootstrapError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_EXCHANGE_TIMEOUT};

/// `RANK`
pub const RANK: &str = "RANK";
/// `WORLD_SIZE`
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// `LOCAL_RANK`
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// `LOCAL_WORLD_SIZE`
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// `MASTER_ADDR`
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// `MASTER_PORT`
pub const MASTER_PORT: &str = "MASTER_PORT";
/// `DETCOLL_BOOTSTRAP_TIMEOUT_MS`: overrides both bootstrap timeouts.
pub const TIMEOUT_MS: &str = "DETCOLL_BOOTSTRAP_TIMEOUT_MS";
/// `DETCOLL_JOB_TOKEN`: the job identity ranks prove to rank 0.
pub const JOB_TOKEN: &str = "DETCOLL_JOB_TOKEN";
/// `TORCHELASTIC_RUN_ID`: torchrun's run id (a job token is derived from it when
/// `DETCOLL_JOB_TOKEN` is unset).
pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";

/// The launcher variables of one rank, validated. (`Debug` does not show the job token.)
#[derive(Clone, PartialEq, Eq)]
pub struct TorchrunEnv {
    /// `RANK`
    pub rank: usize,
    /// `WORLD_SIZE`
    pub world_size: usize,
    /// `LOCAL_RANK`
    pub local_rank: usize,
    /// `LOCAL_WORLD_SIZE`
    pub local_world_size: usize,
    /// `MASTER_ADDR`
    pub master_addr: String,
    /// `MASTER_PORT`
    pub master_port: u16,
    /// `DETCOLL_BOOTSTRAP_TIMEOUT_MS`, if set.
    pub timeout: Option<Duration>,
    /// `DETCOLL_JOB_TOKEN` if set, else a token derived from `TORCHELASTIC_RUN_ID` and
    /// `MASTER_PORT` if torchrun set the former, else `None` ([`TcpConfig`] then derives one from
    /// `MASTER_ADDR` and `MASTER_PORT`).
    pub job_token: Option<String>,
}

impl std::fmt::Debug for TorchrunEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchrunEnv")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .field("master_addr", &self.master_addr)
            .field("master_port", &self.master_port)
            .field("timeout", &self.timeout)
            .field("job_token", &self.job_token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl TorchrunEnv {
    /// Reads the process environment. A variable whose value is not valid UTF-8 is
    /// [`BootstrapError::BadEnv`] naming it (a job token's value is not shown).
    pub fn from_env() -> Result<Self, BootstrapError> {
        const VARS: [&str; 9] = [
            RANK,
            WORLD_SIZE,
            LOCAL_RANK,
            LOCAL_WORLD_SIZE,
            MASTER_ADDR,
            MASTER_PORT,
            TIMEOUT_MS,
            JOB_TOKEN,
            TORCHELASTIC_RUN_ID,
        ];
        let mut values: Vec<(&str, String)> = Vec::with_capacity(VARS.len());
        for var in VARS {
            match std::env::var_os(var).map(std::ffi::OsString::into_string) {
                None => {}
                Some(Ok(v)) => values.push((var, v)),
                Some(Err(raw)) => return Err(not_utf8(var, &raw)),
            }
        }
        Self::from_lookup(|var| values.iter().find(|(name, _)| *name == var).map(|(_, v)| v.clone()))
    }

    /// Reads the variables through `lookup` (`None` = unset). Pure: use this in tests.
    pub fn from_lookup<F>(mut lookup: F) -> Result<Self, BootstrapError>
    where
        F: FnMut(&str) -> Option<String>,
    {
        let mut get = |var: &'static str| -> Result<String, BootstrapError> {
            lookup(var).ok_or(BootstrapError::MissingEnv { var })
        };
        let rank_s = get(RANK)?;
        let world_s = get(WORLD_SIZE)?;
        let local_rank_s = get(LOCAL_RANK)?;
        let local_world_s = get(LOCAL_WORLD_SIZE)?;
        let addr_s = get(MASTER_ADDR)?;
        let port_s = get(MASTER_PORT)?;
        let timeout_s = lookup(TIMEOUT_MS);
        let token_s = lookup(JOB_TOKEN);
        let run_id = lookup(TORCHELASTIC_RUN_ID);

        let world_size = parse_usize(WORLD_SIZE, &world_s, 1, "an integer >= 1")?;
        let rank = parse_usize(RANK, &rank_s, 0, "a non-negative integer below WORLD_SIZE")?;
        if rank >= world_size {
            return Err(BootstrapError::RankOutOfRange { rank, world: world_size });
        }
        let local_world_size = parse_usize(LOCAL_WORLD_SIZE, &local_world_s, 1, "an integer in 1..=WORLD_SIZE")?;
        if local_world_size > world_size {
            return Err(bad(LOCAL_WORLD_SIZE, &local_world_s, "an integer in 1..=WORLD_SIZE"));
        }
        let local_rank = parse_usize(LOCAL_RANK, &local_rank_s, 0, "a non-negative integer below LOCAL_WORLD_SIZE")?;
        if local_rank >= local_world_size {
            return Err(bad(LOCAL_RANK, &local_rank_s, "a non-negative integer below LOCAL_WORLD_SIZE"));
        }
        let master_addr = addr_s.trim().to_owned();
        if master_addr.is_empty() {
            return Err(bad(MASTER_ADDR, &addr_s, "a host name or IP address"));
        }
        let master_port = match port_s.trim().parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(bad(MASTER_PORT, &port_s, "a TCP port in 1..=65535")),
        };
        let timeout = parse_timeout(timeout_s)?;
        let job_token = match (token_s, run_id) {
            (Some(t), _) => {
                if token::check_token(&t).is_err() {
                    // The value is a secret: the error shows its length only.
                    let shown = format!("<{} bytes, not shown>", t.len());
                    return Err(bad(JOB_TOKEN, &shown, "a token of 1 to 256 bytes, the same for every rank"));
                }
                Some(t)
            }
            (None, Some(id)) if !id.is_empty() => {
                Some(token::derive_token("torchelastic", &[&id, &master_port.to_string()]))
            }
            (None, _) => None,
        };
        Ok(Self { rank, world_size, local_rank, local_world_size, master_addr, master_port, timeout, job_token })
    }

    /// The TCP bootstrap configuration: `timeout` (when set) for both timeouts, otherwise
    /// [`DEFAULT_CONNECT_TIMEOUT`] and [`DEFAULT_EXCHANGE_TIMEOUT`].
    pub fn tcp_config(&self) -> TcpConfig {
        TcpConfig {
            rank: self.rank,
            world_size: self.world_size,
            local_rank: self.local_rank,
            local_world_size: self.local_world_size,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            connect_timeout: self.timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            exchange_timeout: self.timeout.unwrap_or(DEFAULT_EXCHANGE_TIMEOUT),
            job_token: self.job_token.clone(),
        }
    }
}

impl TcpBootstrap {
    /// From the torchrun variables `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
    /// `MASTER_ADDR`, `MASTER_PORT` (see [`TorchrunEnv`]). `DETCOLL_BOOTSTRAP_TIMEOUT_MS`, when
    /// set, is used for both the connect and the per-exchange timeout; defaults are 60 000 ms to
    /// connect and 30 000 ms per exchange.
    ///
    /// ```no_run
    /// use detcoll_bootstrap::{Bootstrap, TcpBootstrap};
    /// // Under torchrun, mpirun wrappers or `detcoll-run --nproc 2 -- ...`:
    /// let boot = TcpBootstrap::from_env().expect("rendezvous");
    /// let all = boot.all_gather_bytes(&[boot.rank() as u8]).expect("exchange");
    /// assert_eq!(all.len(), boot.world_size());
    /// ```
    pub fn from_env() -> Result<Self, BootstrapError> {
        Self::new(TorchrunEnv::from_env()?.tcp_config())
    }
}

/// [`TorchrunEnv::from_lookup`] followed by [`TorchrunEnv::tcp_config`].
pub fn tcp_config_from_lookup<F>(lookup: F) -> Result<TcpConfig, BootstrapError>
where
    F: FnMut(&str) -> Option<String>,
{
    TorchrunEnv::from_lookup(lookup).map(|e| e.tcp_config())
}

/// `DETCOLL_BOOTSTRAP_TIMEOUT_MS` of this process: `None` when unset; a value that is not
/// an integer in `1..=86400000` is [`BootstrapError::BadEnv`]. The factory's thread groups take
/// it as their exchange timeout (as processes do through [`TorchrunEnv`]).
pub fn timeout_from_env() -> Result<Option<Duration>, BootstrapError> {
    match std::env::var_os(TIMEOUT_MS).map(std::ffi::OsString::into_string) {
        None => Ok(None),
        Some(Ok(v)) => parse_timeout(Some(v)),
        Some(Err(raw)) => Err(not_utf8(TIMEOUT_MS, &raw)),
    }
}

/// A `DETCOLL_BOOTSTRAP_TIMEOUT_MS` value (`None`: unset).
fn parse_timeout(value: Option<String>) -> Result<Option<Duration>, BootstrapError> {
    match value {
        None => Ok(None),
        Some(s) => match s.trim().parse::<u64>() {
            Ok(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Ok(Some(Duration::from_millis(ms))),
            _ => Err(bad(TIMEOUT_MS, &s, "a timeout in milliseconds, an integer in 1..=86400000 (one day)")),
        },
    }
}

/// [`MAX_BOOTSTRAP_TIMEOUT`] in milliseconds (the message above spells it out).
const MAX_TIMEOUT_MS: u64 = MAX_BOOTSTRAP_TIMEOUT.as_millis() as u64;
const _: () = assert!(MAX_TIMEOUT_MS == 86_400_000);

/// The error for a variable whose value is not valid UTF-8. A job token is a secret: only its
/// length is shown.
fn not_utf8(var: &'static str, raw: &std::ffi::OsStr) -> BootstrapError {
    if var == JOB_TOKEN {
        let shown = format!("<{} bytes, not UTF-8, not shown>", raw.len());
        return bad(JOB_TOKEN, &shown, "a token of 1 to 256 bytes of valid UTF-8, the same for every rank");
    }
    bad(var, &raw.to_string_lossy(), "valid UTF-8")
}

fn bad(var: &'static str, value: &str, expected: &'static str) -> BootstrapError {
    BootstrapError::BadEnv { var, value: value.to_owned(), expected }
}

fn parse_usize(var: &'static str, value: &str, min: usize, expected: &'static str) -> Result<usize, BootstrapError> {
    match value.trim().parse::<usize>() {
        Ok(v) if v >= min => Ok(v),
        _ => Err(bad(var, value, expected)),
    }
}
