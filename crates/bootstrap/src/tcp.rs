//! TCP bootstrap: rank 0 serves, every other rank keeps one connection to it.
//!
//! Construction is collective. Rank 0 listens at `MASTER_ADDR:MASTER_PORT` and accepts
//! `world_size - 1` connections until `connect_timeout`; each other rank connects, retrying while
//! rank 0 is not up yet, and authenticates: rank 0 sends every new connection a random nonce,
//! the rank answers with a hello (rank, world size, and an HMAC of the nonce keyed with the job
//! token; see `bootstrap::token`). Rank 0 silently closes any connection that is not this
//! protocol, this version and this job (bad magic, wrong version, wrong MAC, wrong size, too
//! slow) and keeps accepting, so a stranger, a port scanner or a rank of another job on the same
//! port can neither join nor fail the group; such a client keeps retrying and ends with
//! [`BootstrapError::ConnectTimeout`]. A peer of *this* job (right MAC) with a mismatched world
//! size, a duplicate or an out-of-range rank fails the whole group: every rank's constructor
//! returns the same error. Ranks of the job that come after rank 0 failed so are told too: rank
//! 0 keeps its listener and answers every late hello that authenticates with that error, until
//! each rank has been told or until rank 0's connect deadline, then closes it (strangers still
//! get nothing) — in its constructor for up to [`LATE_RANKS_GRACE`] (so ranks started with it
//! are told even when its process exits on the error), then in a thread that lives as long as
//! its process. When every rank has connected, rank
//! 0 sends a welcome and every constructor returns.
//!
//! Rank 0 handles handshakes without blocking: the listener and every pending handshake are
//! polled together, bytes are accumulated per connection, each handshake has a deadline for its
//! whole hello ([`HANDSHAKE_TIMEOUT`], or less when the connect deadline is nearer), at most
//! [`MAX_PENDING_HANDSHAKES`] are pending (the oldest is dropped beyond), and the connect
//! deadline is checked on every iteration. Pending handshakes also leave descriptors for the
//! real ranks: under a low `RLIMIT_NOFILE` fewer are kept (the limit less the descriptors open,
//! one per rank and a reserve), the oldest unauthenticated connection is closed first when
//! `accept` runs out of descriptors, and with none to close accepting pauses (backing off)
//! rather than spinning. Idle, trickling or flooding connections therefore neither delay the
//! real ranks nor keep rank 0 past its deadline; when ranks are missing at the deadline,
//! [`BootstrapError::MissingRanks`] lists them all. The listener's accept queue holds the
//! whole world (up to the system's `somaxconn`), so a thousand ranks that start together are
//! not held back by a full queue.
//!
//! Timeouts are more than zero and at most
//! [`MAX_BOOTSTRAP_TIMEOUT`](crate::MAX_BOOTSTRAP_TIMEOUT) (one day; anything else is
//! [`BootstrapError::InvalidConfig`]), and deadlines never overflow.
//!
//! `all_gather_bytes`: each other rank sends one length-prefixed frame carrying the exchange
//! number; rank 0 waits (bounded by `exchange_timeout`, for the whole frame) for all of them, and
//! sends back the concatenation. If a rank's connection closes, it sends the wrong exchange
//! number, or it does not contribute in time, rank 0 sends an error frame naming it to every
//! other rank, so every rank reports the same culprit. Non-zero ranks wait 1.5 ×
//! `exchange_timeout` for rank 0's answer, so rank 0's diagnosis arrives before their own
//! timeout fires.
//!
//! Binding: when `MASTER_ADDR` is a loopback IP or `localhost`, rank 0 listens there; otherwise
//! it listens on the wildcard address (IPv4, or IPv6 for IPv6-only addresses) at `MASTER_PORT`:
//! a host name may resolve to `127.0.1.1` on its own host while other nodes reach it through
//! its public address.
//! With `world_size == 1` nothing is bound.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::deadline::{check_timeout, deadline as deadline_after};
use crate::fds::{self, RESERVED_FDS, fd_limit, open_fds};
use crate::token::{self, DIGEST_LEN};
use crate::wire::{self, DeadlineReader, Frame, Kind, ReadError};
use crate::{Bootstrap, BootstrapError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_EXCHANGE_TIMEOUT, validate_layout};

/// The longest rank 0 waits for one connection's whole hello after it accepted it (less when
/// its connect deadline is nearer). A real rank answers within a round trip; anything slower is
/// dropped, and a real rank that was dropped reconnects.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// The most handshakes rank 0 keeps pending at once (fewer under a low `RLIMIT_NOFILE`: see the
/// module documentation); beyond, the oldest is dropped (a real rank whose handshake is dropped
/// reconnects).
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// Connections rank 0 accepts per loop iteration before it looks at the pending handshakes.
const ACCEPT_BURST: usize = 64;
/// Largest frame a rank accepts during the handshake (acks and errors are small; a stranger on
/// the port cannot make it allocate more).
const MAX_HANDSHAKE_REPLY: u64 = 1 << 20;

/// Configuration of a [`TcpBootstrap`]. (`Debug` does not show the job token.)
#[derive(Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Index among the ranks on this host.
    pub local_rank: usize,
    /// Number of ranks on this host.
    pub local_world_size: usize,
    /// Where rank 0 serves (host name or IP).
    pub master_addr: String,
    /// Rank 0's port (not 0).
    pub master_port: u16,
    /// How long non-zero ranks retry connecting, and how long rank 0 waits for all of them
    /// (more than zero, at most [`MAX_BOOTSTRAP_TIMEOUT`](crate::MAX_BOOTSTRAP_TIMEOUT)).
    pub connect_timeout: Duration,
    /// How long one exchange waits for every rank's contribution (more than zero, at most
    /// [`MAX_BOOTSTRAP_TIMEOUT`](crate::MAX_BOOTSTRAP_TIMEOUT)).
    pub exchange_timeout: Duration,
    /// The job identity every rank proves in its handshake (`DETCOLL_JOB_TOKEN`; 1 to
    /// [`MAX_TOKEN_LEN`](crate::MAX_TOKEN_LEN) bytes). `None` derives one from `master_addr` and
    /// `master_port` (see [`TcpConfig::job_token_or_default`]), which separates jobs at different
    /// addresses but is no secret: set a secret token on networks shared with untrusted users.
    pub job_token: Option<String>,
}

impl fmt::Debug for TcpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpConfig")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .field("master_addr", &self.master_addr)
            .field("master_port", &self.master_port)
            .field("connect_timeout", &self.connect_timeout)
            .field("exchange_timeout", &self.exchange_timeout)
            .field("job_token", &self.job_token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl TcpConfig {
    /// All ranks on one host (`local_rank = rank`, `local_world_size = world_size`), default
    /// timeouts ([`DEFAULT_CONNECT_TIMEOUT`], [`DEFAULT_EXCHANGE_TIMEOUT`]).
    pub fn single_host(rank: usize, world_size: usize, master_addr: impl Into<String>, master_port: u16) -> Self {
        Self {
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            master_addr: master_addr.into(),
            master_port,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            exchange_timeout: DEFAULT_EXCHANGE_TIMEOUT,
            job_token: None,
        }
    }

    /// Sets the job token (see [`TcpConfig::job_token`]); every rank of the job must use the
    /// same one.
    pub fn with_job_token(mut self, token: impl Into<String>) -> Self {
        self.job_token = Some(token.into());
        self
    }

    /// The token the handshake uses: [`TcpConfig::job_token`], or, when unset, one derived from
    /// `master_addr` and `master_port` (not from the world size, so that ranks started with
    /// different world sizes still meet and get [`BootstrapError::WorldSizeMismatch`] rather
    /// than a silent timeout).
    pub fn job_token_or_default(&self) -> Cow<'_, str> {
        match &self.job_token {
            Some(t) => Cow::Borrowed(t),
            None => Cow::Owned(token::derive_token("addr", &[self.host(), &self.master_port.to_string()])),
        }
    }

    /// Both timeouts set to `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self.exchange_timeout = timeout;
        self
    }

    /// `master_addr` without the brackets of an IPv6 literal.
    fn host(&self) -> &str {
        let a = self.master_addr.trim();
        a.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(a)
    }

    fn addr(&self) -> String {
        let host = self.host();
        if host.contains(':') {
            format!("[{host}]:{}", self.master_port)
        } else {
            format!("{host}:{}", self.master_port)
        }
    }
}

enum Role {
    Single,
    Root {
        /// Index = rank; `peers[0]` is `None`.
        peers: Vec<Option<TcpStream>>,
    },
    Client {
        stream: TcpStream,
    },
}

struct Inner {
    role: Role,
    /// Number of completed exchanges.
    seq: u64,
    /// Set after a failure: later calls return `Closed`.
    failed: Option<String>,
}

/// Multi-process bootstrap over TCP (see the module documentation of `bootstrap::tcp` for the
/// protocol). Connections stay open for the lifetime of the value; dropping it closes them, and
/// peers waiting in an exchange then fail with [`BootstrapError::PeerGone`] naming this rank.
pub struct TcpBootstrap {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    addr: String,
    connect_timeout: Duration,
    exchange_timeout: Duration,
    /// Where other ranks can reach a listener of this process (for `split`): rank 0's
    /// `MASTER_ADDR`, another rank's address on its connection to rank 0.
    reachable_host: Option<String>,
    inner: Mutex<Inner>,
}

impl fmt::Debug for TcpBootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpBootstrap")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .field("addr", &self.addr)
            .field("exchange_timeout", &self.exchange_timeout)
            .finish_non_exhaustive()
    }
}

impl TcpBootstrap {
    /// Joins (or, on rank 0, serves) the rendezvous. Returns when every rank has connected, or
    /// with the error that made the group fail.
    ///
    /// ```no_run
    /// use detcoll_bootstrap::{TcpBootstrap, TcpConfig};
    /// let cfg = TcpConfig::single_host(1, 2, "127.0.0.1", 29500).with_job_token("a secret");
    /// let boot = TcpBootstrap::new(cfg).expect("rank 0 serves at 127.0.0.1:29500");
    /// # let _ = boot;
    /// ```
    pub fn new(cfg: TcpConfig) -> Result<Self, BootstrapError> {
        Self::start(cfg, None)
    }

    /// Like [`TcpBootstrap::new`] on rank 0 of `cfg`, serving on an already bound `listener`
    /// (`split` binds an ephemeral port before it can publish it). Other ranks ignore it.
    pub(crate) fn with_listener(cfg: TcpConfig, listener: TcpListener) -> Result<Self, BootstrapError> {
        Self::start(cfg, Some(listener))
    }

    fn start(cfg: TcpConfig, listener: Option<TcpListener>) -> Result<Self, BootstrapError> {
        validate_layout(cfg.rank, cfg.world_size, cfg.local_rank, cfg.local_world_size)?;
        if cfg.master_port == 0 {
            return Err(BootstrapError::InvalidConfig {
                detail: "master port 0: the other ranks could not find rank 0".into(),
            });
        }
        // More than zero and at most a day: every deadline below is then representable.
        check_timeout("the bootstrap connect_timeout", cfg.connect_timeout)?;
        check_timeout("the bootstrap exchange_timeout", cfg.exchange_timeout)?;
        if let Some(t) = &cfg.job_token {
            token::check_token(t).map_err(|detail| BootstrapError::InvalidConfig { detail })?;
        }
        let role = if cfg.world_size == 1 {
            Role::Single
        } else if cfg.rank == 0 {
            serve(&cfg, listener)?
        } else {
            join(&cfg)?
        };
        let reachable_host = match &role {
            Role::Single => None,
            Role::Root { .. } => Some(cfg.host().to_owned()),
            Role::Client { stream } => stream.local_addr().ok().map(|a| a.ip().to_string()),
        };
        Ok(Self {
            rank: cfg.rank,
            world_size: cfg.world_size,
            local_rank: cfg.local_rank,
            local_world_size: cfg.local_world_size,
            addr: cfg.addr(),
            connect_timeout: cfg.connect_timeout,
            exchange_timeout: cfg.exchange_timeout,
            reachable_host,
            inner: Mutex::new(Inner { role, seq: 0, failed: None }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn root_gather(
        &self,
        peers: &mut [Option<TcpStream>],
        seq: u64,
        mine: &[u8],
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let timeout = self.exchange_timeout;
        let deadline = deadline_after(Instant::now(), timeout);
        let mut parts: Vec<Option<Vec<u8>>> = vec![None; self.world_size];
        parts[0] = Some(mine.to_vec());
        let mut pending: Vec<usize> = (1..self.world_size).collect();
        while !pending.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return Err(BootstrapError::PeerTimeout {
                    rank: pending[0],
                    waited: timeout,
                    what: wire::WHAT_EXCHANGE,
                });
            }
            let streams: Vec<&TcpStream> =
                pending.iter().map(|&r| peers[r].as_ref().expect("connected peer")).collect();
            let ready = wait_readable(&streams, deadline - now)
                .map_err(|e| BootstrapError::io("rank 0: waiting for contributions", e))?;
            let mut still = Vec::with_capacity(pending.len());
            for (&r, is_ready) in pending.iter().zip(ready) {
                if !is_ready {
                    still.push(r);
                    continue;
                }
                // The whole frame by the exchange deadline: a peer trickling its bytes cannot
                // hold rank 0 past it.
                let s = peers[r].as_ref().expect("connected peer");
                match wire::read_frame_by(s, deadline) {
                    Ok(Frame { kind: Kind::Data, seq: got, payload }) => {
                        if got != seq {
                            return Err(BootstrapError::SequenceMismatch { rank: r, expected: seq, got });
                        }
                        parts[r] = Some(payload);
                    }
                    Ok(f) => {
                        return Err(BootstrapError::Protocol(format!(
                            "rank {r} sent an unexpected {:?} frame during exchange #{seq}",
                            f.kind
                        )));
                    }
                    Err(e) => return Err(read_failure(r, e, timeout, wire::WHAT_EXCHANGE)),
                }
            }
            pending = still;
        }
        let parts: Vec<Vec<u8>> = parts.into_iter().map(Option::unwrap_or_default).collect();
        let payload = wire::encode_result(&parts);
        for (r, s) in peers.iter_mut().enumerate().skip(1) {
            let s = s.as_mut().expect("connected peer");
            let _ = s.set_write_timeout(Some(timeout));
            wire::write_frame(s, Kind::Result, seq, &payload).map_err(|e| {
                if wire::is_timeout(&e) {
                    BootstrapError::PeerTimeout {
                        rank: r,
                        waited: timeout,
                        what: "read the result of all_gather_bytes",
                    }
                } else {
                    BootstrapError::PeerGone { rank: r, detail: format!("sending the result failed: {e}") }
                }
            })?;
        }
        Ok(parts)
    }

    fn client_gather(&self, stream: &mut TcpStream, seq: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        // Longer than rank 0's own wait, so rank 0's diagnosis (naming the culprit) arrives first.
        let wait = self.exchange_timeout.saturating_add(self.exchange_timeout / 2);
        let _ = stream.set_write_timeout(Some(wait));
        if let Err(e) = wire::write_frame(stream, Kind::Data, seq, mine) {
            // Rank 0 may have failed and told us why before closing: prefer its diagnosis.
            let by = Instant::now() + Duration::from_millis(200);
            if let Ok(Frame { kind: Kind::Error, payload, .. }) = wire::read_frame_by(stream, by) {
                return Err(self.root_error(wire::decode_error(&payload)));
            }
            return Err(if wire::is_timeout(&e) {
                BootstrapError::PeerTimeout { rank: 0, waited: wait, what: wire::WHAT_ACCEPT }
            } else {
                BootstrapError::PeerGone { rank: 0, detail: format!("sending to {} failed: {e}", self.addr) }
            });
        }
        match wire::read_frame_by(stream, deadline_after(Instant::now(), wait)) {
            Ok(Frame { kind: Kind::Result, seq: got, payload }) => {
                if got != seq {
                    return Err(BootstrapError::Protocol(format!(
                        "rank 0 answered exchange #{got} while this rank is at #{seq}"
                    )));
                }
                let parts = wire::decode_result(&payload)
                    .map_err(|m| BootstrapError::Protocol(format!("rank 0 sent a malformed result: {m}")))?;
                if parts.len() != self.world_size || parts[self.rank] != mine {
                    return Err(BootstrapError::Protocol(format!(
                        "rank 0's result of exchange #{seq} does not match this rank's \
                         contribution or the world size"
                    )));
                }
                Ok(parts)
            }
            Ok(Frame { kind: Kind::Error, payload, .. }) => Err(self.root_error(wire::decode_error(&payload))),
            Ok(f) => Err(BootstrapError::Protocol(format!(
                "rank 0 sent an unexpected {:?} frame during exchange #{seq}",
                f.kind
            ))),
            Err(e) => Err(read_failure(0, e, wait, wire::WHAT_RESULT)),
        }
    }

    fn root_error(&self, e: BootstrapError) -> BootstrapError {
        root_error_for(e, self.world_size)
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_world_size(&self) -> usize {
        self.local_world_size
    }
    fn timeouts(&self) -> Option<(Duration, Duration)> {
        Some((self.connect_timeout, self.exchange_timeout))
    }
    fn reachable_host(&self) -> Option<String> {
        self.reachable_host.clone()
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if let Some(reason) = &inner.failed {
            return Err(BootstrapError::Closed { reason: reason.clone() });
        }
        let seq = inner.seq;
        let result = match &mut inner.role {
            Role::Single => Ok(vec![mine.to_vec()]),
            Role::Root { peers } => {
                let r = self.root_gather(peers, seq, mine);
                if let Err(e) = &r {
                    abort_peers(peers, e, seq);
                }
                r
            }
            Role::Client { stream } => {
                let r = self.client_gather(stream, seq, mine);
                if r.is_err() {
                    // Make rank 0 notice now rather than at its timeout.
                    let _ = stream.shutdown(Shutdown::Both);
                }
                r
            }
        };
        match &result {
            Ok(_) => inner.seq += 1,
            Err(e) => inner.failed = Some(e.to_string()),
        }
        result
    }
}

/// Rank 0 forwards `e` to every connected peer (best effort) and half-closes the connections.
fn abort_peers(peers: &mut [Option<TcpStream>], e: &BootstrapError, seq: u64) {
    let payload = wire::encode_error(e);
    for s in peers.iter_mut().flatten() {
        let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
        let _ = wire::write_frame(s, Kind::Error, seq, &payload);
        // Half-close: the error frame is delivered before EOF, and unread input does not turn
        // into a reset that could discard it.
        let _ = s.shutdown(Shutdown::Write);
    }
}

/// An error decoded from rank 0, seen from a rank with world size `my_world`.
fn root_error_for(e: BootstrapError, my_world: usize) -> BootstrapError {
    match e {
        // Rank 0 reports (offender, rank 0's world, offender's world); if our world is not rank
        // 0's (we are the offender, or a late rank that believes what it believes), the other
        // side is rank 0.
        BootstrapError::WorldSizeMismatch { ours, .. } if ours != my_world => {
            BootstrapError::WorldSizeMismatch { rank: 0, ours: my_world, theirs: ours }
        }
        other => other,
    }
}

fn read_failure(rank: usize, e: ReadError, waited: Duration, what: &'static str) -> BootstrapError {
    if e.is_timeout() {
        return BootstrapError::PeerTimeout { rank, waited, what };
    }
    match e {
        ReadError::Malformed(m) => BootstrapError::Protocol(format!("rank {rank} sent a malformed frame: {m}")),
        io => BootstrapError::PeerGone { rank, detail: io.to_string() },
    }
}

// ---------------------------------------------------------------------------------------------
// Rank 0

pub(crate) fn bind_listener(cfg: &TcpConfig) -> Result<TcpListener, BootstrapError> {
    let addr = cfg.addr();
    let host = cfg.host();
    let port = cfg.master_port;
    let literal: Option<IpAddr> = host.parse().ok();
    let loopback_only = match literal {
        Some(ip) => ip.is_loopback(),
        None => host.eq_ignore_ascii_case("localhost"),
    };
    let bind_to: Vec<SocketAddr> = if loopback_only {
        (host, port)
            .to_socket_addrs()
            .map_err(|e| BootstrapError::io(format!("rank 0: resolving MASTER_ADDR {addr}"), e))?
            .collect()
    } else {
        // Any other address: listen on the wildcard address (IPv4 unless the address is IPv6
        // only), so other nodes reach us whatever our own resolver says about our name.
        let v6_only = match literal {
            Some(ip) => ip.is_ipv6(),
            None => (host, port).to_socket_addrs().is_ok_and(|mut a| {
                let all: Vec<SocketAddr> = a.by_ref().collect();
                !all.is_empty() && all.iter().all(SocketAddr::is_ipv6)
            }),
        };
        let ip = if v6_only { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) };
        vec![SocketAddr::new(ip, port)]
    };
    // std sets SO_REUSEADDR on Unix, so a port in TIME_WAIT from a previous run is reusable.
    TcpListener::bind(bind_to.as_slice()).map_err(|e| {
        BootstrapError::io(format!("rank 0: cannot listen on {bind_to:?} (MASTER_ADDR:MASTER_PORT = {addr})"), e)
    })
}

/// Lets the listener's accept queue hold every rank of the world at once (and an accept burst
/// of strangers besides), not std's 128: at 1024 ranks starting together, the connections
/// beyond a full queue had their handshake's last packet dropped by the kernel and waited for
/// its retransmission (1 s, then 3 s...) or for their handshake timeout, and a rendezvous that
/// takes about a second took 5 to 12. Calling `listen` again on a listening socket only
/// changes its backlog; the kernel caps it at `net.core.somaxconn` (4096 since Linux 5.4, 128
/// before), and should the call fail, std's backlog stays.
fn widen_backlog(listener: &TcpListener, world: usize) {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let backlog = libc::c_int::try_from(world.saturating_add(ACCEPT_BURST)).unwrap_or(libc::c_int::MAX).max(128);
        // SAFETY: listen(2) on the descriptor `listener` owns and keeps open for the call; it
        // reads no memory of ours.
        let _ = unsafe { libc::listen(listener.as_raw_fd(), backlog) };
    }
    #[cfg(not(unix))]
    let _ = (listener, world);
}

/// One connection rank 0 accepted whose hello is not complete yet.
struct Pending {
    stream: TcpStream,
    /// The challenge sent to it.
    nonce: [u8; DIGEST_LEN],
    /// The hello so far (`got` bytes).
    buf: [u8; wire::HELLO_FRAME_LEN],
    got: usize,
    /// When the whole hello must have arrived.
    deadline: Instant,
}

enum Progress {
    /// Waiting for more bytes.
    More,
    /// Not a rank of this job, or it went away: drop it without an answer.
    Drop,
    /// A complete hello with a valid MAC.
    Hello { rank: u64, world: u64 },
}

impl Pending {
    /// Reads what is available (the socket is non-blocking), never beyond the hello: anything
    /// after it is not rank 0's to consume.
    fn advance(&mut self, token: &str) -> Progress {
        loop {
            if self.got == self.buf.len() {
                let h = wire::decode_hello(&self.buf);
                let want = token::hello_mac(token, &self.nonce, h.rank, h.world);
                return if token::ct_eq(&want, &h.mac) {
                    Progress::Hello { rank: h.rank, world: h.world }
                } else {
                    Progress::Drop
                };
            }
            match self.stream.read(&mut self.buf[self.got..]) {
                Ok(0) => return Progress::Drop,
                Ok(n) => {
                    let before = self.got;
                    self.got += n;
                    if before < wire::HEADER_LEN && self.got >= wire::HEADER_LEN {
                        let h: &[u8; wire::HEADER_LEN] = self.buf[..wire::HEADER_LEN].try_into().expect("header");
                        if wire::check_hello_header(h).is_err() {
                            return Progress::Drop;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::More,
                Err(_) => return Progress::Drop,
            }
        }
    }
}

/// An authenticated hello (right protocol, version and job token): a peer of this job, as yet
/// unchecked against the group (`rank`/`world` as sent). Its stream is blocking again.
struct Authenticated {
    stream: TcpStream,
    rank: u64,
    world: u64,
}

/// Rank 0's listener and the handshakes in progress on it: accepts connections, challenges
/// them and hands over the authenticated ones, bounded in descriptors, memory and time.
///
/// Descriptors: at most `budget` connections are pending at once, so that the connected real
/// ranks and the rest of the process keep descriptors under a low `RLIMIT_NOFILE`
/// ([`pending_budget`]); beyond it, and whenever `accept` runs out of descriptors anyway, the
/// oldest pending connection is closed first. With nothing left to close, accepting pauses
/// (backing off up to [`ACCEPT_PAUSE_MAX`]) instead of polling a listener it cannot serve.
struct Door {
    listener: TcpListener,
    pending: VecDeque<Pending>,
    budget: usize,
    /// While accepting is paused for lack of descriptors: when to try again.
    paused_until: Option<Instant>,
    /// The next pause.
    pause: Duration,
}

/// The longest pause of accepting while this process has no descriptor left (the pause starts
/// at 1 ms and doubles).
const ACCEPT_PAUSE_MAX: Duration = Duration::from_millis(100);
/// The fewest pending handshakes rank 0 allows, however low its descriptor limit.
const MIN_PENDING_HANDSHAKES: usize = 8;

impl Door {
    fn new(listener: TcpListener, world: usize) -> Self {
        Self {
            listener,
            pending: VecDeque::new(),
            budget: pending_budget(world),
            paused_until: None,
            pause: Duration::from_millis(1),
        }
    }

    /// Waits until activity or `by` (the nearest handshake deadline or the end of an accept
    /// pause, if sooner), reads what the pending handshakes sent and accepts new connections.
    /// Authenticated hellos are appended to `out`. `Err` only for an error of the listener or
    /// of poll itself.
    fn turn(
        &mut self,
        token: &str,
        by: Instant,
        addr: &str,
        out: &mut Vec<Authenticated>,
    ) -> Result<(), BootstrapError> {
        let now = Instant::now();
        self.pending.retain(|p| p.deadline > now);
        if self.paused_until.is_some_and(|t| now >= t) {
            self.paused_until = None;
        }
        let accepting = self.paused_until.is_none();
        let wake = self.pending.iter().map(|p| p.deadline).chain(self.paused_until).fold(by, Instant::min);
        let streams: Vec<&TcpStream> = self.pending.iter().map(|p| &p.stream).collect();
        let (listener_ready, ready) =
            poll_handshakes(accepting.then_some(&self.listener), &streams, wake.saturating_duration_since(now))
                .map_err(|e| BootstrapError::io("rank 0: waiting for connections", e))?;
        drop(streams);
        // Pending handshakes first (their indices are those polled), then new connections.
        let mut i = 0usize;
        for is_ready in ready {
            if !is_ready {
                i += 1;
                continue;
            }
            match self.pending[i].advance(token) {
                Progress::More => i += 1,
                Progress::Drop => {
                    self.pending.remove(i);
                }
                Progress::Hello { rank, world } => {
                    let stream = self.pending.remove(i).expect("index in range").stream;
                    if stream.set_nonblocking(false).is_ok() {
                        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
                        out.push(Authenticated { stream, rank, world });
                    }
                }
            }
        }
        if listener_ready { self.accept_burst(addr, by) } else { Ok(()) }
    }

    /// Accepts up to [`ACCEPT_BURST`] connections and sends each its challenge; handshakes end
    /// by `deadline` at the latest. `Err` only for an error of the listener itself.
    fn accept_burst(&mut self, addr: &str, deadline: Instant) -> Result<(), BootstrapError> {
        for _ in 0..ACCEPT_BURST {
            let stream = match self.listener.accept() {
                Ok((stream, _from)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    continue;
                }
                // Out of descriptors (a flood, a low RLIMIT_NOFILE): close the oldest
                // unauthenticated connection and try again, and size the budget to what fits;
                // with none to close (or out of buffers), pause accepting rather than spin on a
                // listener that stays readable.
                Err(e) if is_fd_exhaustion(&e) && !self.pending.is_empty() => {
                    self.pending.pop_front();
                    self.budget = self.budget.min(self.pending.len()).max(MIN_PENDING_HANDSHAKES);
                    continue;
                }
                Err(e) if is_fd_exhaustion(&e) || is_resource_exhaustion(&e) => {
                    self.paused_until = Some(Instant::now() + self.pause);
                    self.pause = (self.pause * 2).min(ACCEPT_PAUSE_MAX);
                    return Ok(());
                }
                Err(e) => return Err(BootstrapError::io(format!("rank 0: accepting connections at {addr}"), e)),
            };
            self.pause = Duration::from_millis(1);
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let nonce = token::nonce();
            let challenge = wire::encode_frame(Kind::Challenge, wire::PROTOCOL_VERSION, &nonce);
            // A fresh socket's send buffer takes 56 bytes at once; if not, the peer is not
            // worth waiting for.
            if (&stream).write(&challenge).ok() != Some(challenge.len()) {
                continue;
            }
            let now = Instant::now();
            self.pending.push_back(Pending {
                stream,
                nonce,
                buf: [0; wire::HELLO_FRAME_LEN],
                got: 0,
                deadline: (now + HANDSHAKE_TIMEOUT).min(deadline),
            });
            while self.pending.len() > self.budget {
                self.pending.pop_front();
            }
        }
        Ok(())
    }
}

/// How many handshakes rank 0 keeps pending: [`MAX_PENDING_HANDSHAKES`], or fewer when the
/// soft `RLIMIT_NOFILE` leaves less room beyond the descriptors open now, one per peer and
/// [`RESERVED_FDS`] (at least [`MIN_PENDING_HANDSHAKES`]).
fn pending_budget(world: usize) -> usize {
    let Some(limit) = fd_limit() else { return MAX_PENDING_HANDSHAKES };
    let open = open_fds().unwrap_or(RESERVED_FDS);
    limit
        .saturating_sub(open.saturating_add(world).saturating_add(RESERVED_FDS))
        .clamp(MIN_PENDING_HANDSHAKES, MAX_PENDING_HANDSHAKES)
}

/// `EMFILE`/`ENFILE`: no descriptor for a new connection.
fn is_fd_exhaustion(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// Out of buffers or memory: transient.
fn is_resource_exhaustion(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ENOMEM))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// A hello with a valid MAC: either a configuration error of this job, or the peer's rank.
fn admit(rank: u64, world: u64, ours: usize, peers: &[Option<TcpStream>]) -> Result<usize, BootstrapError> {
    let theirs = usize::try_from(world).unwrap_or(usize::MAX);
    let rank = usize::try_from(rank).unwrap_or(usize::MAX);
    if theirs != ours {
        Err(BootstrapError::WorldSizeMismatch { rank, ours, theirs })
    } else if rank >= ours {
        Err(BootstrapError::RankOutOfRange { rank, world: ours })
    } else if rank == 0 || peers[rank].is_some() {
        Err(BootstrapError::DuplicateRank { rank })
    } else {
        Ok(rank)
    }
}

/// The most ranks rank 0 tracks when it tells late ranks why the rendezvous failed (a hello
/// claiming a larger world is still answered; rank 0 then answers until its deadline).
const MAX_TOLD: usize = 1 << 16;

/// Which ranks rank 0 told why the rendezvous failed (index = rank; rank 0 is itself).
struct Told(Vec<bool>);

impl Told {
    fn new(world: usize) -> Self {
        let mut v = vec![false; world.min(MAX_TOLD)];
        v[0] = true;
        Self(v)
    }

    /// A peer claiming `rank` of `world` was told: the world it believes in has ranks to tell too.
    fn mark(&mut self, rank: u64, world: u64) {
        let world = usize::try_from(world).unwrap_or(usize::MAX).min(MAX_TOLD);
        if world > self.0.len() {
            self.0.resize(world, false);
        }
        if let Some(t) = usize::try_from(rank).ok().and_then(|r| self.0.get_mut(r)) {
            *t = true;
        }
    }

    fn everyone(&self) -> bool {
        self.0.iter().all(|&t| t)
    }
}

/// Sends an authenticated peer the reason the rendezvous failed, then half-closes.
fn tell(peer: &mut Authenticated, payload: &[u8]) {
    let _ = peer.stream.set_write_timeout(Some(Duration::from_millis(500)));
    let _ = wire::write_frame(&mut peer.stream, Kind::Error, 0, payload);
    let _ = peer.stream.shutdown(Shutdown::Write);
}

/// How long rank 0's constructor itself keeps telling late ranks why the rendezvous failed
/// before it returns the error (at most until its connect deadline; it returns sooner once
/// every rank was told). The thread that goes on telling them dies with rank 0's process, and
/// the usual `TcpBootstrap::from_env()?` in `main` exits at once: without this wait, ranks
/// started together with rank 0 but a few milliseconds after its failure waited out their
/// connect timeout and failed with `ConnectTimeout` instead of the job's error (found by an
/// outside probe: ranks 2 and 3 of 4 waited 60 s after a duplicate rank 1).
pub const LATE_RANKS_GRACE: Duration = Duration::from_secs(3);

/// After the rendezvous failed on a peer of this job (duplicate rank, world size, rank out of
/// range) or on rank 0's own descriptor limit, rank 0 gives every late rank of the job that
/// authenticates the same error, until every rank has been told or rank 0's connect deadline:
/// first in the constructor for `grace` ([`LATE_RANKS_GRACE`] for a peer's failure; none for
/// rank 0's own, which it reports at once), then in a thread (which ends with rank 0's
/// process); then the listener closes. Strangers still get nothing.
fn answer_late(
    mut door: Door,
    token: String,
    addr: String,
    e: &BootstrapError,
    deadline: Instant,
    mut told: Told,
    grace: Duration,
) {
    let payload = wire::encode_error(e);
    let grace = deadline.min(deadline_after(Instant::now(), grace));
    if !tell_late_until(&mut door, &token, &addr, &payload, grace, &mut told) || Instant::now() >= deadline {
        return;
    }
    let body = move || {
        tell_late_until(&mut door, &token, &addr, &payload, deadline, &mut told);
    };
    // Without a thread the later ranks time out, as before.
    let _ = thread::Builder::new().name("detcoll-rendezvous-failed".into()).spawn(body);
}

/// Tells every rank whose hello authenticates by `until` the failure (`payload`). `true`: some
/// rank may still come (not everyone told, the listener fine).
fn tell_late_until(door: &mut Door, token: &str, addr: &str, payload: &[u8], until: Instant, told: &mut Told) -> bool {
    let mut late = Vec::new();
    while !told.everyone() && Instant::now() < until {
        if door.turn(token, until, addr, &mut late).is_err() {
            return false;
        }
        for mut peer in late.drain(..) {
            tell(&mut peer, payload);
            told.mark(peer.rank, peer.world);
        }
    }
    !told.everyone()
}

fn serve(cfg: &TcpConfig, listener: Option<TcpListener>) -> Result<Role, BootstrapError> {
    let world = cfg.world_size;
    let token = cfg.job_token_or_default().into_owned();
    let addr = cfg.addr();
    let deadline = deadline_after(Instant::now(), cfg.connect_timeout);
    let listener = match listener {
        Some(l) => l,
        None => bind_listener(cfg)?,
    };
    listener.set_nonblocking(true).map_err(|e| BootstrapError::io("rank 0: configuring the listener", e))?;
    widen_backlog(&listener, world);
    // A connection per rank, and a full set of pending handshakes when the hard limit allows.
    let room = fds::ensure(
        world - 1 + MIN_PENDING_HANDSHAKES,
        world - 1 + MAX_PENDING_HANDSHAKES,
        &format!("the connections of {} ranks and their handshakes", world - 1),
    );
    let mut door = Door::new(listener, world);
    if let Err(e) = room {
        // Tell the ranks that come while this process lives; strangers still get nothing.
        answer_late(door, token, addr, &e, deadline, Told::new(world), Duration::ZERO);
        return Err(e);
    }
    let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut connected = 0usize;
    let mut told = Told::new(world);
    let mut hellos = Vec::new();
    let outcome: Result<(), (BootstrapError, bool)> = loop {
        if connected == world - 1 {
            break Ok(());
        }
        if Instant::now() >= deadline {
            let ranks: Vec<usize> = (1..world).filter(|&r| peers[r].is_none()).collect();
            break Err((BootstrapError::MissingRanks { ranks, waited: cfg.connect_timeout }, false));
        }
        if let Err(e) = door.turn(&token, deadline, &addr, &mut hellos) {
            break Err((e, false));
        }
        let mut failure: Option<BootstrapError> = None;
        for mut peer in hellos.drain(..) {
            if let Some(e) = &failure {
                // Authenticated in the same turn as the offender: told like every other rank.
                tell(&mut peer, &wire::encode_error(e));
                told.mark(peer.rank, peer.world);
                continue;
            }
            match admit(peer.rank, peer.world, world, &peers) {
                Err(e) => {
                    tell(&mut peer, &wire::encode_error(&e));
                    told.mark(peer.rank, peer.world);
                    failure = Some(e);
                }
                Ok(rank) => {
                    if wire::write_frame(&mut peer.stream, Kind::Ack, 0, &[]).is_ok() {
                        peers[rank] = Some(peer.stream);
                        connected += 1;
                    }
                    // else: it went away; if it retries, it is accepted then.
                }
            }
        }
        if let Some(e) = failure {
            break Err((e, true));
        }
    };
    if let Err((e, tell_late)) = outcome {
        abort_peers(&mut peers, &e, 0);
        if tell_late {
            for (r, p) in peers.iter().enumerate() {
                if p.is_some() {
                    told.mark(r as u64, world as u64);
                }
            }
            answer_late(door, token, addr, &e, deadline, told, LATE_RANKS_GRACE);
        }
        return Err(e);
    }
    drop(door);
    for r in 1..world {
        let s = peers[r].as_mut().expect("connected peer");
        let _ = s.set_write_timeout(Some(cfg.connect_timeout));
        if let Err(e) = wire::write_frame(s, Kind::Welcome, 0, &[]) {
            let e = BootstrapError::PeerGone {
                rank: r,
                detail: format!("it disconnected before the rendezvous completed: {e}"),
            };
            abort_peers(&mut peers, &e, 0);
            return Err(e);
        }
    }
    Ok(Role::Root { peers })
}

// ---------------------------------------------------------------------------------------------
// Other ranks

fn join(cfg: &TcpConfig) -> Result<Role, BootstrapError> {
    let start = Instant::now();
    let deadline = deadline_after(start, cfg.connect_timeout);
    let addr = cfg.addr();
    let token = cfg.job_token_or_default();
    let mut backoff = Duration::from_millis(10);
    let mut last_error = io::Error::new(io::ErrorKind::TimedOut, "no connection attempt made");
    let stream = 'connect: loop {
        match (cfg.host(), cfg.master_port).to_socket_addrs() {
            Err(e) => last_error = e,
            Ok(addrs) => {
                for a in addrs {
                    if Instant::now() >= deadline {
                        break;
                    }
                    match try_handshake(a, &token, deadline, cfg) {
                        Ok(s) => break 'connect s,
                        Err(Attempt::Retry(e)) => last_error = e,
                        Err(Attempt::Fatal(e)) => return Err(e),
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(BootstrapError::ConnectTimeout { addr, waited: cfg.connect_timeout, last_error });
        }
        thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(Duration::from_millis(250));
    };
    // Rank 0 stops waiting at most connect_timeout after it started listening, which was before
    // we connected; it then sends a welcome or the reason the rendezvous failed.
    let wait = cfg.connect_timeout.saturating_add(cfg.connect_timeout / 4).saturating_add(Duration::from_millis(500));
    let by = deadline_after(Instant::now(), wait);
    match wire::read_frame_max(&mut DeadlineReader::new(&stream, by), MAX_HANDSHAKE_REPLY) {
        Ok(Frame { kind: Kind::Welcome, .. }) => Ok(Role::Client { stream }),
        Ok(Frame { kind: Kind::Error, payload, .. }) => {
            Err(root_error_for(wire::decode_error(&payload), cfg.world_size))
        }
        Ok(f) => {
            Err(BootstrapError::Protocol(format!("rank 0 sent an unexpected {:?} frame during the rendezvous", f.kind)))
        }
        Err(e) => Err(read_failure(0, e, wait, wire::WHAT_WELCOME)),
    }
}

enum Attempt {
    Retry(io::Error),
    Fatal(BootstrapError),
}

/// Connects to `a`, answers rank 0's challenge with the hello and waits for the
/// acknowledgement. Anything that is not our rank 0 (no challenge, another version, a closed
/// connection: e.g. another job's rank 0, which drops our hello) is retried until `deadline`.
fn try_handshake(a: SocketAddr, token: &str, deadline: Instant, cfg: &TcpConfig) -> Result<TcpStream, Attempt> {
    let retry = |what: String| Attempt::Retry(io::Error::new(io::ErrorKind::InvalidData, what));
    let remaining = deadline.saturating_duration_since(Instant::now());
    let mut s = TcpStream::connect_timeout(&a, remaining.clamp(Duration::from_millis(1), Duration::from_secs(5)))
        .map_err(Attempt::Retry)?;
    let _ = s.set_nodelay(true);
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    // Rank 0 sends the challenge as soon as it accepts us.
    let mut challenge = [0u8; wire::CHALLENGE_FRAME_LEN];
    let by = (Instant::now() + HANDSHAKE_TIMEOUT).min(deadline);
    DeadlineReader::new(&s, by).read_exact(&mut challenge).map_err(|e| {
        retry(format!("{a} sent no handshake challenge ({e}): is it a detcoll rank 0 of this version?"))
    })?;
    let nonce = wire::decode_challenge(&challenge)
        .map_err(|m| retry(format!("{a} does not speak this detcoll bootstrap protocol: {m}")))?;
    let mac = token::hello_mac(token, &nonce, cfg.rank as u64, cfg.world_size as u64);
    let hello = wire::encode_hello(cfg.rank, cfg.world_size, &mac);
    wire::write_frame(&mut s, Kind::Hello, wire::PROTOCOL_VERSION, &hello).map_err(Attempt::Retry)?;
    // Rank 0 answers right after reading the hello.
    let by = deadline.max(Instant::now() + Duration::from_secs(1));
    match wire::read_frame_max(&mut DeadlineReader::new(&s, by), MAX_HANDSHAKE_REPLY) {
        Ok(Frame { kind: Kind::Ack, .. }) => Ok(s),
        Ok(Frame { kind: Kind::Error, payload, .. }) => {
            Err(Attempt::Fatal(root_error_for(wire::decode_error(&payload), cfg.world_size)))
        }
        Ok(f) => Err(Attempt::Fatal(BootstrapError::Protocol(format!(
            "{a} answered the handshake with an unexpected {:?} frame",
            f.kind
        )))),
        Err(ReadError::Malformed(m)) => Err(retry(format!("{a} does not speak the detcoll bootstrap protocol: {m}"))),
        // Rank 0 closes a hello it does not accept without a word: most likely another job's
        // rank 0 on this port, or a different DETCOLL_JOB_TOKEN.
        Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err(retry(format!(
            "{a} closed the connection without accepting the handshake (another job's rank 0 on \
             this port, or a different DETCOLL_JOB_TOKEN?)"
        ))),
        Err(ReadError::Io(e)) => Err(Attempt::Retry(e)),
    }
}

// ---------------------------------------------------------------------------------------------
// Readiness

/// For each stream, whether it is readable (data, EOF or error) within `timeout`.
#[cfg(unix)]
fn wait_readable(streams: &[&TcpStream], timeout: Duration) -> io::Result<Vec<bool>> {
    use std::os::fd::AsRawFd;
    let fds: Vec<libc::c_int> = streams.iter().map(|s| s.as_raw_fd()).collect();
    poll_fds(&fds, timeout)
}

/// Whether the listener (when given) has a connection to accept, and which pending handshakes
/// are readable, within `timeout`.
#[cfg(unix)]
fn poll_handshakes(
    listener: Option<&TcpListener>,
    streams: &[&TcpStream],
    timeout: Duration,
) -> io::Result<(bool, Vec<bool>)> {
    use std::os::fd::AsRawFd;
    let fds: Vec<libc::c_int> =
        listener.map(AsRawFd::as_raw_fd).into_iter().chain(streams.iter().map(|s| s.as_raw_fd())).collect();
    let mut ready = poll_fds(&fds, timeout)?;
    let listener_ready = listener.is_some() && ready.remove(0);
    Ok((listener_ready, ready))
}

/// poll(2) for readability of `fds` (owned by the caller's borrowed sockets).
#[cfg(unix)]
fn poll_fds(fds: &[libc::c_int], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.as_micros().div_ceil(1000).clamp(1, i32::MAX as u128) as libc::c_int;
    let nfds = libc::nfds_t::try_from(pfds.len()).map_err(|_| io::Error::other("too many descriptors to poll"))?;
    // SAFETY: `pfds` is a live, exclusively borrowed array of `nfds` initialised pollfd structs
    // for the whole call, and every fd belongs to a socket the caller borrows for that time.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), nfds, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// Without poll: report every stream readable; reads then block (bounded by their deadlines)
/// in rank order.
#[cfg(not(unix))]
fn wait_readable(streams: &[&TcpStream], _timeout: Duration) -> io::Result<Vec<bool>> {
    Ok(vec![true; streams.len()])
}

/// Without poll: sleep a little and report everything ready (the sockets are non-blocking).
#[cfg(not(unix))]
fn poll_handshakes(
    listener: Option<&TcpListener>,
    streams: &[&TcpStream],
    timeout: Duration,
) -> io::Result<(bool, Vec<bool>)> {
    thread::sleep(timeout.min(Duration::from_millis(5)));
    Ok((listener.is_some(), vec![true; streams.len()]))
}

#[cfg(test)]
mod tests {
    //! Exchange-phase faults of an authenticated peer (the handshake needs the private MAC, so
    //! these live here rather than in `tests/bootstrap_faults.rs`).
    use super::*;

    const ADDR: &str = "127.0.0.1";

    /// Rank 0 of a world of 2 on a free port, serving in a thread; returns the port and the
    /// thread running `body` on rank 0's bootstrap.
    fn root_with<T: Send + 'static>(
        timeout: Duration,
        body: impl FnOnce(TcpBootstrap) -> T + Send + 'static,
    ) -> (TcpConfig, thread::JoinHandle<Result<T, BootstrapError>>) {
        let port = TcpListener::bind((ADDR, 0)).unwrap().local_addr().unwrap().port();
        let c = TcpConfig::single_host(0, 2, ADDR, port).with_timeout(timeout).with_job_token("t");
        let c0 = c.clone();
        (TcpConfig { rank: 1, local_rank: 1, ..c }, thread::spawn(move || TcpBootstrap::new(c0).map(body)))
    }

    /// Joins as rank 1 by hand and returns the raw stream after the welcome.
    fn raw_rank_1(c: &TcpConfig) -> TcpStream {
        match join(c).unwrap() {
            Role::Client { stream } => stream,
            _ => unreachable!("rank 1 is a client"),
        }
    }

    #[test]
    fn trickling_peer_cannot_stall_the_exchange_past_its_deadline() {
        let timeout = Duration::from_millis(800);
        let (c1, root) = root_with(timeout, |b| {
            let start = Instant::now();
            (b.all_gather_bytes(b"zero"), start.elapsed())
        });
        let mut s = raw_rank_1(&c1);
        // A Data frame of 1000 bytes at one byte per 50 ms: 50 s if rank 0 waited per read.
        s.write_all(&wire::encode_frame(Kind::Data, 0, &[])[..16]).unwrap();
        s.write_all(&1000u64.to_le_bytes()).unwrap();
        let stop = Instant::now() + Duration::from_secs(5);
        while !root.is_finished() && Instant::now() < stop {
            let _ = s.write_all(&[1]);
            thread::sleep(Duration::from_millis(50));
        }
        let (r, elapsed) = root.join().unwrap().unwrap();
        assert!(matches!(r, Err(BootstrapError::PeerTimeout { rank: 1, what: wire::WHAT_EXCHANGE, .. })), "{r:?}");
        assert!(elapsed < timeout + Duration::from_millis(700), "{elapsed:?}");
    }

    #[test]
    fn huge_length_prefix_from_a_peer_is_rejected_without_allocating() {
        for (len, close) in [(1u64 << 60, false), (1u64 << 30, true)] {
            let (c1, root) = root_with(Duration::from_secs(3), |b| b.all_gather_bytes(b"zero"));
            let mut s = raw_rank_1(&c1);
            let mut h = wire::encode_frame(Kind::Data, 0, &[]);
            h[16..24].copy_from_slice(&len.to_le_bytes());
            s.write_all(&h).unwrap();
            s.write_all(b"a few bytes").unwrap();
            if close {
                s.shutdown(Shutdown::Write).unwrap();
            }
            let start = Instant::now();
            let r = root.join().unwrap().unwrap();
            if close {
                // Claimed 1 GiB, sent 11 bytes and closed: the peer is gone (the buffer held
                // what arrived, never the claimed size).
                assert!(matches!(r, Err(BootstrapError::PeerGone { rank: 1, .. })), "{r:?}");
            } else {
                assert!(
                    matches!(&r, Err(BootstrapError::Protocol(m)) if m.contains("rank 1") && m.contains("exceeds")),
                    "{r:?}"
                );
            }
            assert!(start.elapsed() < Duration::from_secs(2));
        }
    }
}
