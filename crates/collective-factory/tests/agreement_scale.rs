//! The factory's agreement at 1024 ranks: every rank's `Facts` (the CPU twin's, as
//! `cpu::from_bootstrap` builds them: the default routing table, this host) exchanged as serde
//! JSON over a TCP rendezvous of 1024 thread ranks on 127.0.0.1, and `decide` on every rank;
//! every rank must reach the decision `decide` takes from all the facts. Prints the size of
//! one rank's facts and the time of the agreement (from the moment every rank is ready to the
//! moment the last one has decided).
//!
//! One process holds both ends of every connection (about 2 100 descriptors): the test raises
//! its soft `RLIMIT_NOFILE` as far as that needs, and with a hard limit too low it prints
//! `skipped: ...` saying so.

use std::net::TcpListener;
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use collective_factory::bootstrap::{Bootstrap, TcpBootstrap, TcpConfig, reserve_descriptors};
use collective_factory::{Facts, Platform, Routing, decide};

const WORLD: usize = 1024;
const TIMEOUT: Duration = Duration::from_secs(50);

fn facts(rank: usize) -> Facts {
    Facts {
        platform: Platform::Cpu.name().to_string(),
        host: collective_core::host_identity().unwrap(),
        ipc: true,
        // What `cpu::from_bootstrap` reports: the host transport, the hierarchical route
        // (1024 ranks on one host: 128 nodes of 8).
        transport: true,
        versions: Vec::new(),
        capacity: 1 << 20,
        routing: Routing::default_for(Platform::Cpu).canonical_json(),
        // Distinct per rank, so that a rank's facts in the wrong place would show.
        device: format!("cpu-{rank}"),
        errors: Vec::new(),
        missing: Vec::new(),
        nodes: true,
        transport_config: Vec::new(),
        staged: false,
    }
}

#[test]
fn agreement_of_1024_ranks_over_tcp() {
    if let Err(e) = reserve_descriptors(2 * WORLD + 512) {
        println!("skipped: {WORLD} ranks as threads of one process: {e}");
        return;
    }
    let all: Vec<Facts> = (0..WORLD).map(facts).collect();
    let want = decide(&all).expect("the CPU twin's facts agree");
    assert_eq!(want.nodes, Some(collective_factory::nodes::NodeLayout { nodes: 128, local: 8 }));
    let port = TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port();
    let ready = Barrier::new(WORLD);
    // When phase 0 (an all_gather of the facts' bytes alone) and phase 1 (the agreement)
    // started: every rank ready.
    let t0 = [Mutex::new(None), Mutex::new(None)];
    let start = Instant::now();
    let ends: Vec<[Instant; 2]> = thread::scope(|s| {
        let handles: Vec<_> = (0..WORLD)
            .map(|r| {
                let (ready, t0, mine, want) = (&ready, &t0, &all[r], &want);
                thread::Builder::new()
                    .stack_size(512 * 1024)
                    .spawn_scoped(s, move || {
                        let cfg = TcpConfig::single_host(r, WORLD, "127.0.0.1", port)
                            .with_timeout(TIMEOUT)
                            .with_job_token("agreement-scale");
                        let boot = TcpBootstrap::new(cfg).unwrap_or_else(|e| panic!("rank {r}: {e}"));
                        let go = |phase: usize| {
                            if ready.wait().is_leader() {
                                *t0[phase].lock().unwrap() = Some(Instant::now());
                            }
                            ready.wait();
                        };
                        go(0);
                        let bytes = serde_json::to_vec(mine).unwrap();
                        assert_eq!(boot.all_gather_bytes(&bytes).unwrap().len(), WORLD);
                        let gathered = Instant::now();
                        go(1);
                        let d = mine.agree(&boot).unwrap_or_else(|e| panic!("rank {r}: {e}"));
                        let agreed = Instant::now();
                        assert_eq!(&d, want, "rank {r}");
                        // Everyone has decided before any connection closes.
                        boot.barrier().unwrap();
                        [gathered, agreed]
                    })
                    .expect("spawn a rank thread")
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let elapsed = start.elapsed();
    assert!(elapsed < TIMEOUT, "{elapsed:?}");
    let phase = |p: usize| {
        let d = ends.iter().map(|e| e[p]).max().unwrap() - t0[p].lock().unwrap().expect("started");
        d.as_secs_f64() * 1e3
    };
    let bytes = serde_json::to_vec(&all[0]).unwrap().len();
    println!(
        "{WORLD} ranks: facts of {bytes} bytes per rank; all_gather of them {:.1} ms; agreement \
         (all_gather, JSON, decide) {:.1} ms; test {elapsed:?}",
        phase(0),
        phase(1)
    );
}
