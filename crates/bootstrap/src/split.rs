//! Groups inside a job: [`split`] turns one bootstrap (the whole job) into one bootstrap per
//! group, in the manner of `ncclCommSplit` / `torch.distributed.new_group`, so an engine can
//! run its tensor-, data-, context- and pipeline-parallel collectives side by side.
//!
//! `split` is a collective of the parent built only from its [`Bootstrap::all_gather_bytes`],
//! so it works on any bootstrap (TCP, local threads, an engine's own):
//!
//! 1. Every rank contributes its color, key, host identity and a random id of its process.
//!    Ranks with the same color form a group ordered by (key, parent rank) ([`group_members`]).
//! 2. The first member of each group of two or more sets up the group's own transport and
//!    publishes how to join it in a second parent exchange:
//!    * every member in this process ([`GroupTransport::Auto`]): a new [`LocalBootstrap`]
//!      group, handed to the members through a process-wide registry;
//!    * otherwise: a TCP rendezvous of the group's own, on an ephemeral port, with a fresh
//!      random job token (it travels over the parent's channel, which only admits the job).
//!      On one host the leader listens on loopback; a group spanning hosts listens where
//!      [`Bootstrap::reachable_host`] of the parent says.
//!
//! After `split` returns, a group shares nothing with the parent or with other groups: its
//! exchanges never wait for theirs, and a member that dies fails only its group (within the
//! group's bounds); the parent and the other groups keep working.

use std::collections::HashMap;
use std::fmt;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::deadline::{MAX_BOOTSTRAP_TIMEOUT, check_timeout, deadline};
use crate::local::LocalBootstrap;
use crate::tcp::{TcpBootstrap, TcpConfig, bind_listener};
use crate::token::{self, DIGEST_LEN};
use crate::{Bootstrap, BootstrapError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_EXCHANGE_TIMEOUT, host};

const HELLO_MAGIC: &[u8; 8] = b"DCSPLIT1";
const ROUTE_NONE: u8 = 0;
const ROUTE_LOCAL: u8 = 1;
const ROUTE_TCP: u8 = 2;
const ROUTE_ERROR: u8 = 3;

/// One rank's contribution to the grouping: `color` `None` = in no group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitEntry {
    /// Ranks with the same color form a group; `None` joins none (`NCCL_SPLIT_NOCOLOR`).
    pub color: Option<u32>,
    /// Order within the group (ties: parent rank).
    pub key: u32,
}

/// The group of parent rank `me`: its members' parent ranks in group-rank order (by key, then
/// parent rank), or `None` when `me` has no color. `entries[r]` is parent rank `r`'s
/// contribution. Pure: every rank computes the same groups from the same entries.
pub fn group_members(entries: &[SplitEntry], me: usize) -> Result<Option<Vec<usize>>, BootstrapError> {
    if entries.is_empty() {
        return Err(BootstrapError::InvalidConfig { detail: "split of an empty group".into() });
    }
    let Some(mine) = entries.get(me) else {
        return Err(BootstrapError::RankOutOfRange { rank: me, world: entries.len() });
    };
    let Some(color) = mine.color else { return Ok(None) };
    let mut members: Vec<usize> = (0..entries.len()).filter(|&r| entries[r].color == Some(color)).collect();
    members.sort_by_key(|&r| (entries[r].key, r));
    Ok(Some(members))
}

/// How a group's members talk to each other after [`split_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupTransport {
    /// In-process ([`LocalBootstrap`]) when every member runs in this process, else TCP.
    #[default]
    Auto,
    /// Always TCP for a group of two or more (tests; or threads that must look like processes).
    /// A group of one exchanges with nobody: it is in-process whatever the option
    /// ([`SubBootstrap::is_tcp`] says false).
    Tcp,
}

/// Options of [`split_with`]. Unset timeouts are the parent's ([`Bootstrap::timeouts`], capped at
/// [`MAX_BOOTSTRAP_TIMEOUT`]), or [`DEFAULT_CONNECT_TIMEOUT`] / [`DEFAULT_EXCHANGE_TIMEOUT`] when
/// it has none. A timeout set here must be more than zero and at most [`MAX_BOOTSTRAP_TIMEOUT`]
/// (one day): any other is [`BootstrapError::InvalidConfig`] before anything is exchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitOptions {
    /// The group's transport.
    pub transport: GroupTransport,
    /// How long the group's TCP rendezvous waits for its members.
    pub connect_timeout: Option<Duration>,
    /// How long one exchange of the group waits for every member.
    pub exchange_timeout: Option<Duration>,
}

enum Transport {
    Local(LocalBootstrap),
    Tcp(TcpBootstrap),
}

/// One rank's bootstrap of a group made by [`split`]. Rank and world size are the position
/// and size in the group; `local_rank`/`local_world_size` count the group's members on this
/// host (by [`host_identity`](crate::host::host_identity)), in group order.
pub struct SubBootstrap {
    rank: usize,
    world: usize,
    local_rank: usize,
    local_world: usize,
    color: u32,
    members: Vec<usize>,
    timeouts: (Duration, Duration),
    transport: Transport,
}

impl fmt::Debug for SubBootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubBootstrap")
            .field("color", &self.color)
            .field("rank", &self.rank)
            .field("world_size", &self.world)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world)
            .field("members", &self.members)
            .field(
                "transport",
                &match self.transport {
                    Transport::Local(_) => "local",
                    Transport::Tcp(_) => "tcp",
                },
            )
            .finish()
    }
}

impl SubBootstrap {
    /// The color this group was formed with.
    pub fn color(&self) -> u32 {
        self.color
    }
    /// The members' ranks in the parent, in group-rank order.
    pub fn parent_ranks(&self) -> &[usize] {
        &self.members
    }
    /// Whether the group runs over TCP (else in-process).
    pub fn is_tcp(&self) -> bool {
        matches!(self.transport, Transport::Tcp(_))
    }
}

impl Bootstrap for SubBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_world_size(&self) -> usize {
        self.local_world
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        match &self.transport {
            Transport::Local(b) => b.all_gather_bytes(mine),
            Transport::Tcp(b) => b.all_gather_bytes(mine),
        }
    }
    fn timeouts(&self) -> Option<(Duration, Duration)> {
        Some(self.timeouts)
    }
    fn reachable_host(&self) -> Option<String> {
        match &self.transport {
            Transport::Local(_) => None,
            Transport::Tcp(b) => b.reachable_host(),
        }
    }
}

/// Splits `parent` into groups: ranks passing the same `color` form one, ordered by `key`
/// (ties: parent rank); `None` joins no group and returns `Ok(None)`. Collective: every rank of
/// `parent` must call it (the same number of times, in the same order as its other collective
/// calls on `parent`), one split at a time per parent. Uses [`SplitOptions::default`]; see
/// [`split_with`].
///
/// The ranks' contributions carry their color and key only, so nothing tells one split from
/// another: a rank that skips a split, makes an extra one, or splits one parent from two
/// threads at once (each rank's threads then pair with the peers' in whatever order they reach
/// the parent) forms groups from the colors of another split, without an error, as
/// `ncclCommSplit` and `torch.distributed.new_group` do. Where such a split meets an exchange
/// on a peer that is not a split, it fails with [`BootstrapError::Protocol`] naming that peer as
/// out of step. Make the splits from one thread, in one order on every rank, then use the
/// groups from as many threads as you like.
///
/// Tensor- and data-parallel groups of 8 thread ranks (TP = 4):
///
/// ```
/// use detcoll_bootstrap::{Bootstrap, LocalBootstrap, split};
///
/// let ranks = LocalBootstrap::group(8);
/// std::thread::scope(|s| {
///     for parent in &ranks {
///         s.spawn(move || {
///             let r = parent.rank() as u32;
///             let tp = split(parent, Some(r / 4), r).unwrap().unwrap();
///             let dp = split(parent, Some(r % 4), r).unwrap().unwrap();
///             assert_eq!((tp.rank(), tp.world_size()), (r as usize % 4, 4));
///             assert_eq!((dp.rank(), dp.world_size()), (r as usize / 4, 2));
///             // The groups are independent: use them from different threads at once.
///             std::thread::scope(|s| {
///                 let t = s.spawn(|| tp.all_gather_bytes(&[r as u8]).unwrap());
///                 let got = dp.all_gather_bytes(&[r as u8]).unwrap();
///                 assert_eq!(got, vec![vec![(r % 4) as u8], vec![(r % 4 + 4) as u8]]);
///                 assert_eq!(t.join().unwrap().len(), 4);
///             });
///         });
///     }
/// });
/// ```
pub fn split<B: Bootstrap + ?Sized>(
    parent: &B,
    color: Option<u32>,
    key: u32,
) -> Result<Option<SubBootstrap>, BootstrapError> {
    split_with(parent, color, key, &SplitOptions::default())
}

/// [`split`] with options (transport, timeouts). Every rank should pass the same options.
pub fn split_with<B: Bootstrap + ?Sized>(
    parent: &B,
    color: Option<u32>,
    key: u32,
    opts: &SplitOptions,
) -> Result<Option<SubBootstrap>, BootstrapError> {
    let (me, world) = (parent.rank(), parent.world_size());
    let (parent_connect, parent_exchange) =
        parent.timeouts().unwrap_or((DEFAULT_CONNECT_TIMEOUT, DEFAULT_EXCHANGE_TIMEOUT));
    // The parent's own bounds are its business: a longer one is capped for the group. Bounds
    // chosen for the split must be usable as given.
    let cap = |d: Duration| d.min(MAX_BOOTSTRAP_TIMEOUT);
    let timeouts =
        (opts.connect_timeout.unwrap_or(cap(parent_connect)), opts.exchange_timeout.unwrap_or(cap(parent_exchange)));
    // Every rank passes the same options, so every rank returns here: nobody is left waiting.
    check_timeout("split connect_timeout", timeouts.0)?;
    check_timeout("split exchange_timeout", timeouts.1)?;

    // Round 1: colors, keys, hosts, processes. A rank whose host identity is invalid still
    // contributes (with the reason), so every rank fails alike instead of timing out.
    let host = host::identity();
    let hello = encode_hello(&Hello { entry: SplitEntry { color, key }, process: *process_id(), host });
    let gathered = parent.all_gather_bytes(&hello)?;
    if gathered.len() != world {
        return Err(BootstrapError::Protocol(format!(
            "split: the parent returned {} contributions for world size {world}",
            gathered.len()
        )));
    }
    let mut hellos = Vec::with_capacity(world);
    for (r, bytes) in gathered.iter().enumerate() {
        let h = decode_hello(bytes).map_err(|m| {
            BootstrapError::Protocol(format!(
                "split: rank {r} made another call on the parent than this split ({m}): the ranks are out of step \
                     (every rank must make the same splits and exchanges on a parent, in the same order, one at a \
                     time)"
            ))
        })?;
        hellos.push(h);
    }
    let hosts: Vec<&str> = hellos
        .iter()
        .enumerate()
        .map(|(r, h)| h.host.as_deref().map_err(|e| BootstrapError::GroupSetup { rank: r, detail: e.clone() }))
        .collect::<Result<_, _>>()?;
    let entries: Vec<SplitEntry> = hellos.iter().map(|h| h.entry).collect();
    let members = group_members(&entries, me)?;

    // Round 2: each group's first member publishes how to join the group.
    let plan = members.as_ref().map(|m| Plan::new(m, me, &hellos, &hosts, opts.transport));
    let mut setup: Option<Setup> = None;
    let route = match &plan {
        Some(p) if p.rank == 0 && p.world > 1 => match Setup::prepare(p, parent, timeouts) {
            Ok(s) => {
                let route = s.route();
                setup = Some(s);
                route
            }
            Err(detail) => Route::Error(detail),
        },
        _ => Route::None,
    };
    let routes = parent.all_gather_bytes(&encode_route(&route))?;
    let (Some(members), Some(plan)) = (members, plan) else { return Ok(None) };
    let leader = members[0];
    if let Route::Error(detail) = route {
        return Err(BootstrapError::GroupSetup { rank: leader, detail });
    }
    let leader_route =
        routes.get(leader).map(|b| decode_route(b)).transpose().map_err(|m| {
            BootstrapError::Protocol(format!("split: rank {leader} sent a malformed group address: {m}"))
        })?;
    let transport = match (plan.world, setup, leader_route) {
        (1, _, _) => Transport::Local(LocalBootstrap::group_with_timeout(1, timeouts.1).remove(0)),
        (_, Some(Setup::Tcp { cfg, listener }), _) => Transport::Tcp(TcpBootstrap::with_listener(cfg, listener)?),
        (_, _, Some(Route::Local { id })) => Transport::Local(registry_take(id, plan.rank).ok_or_else(|| {
            BootstrapError::GroupSetup { rank: leader, detail: format!("in-process group #{id} is gone (expired?)") }
        })?),
        (_, _, Some(Route::Tcp { host, port, token })) => {
            let cfg = plan.tcp_config(host, port, token, timeouts);
            Transport::Tcp(TcpBootstrap::new(cfg)?)
        }
        (_, _, Some(Route::Error(detail))) => return Err(BootstrapError::GroupSetup { rank: leader, detail }),
        (_, _, _) => {
            return Err(BootstrapError::Protocol(format!("split: rank {leader} published no address for its group")));
        }
    };
    Ok(Some(SubBootstrap {
        rank: plan.rank,
        world: plan.world,
        local_rank: plan.local_rank,
        local_world: plan.local_world,
        color: color.unwrap_or_default(),
        members,
        timeouts,
        transport,
    }))
}

/// This rank's place in its group, computed alike by every member.
struct Plan {
    rank: usize,
    world: usize,
    local_rank: usize,
    local_world: usize,
    /// Every member runs in this process.
    in_process: bool,
    /// Every member runs on this host.
    one_host: bool,
}

impl Plan {
    fn new(members: &[usize], me: usize, hellos: &[Hello], hosts: &[&str], transport: GroupTransport) -> Self {
        let rank = members.iter().position(|&r| r == me).unwrap_or_default();
        let same_host = |r: usize| hosts[r] == hosts[me];
        Plan {
            rank,
            world: members.len(),
            local_rank: members[..rank].iter().filter(|&&r| same_host(r)).count(),
            local_world: members.iter().filter(|&&r| same_host(r)).count(),
            in_process: transport == GroupTransport::Auto
                && members.iter().all(|&r| hellos[r].process == hellos[me].process),
            one_host: members.iter().all(|&r| same_host(r)),
        }
    }

    fn tcp_config(&self, host: String, port: u16, token: String, timeouts: (Duration, Duration)) -> TcpConfig {
        let mut cfg = TcpConfig::single_host(self.rank, self.world, host, port).with_job_token(token);
        cfg.local_rank = self.local_rank;
        cfg.local_world_size = self.local_world;
        cfg.connect_timeout = timeouts.0;
        cfg.exchange_timeout = timeouts.1;
        cfg
    }
}

/// What a group's first member prepared before publishing it.
enum Setup {
    Local { id: u64 },
    Tcp { cfg: TcpConfig, listener: TcpListener },
}

impl Setup {
    fn prepare<B: Bootstrap + ?Sized>(plan: &Plan, parent: &B, timeouts: (Duration, Duration)) -> Result<Self, String> {
        if plan.in_process {
            let group = LocalBootstrap::group_with_timeout(plan.world, timeouts.1);
            return Ok(Setup::Local { id: registry_put(group, timeouts.0) });
        }
        let host = if plan.one_host {
            "127.0.0.1".to_owned()
        } else {
            parent.reachable_host().ok_or_else(|| {
                format!(
                    "the group of {} spans hosts but the parent bootstrap does not know where other ranks \
                     can reach this process (Bootstrap::reachable_host is None)",
                    plan.world
                )
            })?
        };
        let mut cfg = plan.tcp_config(host, 0, token::hex(&token::nonce()), timeouts);
        let listener = bind_listener(&cfg).map_err(|e| e.to_string())?;
        cfg.master_port =
            listener.local_addr().map_err(|e| format!("reading the group's listener address: {e}"))?.port();
        Ok(Setup::Tcp { cfg, listener })
    }

    fn route(&self) -> Route {
        match self {
            Setup::Local { id } => Route::Local { id: *id },
            Setup::Tcp { cfg, .. } => Route::Tcp {
                host: cfg.master_addr.clone(),
                port: cfg.master_port,
                token: cfg.job_token.clone().unwrap_or_default(),
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// In-process groups

struct Entry {
    slots: Vec<Option<LocalBootstrap>>,
    expires: Instant,
}

fn registry() -> &'static Mutex<HashMap<u64, Entry>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Entry>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Stores a new in-process group until its members take their bootstraps. Entries not taken
/// within `ttl` (a member failed between the two split exchanges) are dropped, which makes the
/// members that did take theirs fail with `PeerGone` instead of waiting for their timeout.
fn registry_put(group: Vec<LocalBootstrap>, ttl: Duration) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|_, e| e.expires > now);
    reg.insert(id, Entry { slots: group.into_iter().map(Some).collect(), expires: deadline(now, ttl) });
    id
}

fn registry_take(id: u64, rank: usize) -> Option<LocalBootstrap> {
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    let entry = reg.get_mut(&id)?;
    let b = entry.slots.get_mut(rank)?.take();
    if entry.slots.iter().all(Option::is_none) {
        reg.remove(&id);
    }
    b
}

/// A random id of this process: members of a group with equal ids share memory.
fn process_id() -> &'static [u8; DIGEST_LEN] {
    static ID: OnceLock<[u8; DIGEST_LEN]> = OnceLock::new();
    ID.get_or_init(token::nonce)
}

// ---------------------------------------------------------------------------------------------
// Wire formats (inside the parent's frames, which carry lengths and sequence numbers)

#[derive(Debug, Clone, PartialEq, Eq)]
struct Hello {
    entry: SplitEntry,
    process: [u8; DIGEST_LEN],
    /// The host identity, or why it is invalid on that rank.
    host: Result<String, String>,
}

/// `magic, has_color u8, color u32, key u32, process [32], host_ok u8, host (rest, UTF-8)`.
fn encode_hello(h: &Hello) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(HELLO_MAGIC);
    out.push(u8::from(h.entry.color.is_some()));
    out.extend_from_slice(&h.entry.color.unwrap_or_default().to_le_bytes());
    out.extend_from_slice(&h.entry.key.to_le_bytes());
    out.extend_from_slice(&h.process);
    let (ok, text) = match &h.host {
        Ok(s) => (1, s),
        Err(s) => (0, s),
    };
    out.push(ok);
    out.extend_from_slice(text.as_bytes());
    out
}

fn decode_hello(b: &[u8]) -> Result<Hello, String> {
    let mut r = Reader(b);
    if r.take(HELLO_MAGIC.len())? != HELLO_MAGIC {
        return Err("not a detcoll split contribution (different version?)".into());
    }
    let has_color = r.u8()?;
    let color = r.u32()?;
    let key = r.u32()?;
    let process: [u8; DIGEST_LEN] = r.take(DIGEST_LEN)?.try_into().map_err(|_| "process id")?;
    let ok = r.u8()?;
    let text = String::from_utf8(r.0.to_vec()).map_err(|_| "host identity is not UTF-8".to_owned())?;
    let color = match has_color {
        0 => None,
        1 => Some(color),
        x => return Err(format!("invalid color flag {x}")),
    };
    let host = match ok {
        1 if !text.is_empty() => Ok(text),
        1 => return Err("empty host identity".into()),
        0 => Err(text),
        x => return Err(format!("invalid host flag {x}")),
    };
    Ok(Hello { entry: SplitEntry { color, key }, process, host })
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    None,
    Local { id: u64 },
    Tcp { host: String, port: u16, token: String },
    Error(String),
}

fn encode_route(r: &Route) -> Vec<u8> {
    let mut out = Vec::new();
    match r {
        Route::None => out.push(ROUTE_NONE),
        Route::Local { id } => {
            out.push(ROUTE_LOCAL);
            out.extend_from_slice(&id.to_le_bytes());
        }
        Route::Tcp { host, port, token } => {
            out.push(ROUTE_TCP);
            out.extend_from_slice(&port.to_le_bytes());
            out.extend_from_slice(&(token.len() as u32).to_le_bytes());
            out.extend_from_slice(token.as_bytes());
            out.extend_from_slice(host.as_bytes());
        }
        Route::Error(detail) => {
            out.push(ROUTE_ERROR);
            out.extend_from_slice(detail.as_bytes());
        }
    }
    out
}

fn decode_route(b: &[u8]) -> Result<Route, String> {
    let mut r = Reader(b);
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| "text is not UTF-8".to_owned());
    Ok(match r.u8()? {
        ROUTE_NONE => Route::None,
        ROUTE_LOCAL => Route::Local { id: u64::from_le_bytes(r.take(8)?.try_into().map_err(|_| "id")?) },
        ROUTE_TCP => {
            let port = u16::from_le_bytes(r.take(2)?.try_into().map_err(|_| "port")?);
            let len = r.u32()? as usize;
            let token = text(r.take(len)?)?;
            Route::Tcp { host: text(r.0)?, port, token }
        }
        ROUTE_ERROR => Route::Error(text(r.0)?),
        x => return Err(format!("unknown route kind {x}")),
    })
}

/// Reads a byte slice front to back; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("truncated: wanted {n} more bytes, {} left", self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| "u32")?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(color: Option<u32>, key: u32) -> SplitEntry {
        SplitEntry { color, key }
    }

    #[test]
    fn tp_and_dp_groups_of_eight() {
        let tp: Vec<SplitEntry> = (0..8).map(|r| e(Some(r / 4), r)).collect();
        let dp: Vec<SplitEntry> = (0..8).map(|r| e(Some(r % 4), r)).collect();
        for r in 0..8 {
            let t = group_members(&tp, r).unwrap().unwrap();
            let want: Vec<usize> = if r < 4 { (0..4).collect() } else { (4..8).collect() };
            assert_eq!(t, want, "tp of {r}");
            let d = group_members(&dp, r).unwrap().unwrap();
            assert_eq!(d, vec![r % 4, r % 4 + 4], "dp of {r}");
        }
    }

    #[test]
    fn ordered_by_key_then_parent_rank() {
        // Keys reverse the order; ranks 1 and 3 tie on key 5 and keep parent order.
        let entries = [e(Some(7), 9), e(Some(7), 5), e(Some(2), 0), e(Some(7), 5), e(Some(7), 0)];
        assert_eq!(group_members(&entries, 0).unwrap(), Some(vec![4, 1, 3, 0]));
        assert_eq!(group_members(&entries, 3).unwrap(), Some(vec![4, 1, 3, 0]));
        assert_eq!(group_members(&entries, 2).unwrap(), Some(vec![2]));
    }

    #[test]
    fn no_color_is_in_no_group() {
        let entries = [e(None, 0), e(Some(1), 0), e(None, 3), e(Some(1), 1)];
        assert_eq!(group_members(&entries, 0).unwrap(), None);
        assert_eq!(group_members(&entries, 2).unwrap(), None);
        // Colorless ranks are not members of anyone's group.
        assert_eq!(group_members(&entries, 1).unwrap(), Some(vec![1, 3]));
    }

    #[test]
    fn invalid_inputs_are_typed_errors() {
        assert!(matches!(group_members(&[], 0), Err(BootstrapError::InvalidConfig { .. })));
        let entries = [e(Some(0), 0), e(Some(0), 1)];
        assert!(matches!(group_members(&entries, 2), Err(BootstrapError::RankOutOfRange { rank: 2, world: 2 })));
    }

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        for h in [
            Hello { entry: e(Some(u32::MAX), 3), process: [7; DIGEST_LEN], host: Ok("node-1/boot".into()) },
            Hello { entry: e(None, 0), process: [0; DIGEST_LEN], host: Err("DETCOLL_HOST_ID is empty".into()) },
        ] {
            let bytes = encode_hello(&h);
            assert_eq!(decode_hello(&bytes).unwrap(), h);
            for cut in 0..HELLO_MAGIC.len() + 10 + DIGEST_LEN {
                assert!(decode_hello(&bytes[..cut]).is_err(), "truncated at {cut}");
            }
        }
        let mut bad = encode_hello(&Hello { entry: e(Some(1), 1), process: [1; DIGEST_LEN], host: Ok("h".into()) });
        bad[8] = 2;
        assert!(decode_hello(&bad).unwrap_err().contains("color flag"));
        bad[0] = b'X';
        assert!(decode_hello(&bad).unwrap_err().contains("not a detcoll split"));
    }

    #[test]
    fn route_round_trips_and_rejects_garbage() {
        for r in [
            Route::None,
            Route::Local { id: 42 },
            Route::Tcp { host: "10.0.0.7".into(), port: 40123, token: "ab".repeat(32) },
            Route::Error("cannot listen".into()),
        ] {
            assert_eq!(decode_route(&encode_route(&r)).unwrap(), r);
        }
        assert!(decode_route(&[]).is_err());
        assert!(decode_route(&[9]).unwrap_err().contains("unknown route"));
        assert!(decode_route(&[ROUTE_TCP, 1, 2, 255, 255, 255, 255]).unwrap_err().contains("truncated"));
    }

    #[test]
    fn registry_hands_out_each_slot_once() {
        let id = registry_put(LocalBootstrap::group(2), Duration::from_secs(60));
        assert_eq!(registry_take(id, 1).map(|b| b.rank()), Some(1));
        assert!(registry_take(id, 1).is_none());
        assert_eq!(registry_take(id, 0).map(|b| b.rank()), Some(0));
        // Fully taken entries are gone.
        assert!(registry_take(id, 0).is_none());
        assert!(registry().lock().unwrap().get(&id).is_none());
    }
}
