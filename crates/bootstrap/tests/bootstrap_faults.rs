//! Fault injection into the TCP rendezvous (no GPU): strangers on rank 0's port — an intruder
//! with the wrong job token, a second job on the same port, garbage, bad magic, another
//! protocol version, truncated frames, huge length prefixes, idle, trickling and flooding
//! connections — must neither join the group nor stall it: the real ranks complete with their
//! own payloads, and without them rank 0 fails within its bound naming every missing rank.
//!
//! Ranks are threads of this process on 127.0.0.1; strangers are threads that write the wire
//! format by hand (see `bootstrap::wire`'s documentation).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use detcoll_bootstrap::{Bootstrap, BootstrapError, TcpBootstrap, TcpConfig};

const ADDR: &str = "127.0.0.1";
const TOKEN: &str = "the-real-job";
/// What timing bounds may exceed the configured timeout by (a loaded 2-core CI machine).
const MARGIN: Duration = Duration::from_millis(900);
/// How long strangers run before the real ranks (other than rank 0) start.
const HEAD_START: Duration = Duration::from_millis(300);

fn free_port() -> u16 {
    TcpListener::bind((ADDR, 0)).unwrap().local_addr().unwrap().port()
}

fn cfg(rank: usize, world: usize, port: u16, token: &str, timeout: Duration) -> TcpConfig {
    TcpConfig::single_host(rank, world, ADDR, port).with_timeout(timeout).with_job_token(token)
}

fn payload(rank: usize) -> Vec<u8> {
    format!("payload of real rank {rank}").into_bytes()
}

fn real_payloads(world: usize) -> Vec<Vec<u8>> {
    (0..world).map(payload).collect()
}

/// One real rank: join, exchange its payload twice (the second proves the group still works).
fn real_rank(c: TcpConfig) -> Result<Vec<Vec<u8>>, BootstrapError> {
    let b = TcpBootstrap::new(c)?;
    let first = b.all_gather_bytes(&payload(b.rank()))?;
    let second = b.all_gather_bytes(&payload(b.rank()))?;
    assert_eq!(first, second);
    Ok(first)
}

// ---------------------------------------------------------------------------------------------
// Strangers

/// A hand-written frame header (`magic`, `kind`, 3 zero bytes, `seq`, `len`).
fn header(magic: &[u8; 4], kind: u8, seq: u64, len: u64) -> Vec<u8> {
    let mut h = magic.to_vec();
    h.push(kind);
    h.extend_from_slice(&[0; 3]);
    h.extend_from_slice(&seq.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h
}

const MAGIC: &[u8; 4] = b"DCBS";
const HELLO: u8 = 1;
const DATA: u8 = 4;
const VERSION: u64 = 2;
const HELLO_LEN: u64 = 48;

/// A hello of the current version claiming `rank` of `world` with a made-up MAC.
fn forged_hello(rank: u64, world: u64) -> Vec<u8> {
    let mut f = header(MAGIC, HELLO, VERSION, HELLO_LEN);
    f.extend_from_slice(&rank.to_le_bytes());
    f.extend_from_slice(&world.to_le_bytes());
    f.extend_from_slice(&[0x5a; 32]);
    f
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stranger {
    /// 100 connections that never send anything, held open.
    Idle100,
    /// One byte every 100 ms, forever (reconnecting when dropped).
    Trickle,
    /// Connect and close in a loop.
    Flood,
    /// Megabytes of garbage per connection.
    Garbage,
    /// A frame with the wrong magic.
    BadMagic,
    /// Version 1 hellos (the old protocol: no challenge, no MAC) and version 3 hellos.
    WrongVersion,
    /// A hello with the right header, cut off halfway, then silence.
    Truncated,
    /// Hello and data headers claiming 2^60 and 2^30 payload bytes, followed by a few bytes.
    HugeLength,
    /// Right magic, version and size, a free rank, a MAC that is not the job's.
    ForgedHello,
}

const ALL: [Stranger; 9] = [
    Stranger::Idle100,
    Stranger::Trickle,
    Stranger::Flood,
    Stranger::Garbage,
    Stranger::BadMagic,
    Stranger::WrongVersion,
    Stranger::Truncated,
    Stranger::HugeLength,
    Stranger::ForgedHello,
];

/// Strangers running against a port until dropped; `connections` counts the connections they
/// got established (so a test can tell they really reached rank 0).
struct Strangers {
    stop: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Strangers {
    fn start(port: u16, kinds: &[Stranger]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let threads = kinds
            .iter()
            .map(|&kind| {
                let (stop, connections) = (Arc::clone(&stop), Arc::clone(&connections));
                thread::spawn(move || stranger(kind, port, &stop, &connections))
            })
            .collect();
        Self { stop, connections, threads }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Strangers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn connect(port: u16, stop: &AtomicBool, connections: &AtomicUsize) -> Option<TcpStream> {
    while !stop.load(Ordering::SeqCst) {
        if let Ok(s) = TcpStream::connect((ADDR, port)) {
            connections.fetch_add(1, Ordering::SeqCst);
            return Some(s);
        }
        thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Sends `bytes`, then waits (reading whatever comes, e.g. the challenge) until rank 0 closes
/// the connection or `stop`.
fn send_and_linger(mut s: TcpStream, bytes: &[u8], stop: &AtomicBool) {
    if s.write_all(bytes).is_err() {
        return;
    }
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut sink = [0u8; 256];
    while !stop.load(Ordering::SeqCst) {
        match s.read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

fn stranger(kind: Stranger, port: u16, stop: &AtomicBool, connections: &AtomicUsize) {
    match kind {
        Stranger::Idle100 => {
            let mut held = Vec::new();
            while held.len() < 100 {
                match connect(port, stop, connections) {
                    Some(s) => held.push(s),
                    None => return,
                }
            }
            while !stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(10));
            }
        }
        Stranger::Trickle => {
            while let Some(mut s) = connect(port, stop, connections) {
                let mut i = 0u8;
                while !stop.load(Ordering::SeqCst) && s.write_all(&[i]).is_ok() {
                    i = i.wrapping_add(1);
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Stranger::Flood => {
            while let Some(s) = connect(port, stop, connections) {
                let _ = s.shutdown(Shutdown::Both);
                drop(s);
                thread::sleep(Duration::from_micros(200));
            }
        }
        Stranger::Garbage => {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let chunk: Vec<u8> = (0..64 * 1024)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            while let Some(mut s) = connect(port, stop, connections) {
                for _ in 0..64 {
                    // 4 MiB per connection, unless rank 0 hangs up first (it should).
                    if stop.load(Ordering::SeqCst) || s.write_all(&chunk).is_err() {
                        break;
                    }
                }
            }
        }
        Stranger::BadMagic => {
            let mut f = forged_hello(1, 4);
            f[..4].copy_from_slice(b"HTTP");
            while let Some(s) = connect(port, stop, connections) {
                send_and_linger(s, &f, stop);
            }
        }
        Stranger::WrongVersion => {
            let mut v1 = header(MAGIC, HELLO, 1, 16);
            v1.extend_from_slice(&1u64.to_le_bytes());
            v1.extend_from_slice(&4u64.to_le_bytes());
            let mut v3 = forged_hello(1, 4);
            v3[8..16].copy_from_slice(&3u64.to_le_bytes());
            let mut n = 0usize;
            while let Some(s) = connect(port, stop, connections) {
                send_and_linger(s, if n.is_multiple_of(2) { &v1 } else { &v3 }, stop);
                n += 1;
            }
        }
        Stranger::Truncated => {
            let f = forged_hello(1, 4);
            while let Some(s) = connect(port, stop, connections) {
                send_and_linger(s, &f[..40], stop);
            }
        }
        Stranger::HugeLength => {
            let frames: Vec<Vec<u8>> = [(HELLO, 1u64 << 60), (HELLO, 1 << 30), (DATA, 1 << 60), (DATA, 1 << 30)]
                .into_iter()
                .map(|(kind, len)| {
                    let mut f = header(MAGIC, kind, VERSION, len);
                    f.extend_from_slice(&[0xab; 100]);
                    f
                })
                .collect();
            let mut n = 0usize;
            while let Some(s) = connect(port, stop, connections) {
                send_and_linger(s, &frames[n % frames.len()], stop);
                n += 1;
            }
        }
        Stranger::ForgedHello => {
            let f = forged_hello(1, 4);
            while let Some(s) = connect(port, stop, connections) {
                send_and_linger(s, &f, stop);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios

/// A world-4 job with `strangers` started against rank 0 first; the other ranks start
/// [`HEAD_START`] later. Asserts the job completes with the real payloads, well before its
/// timeout, and that the strangers did reach rank 0.
fn job_completes_despite(kinds: &[Stranger]) {
    let world = 4;
    let timeout = Duration::from_secs(3);
    let port = free_port();
    let start = Instant::now();
    let (results, connections) = thread::scope(|s| {
        let root = s.spawn(move || real_rank(cfg(0, world, port, TOKEN, timeout)));
        let strangers = Strangers::start(port, kinds);
        thread::sleep(HEAD_START);
        let others: Vec<_> =
            (1..world).map(|r| s.spawn(move || real_rank(cfg(r, world, port, TOKEN, timeout)))).collect();
        let mut results = vec![root.join().unwrap()];
        results.extend(others.into_iter().map(|h| h.join().unwrap()));
        (results, strangers.connections())
    });
    let elapsed = start.elapsed();
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(parts) => assert_eq!(parts, real_payloads(world), "rank {r} got a stranger's bytes"),
            Err(e) => panic!("rank {r} failed with strangers {kinds:?} on the port: {e}"),
        }
    }
    assert!(connections > 0, "the strangers {kinds:?} never reached rank 0");
    // The real ranks are handled as soon as they arrive: no stranger costs rank 0 a
    // handshake timeout (before the non-blocking rendezvous, one trickling connection held it
    // for 2.4 s, each idle one for up to 5 s).
    let bound = HEAD_START + MARGIN;
    assert!(
        elapsed < bound,
        "the job took {elapsed:?} (bound {bound:?}, timeout {timeout:?}) with strangers {kinds:?}"
    );
}

#[test]
fn faults_100_idle_connections_do_not_stall_rank_0() {
    job_completes_despite(&[Stranger::Idle100]);
}

#[test]
fn faults_trickling_connection_does_not_stall_rank_0() {
    job_completes_despite(&[Stranger::Trickle]);
}

#[test]
fn faults_flooding_connector_does_not_stall_rank_0() {
    job_completes_despite(&[Stranger::Flood]);
}

#[test]
fn faults_megabytes_of_garbage_are_dropped() {
    job_completes_despite(&[Stranger::Garbage]);
}

#[test]
fn faults_bad_magic_is_dropped() {
    job_completes_despite(&[Stranger::BadMagic]);
}

#[test]
fn faults_wrong_protocol_version_is_dropped_not_fatal() {
    job_completes_despite(&[Stranger::WrongVersion]);
}

#[test]
fn faults_truncated_hello_is_dropped() {
    job_completes_despite(&[Stranger::Truncated]);
}

#[test]
fn faults_huge_length_prefixes_are_dropped() {
    job_completes_despite(&[Stranger::HugeLength]);
}

#[test]
fn faults_forged_hello_for_a_free_rank_is_dropped() {
    job_completes_despite(&[Stranger::ForgedHello]);
}

#[test]
fn faults_all_strangers_together_real_ranks_still_complete() {
    job_completes_despite(&ALL);
}

#[test]
fn faults_without_real_ranks_rank_0_fails_in_bound_naming_all_missing() {
    let world = 4;
    let timeout = Duration::from_millis(1500);
    let port = free_port();
    let start = Instant::now();
    let (e, connections) = thread::scope(|s| {
        let root = s.spawn(move || TcpBootstrap::new(cfg(0, world, port, TOKEN, timeout)).map(|_| ()));
        let strangers = Strangers::start(port, &ALL);
        let e = root.join().unwrap().unwrap_err();
        (e, strangers.connections())
    });
    let elapsed = start.elapsed();
    match &e {
        BootstrapError::MissingRanks { ranks, waited } => {
            assert_eq!(ranks, &[1, 2, 3], "{e}");
            assert_eq!(*waited, timeout);
        }
        other => panic!("expected MissingRanks, got {other}"),
    }
    assert_eq!(e.culprit(), Some(1));
    assert!(e.to_string().contains("[1, 2, 3]"), "{e}");
    assert!(connections > 0);
    assert!(elapsed >= timeout && elapsed < timeout + MARGIN, "rank 0 failed after {elapsed:?} (bound {timeout:?})");
}

#[test]
fn faults_missing_ranks_are_named_on_every_rank() {
    // World 4, ranks 2 and 3 never start: rank 0 and rank 1 both report both of them.
    let world = 4;
    let timeout = Duration::from_millis(1000);
    let port = free_port();
    let start = Instant::now();
    let results: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| s.spawn(move || TcpBootstrap::new(cfg(r, world, port, TOKEN, timeout)).map(|_| ())))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(start.elapsed() < timeout + MARGIN, "{:?}", start.elapsed());
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Err(BootstrapError::MissingRanks { ranks, .. }) => assert_eq!(ranks, vec![2, 3], "rank {r}"),
            other => panic!("rank {r}: expected MissingRanks, got {other:?}"),
        }
    }
}

#[test]
fn faults_intruder_with_wrong_token_is_dropped_and_times_out() {
    // The intruder is a well-behaved client of the right version claiming free rank 1 with the
    // wrong token; it starts before the real rank 1. (Before job tokens it was accepted as rank
    // 1, its bytes became rank 1's payload, and the real rank 1 was rejected.)
    let world = 3;
    let timeout = Duration::from_secs(3);
    let intruder_timeout = Duration::from_millis(1500);
    let port = free_port();
    let (results, intruder, intruder_elapsed) = thread::scope(|s| {
        let root = s.spawn(move || real_rank(cfg(0, world, port, TOKEN, timeout)));
        let intruder = s.spawn(move || {
            let start = Instant::now();
            let r = TcpBootstrap::new(cfg(1, world, port, "not-the-job", intruder_timeout)).map(|_| ());
            (r, start.elapsed())
        });
        thread::sleep(HEAD_START);
        let others: Vec<_> =
            (1..world).map(|r| s.spawn(move || real_rank(cfg(r, world, port, TOKEN, timeout)))).collect();
        let mut results = vec![root.join().unwrap()];
        results.extend(others.into_iter().map(|h| h.join().unwrap()));
        let (intruder, elapsed) = intruder.join().unwrap();
        (results, intruder, elapsed)
    });
    for (r, res) in results.into_iter().enumerate() {
        assert_eq!(res.unwrap_or_else(|e| panic!("rank {r}: {e}")), real_payloads(world), "rank {r}");
    }
    match intruder {
        Err(BootstrapError::ConnectTimeout { waited, last_error, .. }) => {
            assert_eq!(waited, intruder_timeout);
            // Dropped by rank 0 while it served; refused once it completed and stopped listening.
            assert!(
                last_error.to_string().contains("without accepting the handshake")
                    || last_error.kind() == std::io::ErrorKind::ConnectionRefused,
                "{last_error}"
            );
        }
        other => panic!("the intruder should time out, got {other:?}"),
    }
    assert!(intruder_elapsed < intruder_timeout + MARGIN, "{intruder_elapsed:?}");
}

#[test]
fn faults_second_job_on_the_same_port_never_joins_the_first() {
    // Job B (another token) starts on job A's port while A's rank 0 serves and before A's other
    // ranks: B's rank 0 cannot bind, B's ranks 1 and 2 are dropped by A's rank 0 and time out;
    // A completes with its own payloads.
    let world = 3;
    let timeout = Duration::from_secs(3);
    let b_timeout = Duration::from_millis(1500);
    let port = free_port();
    let (a, b) = thread::scope(|s| {
        let a0 = s.spawn(move || real_rank(cfg(0, world, port, TOKEN, timeout)));
        thread::sleep(Duration::from_millis(100));
        let b: Vec<_> = (0..world)
            .map(|r| {
                s.spawn(move || {
                    let start = Instant::now();
                    (real_rank(cfg(r, world, port, "job-b", b_timeout)), start.elapsed())
                })
            })
            .collect();
        thread::sleep(HEAD_START);
        let a_others: Vec<_> =
            (1..world).map(|r| s.spawn(move || real_rank(cfg(r, world, port, TOKEN, timeout)))).collect();
        let mut a = vec![a0.join().unwrap()];
        a.extend(a_others.into_iter().map(|h| h.join().unwrap()));
        let b: Vec<_> = b.into_iter().map(|h| h.join().unwrap()).collect();
        (a, b)
    });
    for (r, res) in a.into_iter().enumerate() {
        assert_eq!(res.unwrap_or_else(|e| panic!("job A rank {r}: {e}")), real_payloads(world), "job A rank {r}");
    }
    for (r, (res, elapsed)) in b.into_iter().enumerate() {
        match res {
            Err(BootstrapError::Io { source, .. }) if r == 0 => {
                assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
            }
            Err(BootstrapError::ConnectTimeout { .. }) if r > 0 => {
                assert!(elapsed < b_timeout + MARGIN, "job B rank {r} took {elapsed:?}");
            }
            other => panic!("job B rank {r}: {other:?}"),
        }
    }
}
