//! The control plane at scale: a TCP rendezvous of 1024 ranks (threads of this process on
//! 127.0.0.1, built with the constructors users call), an all_gather of a few hundred bytes per
//! rank (the size of the factory's agreement facts), a barrier, and `split` into the groups a
//! hierarchical route builds — 128 node-local groups of 8 (`rank / 8`) and 8 cross-node groups
//! of 128 (`rank % 8`), over TCP as processes would use them — with an all_gather in each
//! group, every result checked bit for bit on every rank. While the ranks connect, strangers
//! (a client with another job token, raw connections that send garbage or nothing) are on
//! rank 0's port: they must be dropped, and the rendezvous must still complete within its bound.
//!
//! One process holds both ends of every connection (about 6 000 descriptors at 1024 ranks):
//! the test raises its soft `RLIMIT_NOFILE` as far as that needs (`reserve_descriptors`), and
//! with a hard limit too low it prints `skipped: ...` saying so.
//!
//! `measure_control_plane` (ignored) prints the time of the rendezvous, one all_gather and
//! the split for 8 to 1024 ranks:
//!
//! ```text
//! cargo test --release -p detcoll-bootstrap --test bootstrap_scale -- --ignored --nocapture
//! ```

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use detcoll_bootstrap::{
    Bootstrap, BootstrapError, GroupTransport, SplitOptions, SubBootstrap, TcpBootstrap, TcpConfig,
    reserve_descriptors, split_with,
};

const ADDR: &str = "127.0.0.1";
const TOKEN: &str = "bootstrap-scale-job";
const WORLD: usize = 1024;
/// Ranks per node of the hierarchical layout.
const NODE: usize = 8;
/// The rendezvous bound (rank 0 waits this long for everyone; the others retry this long).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(50);
/// The bound of one exchange.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Stack of a rank thread: the bootstrap needs little, and 1024 default stacks are 2 GiB of
/// address space.
const RANK_STACK: usize = 256 * 1024;
/// Bytes of the challenge rank 0 sends every connection it accepts (a 24-byte frame header and
/// a 32-byte nonce; see `bootstrap::wire`).
const CHALLENGE_LEN: usize = 56;

fn free_port() -> u16 {
    TcpListener::bind((ADDR, 0)).unwrap().local_addr().unwrap().port()
}

fn cfg(rank: usize, world: usize, port: u16, token: &str) -> TcpConfig {
    let mut c = TcpConfig::single_host(rank, world, ADDR, port).with_job_token(token);
    c.connect_timeout = CONNECT_TIMEOUT;
    c.exchange_timeout = EXCHANGE_TIMEOUT;
    c
}

/// A rank's contribution: 300 to 499 bytes, distinct per rank and tag (like the serde JSON
/// facts of the factory's agreement).
fn payload(rank: usize, tag: u8) -> Vec<u8> {
    let mut x = (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(tag);
    (0..300 + (rank * 37) % 200)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Descriptors `world` thread ranks hold with the parent and both splits alive: both ends of
/// every connection, a listener per group, and room for the strangers and rank 0's pending
/// handshakes.
fn fds_needed(world: usize) -> usize {
    let groups = |size: usize| (world / size) * (2 * (size - 1) + 1);
    2 * world + groups(NODE) + groups(world / NODE) + 512
}

// ---------------------------------------------------------------------------------------------
// One rank

/// What one rank saw, checked on its own thread; `Err` describes the first difference.
fn rank_body(b: &TcpBootstrap, want: &[Vec<u8>]) -> Result<(SubBootstrap, SubBootstrap), String> {
    let (r, world) = (b.rank(), b.world_size());
    let got = b.all_gather_bytes(&want[r]).map_err(|e| format!("rank {r}: all_gather: {e}"))?;
    if got != want {
        return Err(format!("rank {r}: the all_gather result differs from every rank's bytes in rank order"));
    }
    drop(got);
    b.barrier().map_err(|e| format!("rank {r}: barrier: {e}"))?;
    let opts = SplitOptions { transport: GroupTransport::Tcp, ..SplitOptions::default() };
    let split = |color: usize, what: &str| {
        split_with(b, Some(color as u32), r as u32, &opts)
            .map_err(|e| format!("rank {r}: split into {what} groups: {e}"))?
            .ok_or_else(|| format!("rank {r}: no {what} group"))
    };
    let node = split(r / NODE, "node-local")?;
    let cross = split(r % NODE, "cross-node")?;
    for (g, what, members) in [
        (&node, "node-local", (r / NODE * NODE..r / NODE * NODE + NODE).collect::<Vec<_>>()),
        (&cross, "cross-node", (r % NODE..world).step_by(NODE).collect()),
    ] {
        let pos = members.iter().position(|&m| m == r).expect("a member of its group");
        if g.parent_ranks() != members || g.rank() != pos || g.world_size() != members.len() || !g.is_tcp() {
            return Err(format!(
                "rank {r}: {what} group {:?} (rank {} of {}, tcp {}), expected {members:?} (rank {pos})",
                g.parent_ranks(),
                g.rank(),
                g.world_size(),
                g.is_tcp()
            ));
        }
        let tag = if what == "node-local" { 1 } else { 2 };
        let got = g.all_gather_bytes(&payload(r, tag)).map_err(|e| format!("rank {r}: {what} all_gather: {e}"))?;
        let want: Vec<Vec<u8>> = members.iter().map(|&m| payload(m, tag)).collect();
        if got != want {
            return Err(format!("rank {r}: the {what} all_gather differs from its members' bytes in group order"));
        }
    }
    Ok((node, cross))
}

// ---------------------------------------------------------------------------------------------
// Strangers

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stranger {
    /// Connects and sends nothing.
    Silent,
    /// Connects and sends 64 KiB of garbage.
    Garbage,
}

/// What a raw stranger saw: whether it got a connection and the bytes rank 0 sent it before
/// the connection ended.
#[derive(Debug)]
struct Seen {
    connected: bool,
    received: Vec<u8>,
    ended: bool,
}

/// How long a stranger keeps its connection after rank 0's rendezvous completed (rank 0 has
/// closed it by then, unless the kernel completed the connection but rank 0 never accepted it).
const STRANGER_GRACE: Duration = Duration::from_secs(2);

/// A raw connection to rank 0's port: connects, behaves as `kind`, and reads until rank 0
/// closes the connection, or [`STRANGER_GRACE`] after rank 0's rendezvous completed (`done`).
fn stranger(kind: Stranger, port: u16, done: &OnceLock<Instant>) -> Seen {
    let over = || done.get().is_some_and(|t| t.elapsed() > STRANGER_GRACE);
    let mut seen = Seen { connected: false, received: Vec::new(), ended: false };
    let mut s = loop {
        match TcpStream::connect((ADDR, port)) {
            Ok(s) => break s,
            Err(_) if !over() => thread::sleep(Duration::from_millis(5)),
            Err(_) => return seen,
        }
    };
    seen.connected = true;
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    if kind == Stranger::Garbage {
        let junk: Vec<u8> = payload(usize::from(port), 0xff).into_iter().cycle().take(64 * 1024).collect();
        let _ = s.write_all(&junk);
    }
    let mut buf = [0u8; 4096];
    while !over() {
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
        match s.read(&mut buf) {
            Ok(0) => {
                seen.ended = true;
                break;
            }
            Ok(n) => seen.received.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            // Reset: rank 0 closed with our garbage unread.
            Err(_) => {
                seen.ended = true;
                break;
            }
        }
    }
    seen
}

// ---------------------------------------------------------------------------------------------
// The test

#[test]
fn rendezvous_of_1024_ranks_gathers_splits_and_drops_strangers() {
    // Both ends of every connection are in this process.
    if let Err(e) = reserve_descriptors(fds_needed(WORLD)) {
        println!("skipped: {WORLD} ranks as threads of one process: {e}");
        return;
    }
    let port = free_port();
    let want: Vec<Vec<u8>> = (0..WORLD).map(|r| payload(r, 0)).collect();
    let start = Instant::now();
    let rendezvous_done = OnceLock::new();
    let (results, elapsed, seen, intruder) = thread::scope(|s| {
        let done = &rendezvous_done;
        let rank = |r: usize| {
            let want = &want;
            thread::Builder::new()
                .name(format!("rank-{r}"))
                .stack_size(RANK_STACK)
                .spawn_scoped(s, move || {
                    let b = TcpBootstrap::new(cfg(r, WORLD, port, TOKEN));
                    if r == 0 {
                        let _ = done.set(Instant::now());
                    }
                    let b = b.map_err(|e| format!("rank {r}: rendezvous: {e}"))?;
                    // Keep the groups until every rank has checked its own (a group whose
                    // member is gone fails its peers' exchanges).
                    rank_body(&b, want).map(|groups| (b, groups))
                })
                .expect("spawn a rank thread")
        };
        let mut handles = vec![rank(0)];
        // First wave of strangers: on the port before any other rank.
        let mut strangers: Vec<_> = [Stranger::Silent, Stranger::Garbage, Stranger::Silent, Stranger::Garbage]
            .into_iter()
            .map(|k| (k, true, s.spawn(move || stranger(k, port, done))))
            .collect();
        // A client of another job claiming a free rank: it must never be admitted.
        let intruder = s.spawn(move || {
            let mut c = cfg(WORLD / 2, WORLD, port, "another-job");
            c.connect_timeout = Duration::from_secs(5);
            TcpBootstrap::new(c).map(|_| ())
        });
        for r in 1..WORLD {
            if r == WORLD / 2 {
                // Second wave, while half the ranks are still to come.
                strangers.extend(
                    [Stranger::Garbage, Stranger::Silent]
                        .into_iter()
                        .map(|k| (k, false, s.spawn(move || stranger(k, port, done)))),
                );
            }
            handles.push(rank(r));
        }
        let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("rank thread")).collect();
        let elapsed = start.elapsed();
        let seen: Vec<_> = strangers.into_iter().map(|(k, first, h)| (k, first, h.join().expect("stranger"))).collect();
        (results, elapsed, seen, intruder.join().expect("intruder"))
    });
    let mut failures = results.iter().filter_map(|r| r.as_ref().err()).peekable();
    if failures.peek().is_some() {
        let all: Vec<&String> = failures.collect();
        panic!("{} of {WORLD} ranks failed; first: {}", all.len(), all[0]);
    }
    drop(results);
    // Within the bootstrap's own bound: the rendezvous' connect timeout (the exchanges, the
    // splits and the groups' exchanges included).
    assert!(elapsed < CONNECT_TIMEOUT, "1024 ranks took {elapsed:?} (bound {CONNECT_TIMEOUT:?})");
    // Strangers were dropped: each got at most rank 0's challenge (never an acknowledgement, a
    // welcome or a result), and rank 0 closed every connection it accepted. (A connection the
    // kernel completed but rank 0 never accepted gets no challenge; with a full accept queue a
    // silent one may never learn that the listener is gone.) The first wave was on the port
    // before the rendezvous could complete, so rank 0 accepted and challenged it.
    for (kind, first, seen) in &seen {
        assert!(seen.received.len() <= CHALLENGE_LEN, "{kind:?} stranger received {} bytes", seen.received.len());
        if seen.connected && !seen.received.is_empty() {
            assert!(seen.ended, "{kind:?} stranger's connection was not closed: {seen:?}");
        }
        if *first {
            assert!(seen.connected && seen.received.len() == CHALLENGE_LEN, "{kind:?} stranger (first wave): {seen:?}");
        }
    }
    match intruder {
        Err(BootstrapError::ConnectTimeout { last_error, .. }) => assert!(
            last_error.to_string().contains("without accepting the handshake")
                || matches!(last_error.kind(), ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset),
            "{last_error}"
        ),
        other => panic!("the intruder with another job token must time out, got {other:?}"),
    }
    println!("{WORLD} ranks: rendezvous, all_gather, barrier, two splits and group all_gathers in {elapsed:?}");
}

// ---------------------------------------------------------------------------------------------
// Measurement

/// Per phase: the time from the moment every rank thread passed a barrier to the moment the
/// last rank finished the phase.
#[derive(Debug, Default, Clone, Copy)]
struct Times {
    rendezvous: Duration,
    all_gather: Duration,
    split_node: Duration,
    split_cross: Duration,
}

fn measure(world: usize) -> Times {
    let port = free_port();
    let want: Vec<Vec<u8>> = (0..world).map(|r| payload(r, 0)).collect();
    let gate = Barrier::new(world);
    let phases = 4;
    let t0: Vec<std::sync::Mutex<Option<Instant>>> = (0..phases).map(|_| std::sync::Mutex::new(None)).collect();
    let ends: Vec<Vec<Instant>> = thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (want, gate, t0) = (&want, &gate, &t0);
                thread::Builder::new()
                    .stack_size(RANK_STACK)
                    .spawn_scoped(s, move || {
                        let mut ends = Vec::with_capacity(phases);
                        let mark = |phase: usize| {
                            if gate.wait().is_leader() {
                                *t0[phase].lock().unwrap() = Some(Instant::now());
                            }
                            gate.wait();
                        };
                        mark(0);
                        let b = TcpBootstrap::new(cfg(r, world, port, TOKEN)).unwrap();
                        ends.push(Instant::now());
                        mark(1);
                        assert_eq!(&b.all_gather_bytes(&want[r]).unwrap(), want);
                        ends.push(Instant::now());
                        let opts = SplitOptions { transport: GroupTransport::Tcp, ..SplitOptions::default() };
                        mark(2);
                        let node = split_with(&b, Some((r / NODE) as u32), r as u32, &opts).unwrap().unwrap();
                        ends.push(Instant::now());
                        mark(3);
                        let cross = split_with(&b, Some((r % NODE) as u32), r as u32, &opts).unwrap().unwrap();
                        ends.push(Instant::now());
                        gate.wait();
                        drop((node, cross, b));
                        ends
                    })
                    .unwrap()
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let phase = |p: usize| {
        let start = t0[p].lock().unwrap().expect("phase started");
        ends.iter().map(|e| e[p]).max().unwrap() - start
    };
    Times { rendezvous: phase(0), all_gather: phase(1), split_node: phase(2), split_cross: phase(3) }
}

#[test]
#[ignore = "a measurement: cargo test --release -p detcoll-bootstrap --test bootstrap_scale -- --ignored --nocapture"]
fn measure_control_plane() {
    reserve_descriptors(fds_needed(WORLD)).unwrap();
    println!("| ranks | rendezvous | all_gather (300-499 B/rank) | split rank/8 | split rank%8 |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for world in [8, 64, 256, 512, 1024] {
        let runs: Vec<Times> = (0..3).map(|_| measure(world)).collect();
        let med = |f: fn(&Times) -> Duration| {
            let mut v: Vec<Duration> = runs.iter().map(f).collect();
            v.sort();
            v[v.len() / 2]
        };
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        println!(
            "| {world} | {} | {} | {} | {} |",
            ms(med(|t| t.rendezvous)),
            ms(med(|t| t.all_gather)),
            ms(med(|t| t.split_node)),
            ms(med(|t| t.split_cross)),
        );
    }
}
