//! TCP bootstrap: rank 0 serves, every other rank keeps one connection to it.
//!
//! Construction is collective. Rank 0 listens at `MASTER_ADDR:MASTER_PORT` and accepts
//! `world_size - 1` connections until `connect_timeout`; each other rank connects, retrying while
//! rank 0 is not up yet, and sends a handshake (magic, protocol version, rank, world size). Rank 0
//! rejects a mismatched world size, a duplicate or out-of-range rank, and then fails the whole
//! group: every rank's constructor returns the same error. When every rank has connected, rank 0
//! sends a welcome and every constructor returns.
//!
//! `all_gather_bytes`: each other rank sends one length-prefixed frame carrying the exchange
//! number; rank 0 waits (bounded by `exchange_timeout`) for all of them, and sends back the
//! concatenation. If a rank's connection closes, it sends the wrong exchange number, or it does
//! not contribute in time, rank 0 sends an error frame naming it to every other rank, so every
//! rank reports the same culprit. Non-zero ranks wait 1.5 × `exchange_timeout` for rank 0's
//! answer, so rank 0's diagnosis arrives before their own timeout fires.
//!
//! Binding: when `MASTER_ADDR` is a loopback IP or `localhost`, rank 0 listens there; otherwise
//! it listens on the wildcard address (IPv4, or IPv6 for IPv6-only addresses) at `MASTER_PORT`:
//! a host name may resolve to `127.0.1.1` on its own host while other nodes reach it through
//! its public address.
//! With `world_size == 1` nothing is bound.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{self, Frame, Kind, ReadError};
use super::{
    Bootstrap, BootstrapError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_EXCHANGE_TIMEOUT, TorchrunEnv, validate_layout,
};

/// Configuration of a [`TcpBootstrap`].
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// How long non-zero ranks retry connecting, and how long rank 0 waits for all of them.
    pub connect_timeout: Duration,
    /// How long one exchange waits for every rank's contribution.
    pub exchange_timeout: Duration,
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
    exchange_timeout: Duration,
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
    /// From the torchrun variables `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
    /// `MASTER_ADDR`, `MASTER_PORT` (see [`TorchrunEnv`]). `DETCOLL_BOOTSTRAP_TIMEOUT_MS`, when
    /// set, is used for both the connect and the per-exchange timeout; defaults are 60 000 ms to
    /// connect and 30 000 ms per exchange.
    pub fn from_env() -> Result<Self, BootstrapError> {
        Self::new(TorchrunEnv::from_env()?.tcp_config())
    }

    /// Joins (or, on rank 0, serves) the rendezvous. Returns when every rank has connected, or
    /// with the error that made the group fail.
    pub fn new(cfg: TcpConfig) -> Result<Self, BootstrapError> {
        validate_layout(cfg.rank, cfg.world_size, cfg.local_rank, cfg.local_world_size)?;
        if cfg.master_port == 0 {
            return Err(BootstrapError::InvalidConfig {
                detail: "master port 0: the other ranks could not find rank 0".into(),
            });
        }
        if cfg.connect_timeout.is_zero() || cfg.exchange_timeout.is_zero() {
            return Err(BootstrapError::InvalidConfig { detail: "bootstrap timeouts must be non-zero".into() });
        }
        let role = if cfg.world_size == 1 {
            Role::Single
        } else if cfg.rank == 0 {
            serve(&cfg)?
        } else {
            join(&cfg)?
        };
        Ok(Self {
            rank: cfg.rank,
            world_size: cfg.world_size,
            local_rank: cfg.local_rank,
            local_world_size: cfg.local_world_size,
            addr: cfg.addr(),
            exchange_timeout: cfg.exchange_timeout,
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
        let deadline = Instant::now() + timeout;
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
                let s = peers[r].as_mut().expect("connected peer");
                let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
                set_read_timeout(s, remaining);
                match wire::read_frame(s) {
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
        let wait = self.exchange_timeout + self.exchange_timeout / 2;
        let _ = stream.set_write_timeout(Some(wait));
        if let Err(e) = wire::write_frame(stream, Kind::Data, seq, mine) {
            // Rank 0 may have failed and told us why before closing: prefer its diagnosis.
            set_read_timeout(stream, Duration::from_millis(200));
            if let Ok(Frame { kind: Kind::Error, payload, .. }) = wire::read_frame(stream) {
                return Err(self.root_error(wire::decode_error(&payload)));
            }
            return Err(if wire::is_timeout(&e) {
                BootstrapError::PeerTimeout { rank: 0, waited: wait, what: wire::WHAT_ACCEPT }
            } else {
                BootstrapError::PeerGone { rank: 0, detail: format!("sending to {} failed: {e}", self.addr) }
            });
        }
        set_read_timeout(stream, wait);
        match wire::read_frame(stream) {
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
        root_error_for(e, self.rank, self.world_size)
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

/// An error decoded from rank 0, seen from rank `me` with world size `my_world`.
fn root_error_for(e: BootstrapError, me: usize, my_world: usize) -> BootstrapError {
    match e {
        // Rank 0 reports (offender, rank 0's world, offender's world); if we are the offender,
        // the other side is rank 0.
        BootstrapError::WorldSizeMismatch { rank, ours, theirs } if rank == me && theirs == my_world => {
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

fn set_read_timeout(s: &TcpStream, d: Duration) {
    let _ = s.set_read_timeout(Some(d.max(Duration::from_millis(1))));
}

// ---------------------------------------------------------------------------------------------
// Rank 0

fn bind_listener(cfg: &TcpConfig) -> Result<TcpListener, BootstrapError> {
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

enum Incoming {
    Peer {
        rank: usize,
        world: usize,
        stream: TcpStream,
    },
    /// Not a detcoll bootstrap client (or it went away during the handshake): ignore.
    Ignore,
    Fatal(BootstrapError),
}

fn handshake_in(stream: TcpStream, deadline: Instant) -> Incoming {
    let mut stream = stream;
    if stream.set_nonblocking(false).is_err() {
        return Incoming::Ignore;
    }
    let _ = stream.set_nodelay(true);
    let wait =
        deadline.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(50), Duration::from_secs(5));
    set_read_timeout(&stream, wait);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    match wire::read_frame(&mut stream) {
        Ok(Frame { kind: Kind::Hello, seq: version, payload }) => {
            if version != wire::PROTOCOL_VERSION {
                let e = BootstrapError::Protocol(format!(
                    "a rank speaks bootstrap protocol version {version}, rank 0 speaks {} \
                     (different detcoll builds?)",
                    wire::PROTOCOL_VERSION
                ));
                let _ = wire::write_frame(&mut stream, Kind::Error, 0, &wire::encode_error(&e));
                return Incoming::Fatal(e);
            }
            match wire::decode_hello(&payload) {
                Ok((rank, world)) => Incoming::Peer { rank, world, stream },
                Err(_) => Incoming::Ignore,
            }
        }
        _ => Incoming::Ignore,
    }
}

fn serve(cfg: &TcpConfig) -> Result<Role, BootstrapError> {
    let world = cfg.world_size;
    let deadline = Instant::now() + cfg.connect_timeout;
    let listener = bind_listener(cfg)?;
    listener.set_nonblocking(true).map_err(|e| BootstrapError::io("rank 0: configuring the listener", e))?;
    let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut connected = 0usize;
    let outcome: Result<(), BootstrapError> = loop {
        if connected == world - 1 {
            break Ok(());
        }
        match listener.accept() {
            Ok((stream, _from)) => match handshake_in(stream, deadline) {
                Incoming::Ignore => {}
                Incoming::Fatal(e) => break Err(e),
                Incoming::Peer { rank, world: theirs, mut stream } => {
                    let reject = if theirs != world {
                        Some(BootstrapError::WorldSizeMismatch { rank, ours: world, theirs })
                    } else if rank >= world {
                        Some(BootstrapError::RankOutOfRange { rank, world })
                    } else if rank == 0 || peers[rank].is_some() {
                        Some(BootstrapError::DuplicateRank { rank })
                    } else {
                        None
                    };
                    if let Some(e) = reject {
                        let _ = wire::write_frame(&mut stream, Kind::Error, 0, &wire::encode_error(&e));
                        let _ = stream.shutdown(Shutdown::Write);
                        break Err(e);
                    }
                    if wire::write_frame(&mut stream, Kind::Ack, 0, &[]).is_ok() {
                        peers[rank] = Some(stream);
                        connected += 1;
                    }
                    // else: it went away; if it retries, it is accepted then.
                }
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = (1..world).find(|&r| peers[r].is_none()).unwrap_or(1);
                    break Err(BootstrapError::PeerTimeout {
                        rank: missing,
                        waited: cfg.connect_timeout,
                        what: wire::WHAT_CONNECT,
                    });
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) => {}
            Err(e) => {
                break Err(BootstrapError::io(format!("rank 0: accepting connections at {}", cfg.addr()), e));
            }
        }
    };
    drop(listener);
    if let Err(e) = outcome {
        abort_peers(&mut peers, &e, 0);
        return Err(e);
    }
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
    let deadline = start + cfg.connect_timeout;
    let addr = cfg.addr();
    let hello = wire::encode_hello(cfg.rank, cfg.world_size);
    let mut backoff = Duration::from_millis(10);
    let mut last_error = io::Error::new(io::ErrorKind::TimedOut, "no connection attempt made");
    let mut stream = 'connect: loop {
        match (cfg.host(), cfg.master_port).to_socket_addrs() {
            Err(e) => last_error = e,
            Ok(addrs) => {
                for a in addrs {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        break;
                    }
                    match try_handshake(a, &hello, remaining, cfg) {
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
    let wait = cfg.connect_timeout + cfg.connect_timeout / 4 + Duration::from_millis(500);
    set_read_timeout(&stream, wait);
    match wire::read_frame(&mut stream) {
        Ok(Frame { kind: Kind::Welcome, .. }) => Ok(Role::Client { stream }),
        Ok(Frame { kind: Kind::Error, payload, .. }) => {
            Err(root_error_for(wire::decode_error(&payload), cfg.rank, cfg.world_size))
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

/// Connects to `a`, sends the hello and waits for the acknowledgement.
fn try_handshake(a: SocketAddr, hello: &[u8], remaining: Duration, cfg: &TcpConfig) -> Result<TcpStream, Attempt> {
    let mut s = TcpStream::connect_timeout(&a, remaining.min(Duration::from_secs(5))).map_err(Attempt::Retry)?;
    let _ = s.set_nodelay(true);
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    wire::write_frame(&mut s, Kind::Hello, wire::PROTOCOL_VERSION, hello).map_err(Attempt::Retry)?;
    // Rank 0 answers right after reading the hello (it may be handshaking with another rank).
    set_read_timeout(&s, remaining.max(Duration::from_secs(1)));
    match wire::read_frame(&mut s) {
        Ok(Frame { kind: Kind::Ack, .. }) => Ok(s),
        Ok(Frame { kind: Kind::Error, payload, .. }) => {
            Err(Attempt::Fatal(root_error_for(wire::decode_error(&payload), cfg.rank, cfg.world_size)))
        }
        Ok(f) => Err(Attempt::Fatal(BootstrapError::Protocol(format!(
            "{a} answered the handshake with an unexpected {:?} frame",
            f.kind
        )))),
        // Not our rank 0 (or it went away before answering): keep trying until the deadline.
        Err(ReadError::Malformed(m)) => Err(Attempt::Retry(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{a} does not speak the detcoll bootstrap protocol: {m}"),
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
    let mut fds: Vec<libc::pollfd> =
        streams.iter().map(|s| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.as_micros().div_ceil(1000).clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live, exclusively borrowed array of `fds.len()` initialised pollfd
    // structs for the whole call, and every fd belongs to a TcpStream borrowed for that time.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; streams.len()]);
        }
        return Err(e);
    }
    Ok(fds.iter().map(|p| p.revents != 0).collect())
}

/// Without poll: report every stream readable; reads then block (bounded by their timeouts)
/// in rank order.
#[cfg(not(unix))]
fn wait_readable(streams: &[&TcpStream], _timeout: Duration) -> io::Result<Vec<bool>> {
    Ok(vec![true; streams.len()])
}
