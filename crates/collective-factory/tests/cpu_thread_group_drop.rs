//! Dropping a CPU thread group from one thread, as the README's first example does at the end
//! of `main`: the ranks are an in-process group (as GPU thread groups are), so a rank's close or
//! drop never waits for its peers' acknowledgements. Before, each rank but the last waited the
//! whole close bound for peers that the same thread would drop only later (10 s a rank by
//! default: 30 s at the end of the README's example) and then leaked its staging. Also: a rank
//! dropped first still fails its peers' next calls with `PeerClosed`, at once.
#![cfg(feature = "cpu")]
use collective_factory::{Collective, Config, Error, Io, cpu};
use std::time::{Duration, Instant};

/// A close bound no test run reaches: a drop that waited for it would be unmistakable.
const BOUND: Duration = Duration::from_secs(120);

fn one_call_each(ranks: &[collective_factory::CpuCollective]) {
    std::thread::scope(|s| {
        for comm in ranks {
            s.spawn(move || {
                let x = vec![comm.rank() as f32 + 0.5; 1024];
                let mut y = vec![0f32; 1024];
                comm.all_reduce(Io::host(&x, &mut y), &()).expect("all_reduce");
            });
        }
    });
}

#[test]
fn a_thread_group_dropped_from_one_thread_never_waits_for_the_close_bound() {
    for world in [2, 4, 8] {
        let ranks = cpu::thread_group(world, &Config::new().with_capacity(1 << 16).with_timeout(BOUND)).expect("group");
        one_call_each(&ranks);
        let t = Instant::now();
        drop(ranks);
        let took = t.elapsed();
        println!("world {world}: the group dropped from one thread in {took:?}");
        assert!(took < BOUND / 4, "world {world}: dropping the group took {took:?}, the close bound is {BOUND:?}");
    }
}

#[test]
fn a_rank_dropped_first_fails_its_peers_next_call_with_peer_closed() {
    let mut ranks = cpu::thread_group(2, &Config::new().with_capacity(1 << 16).with_timeout(BOUND)).expect("group");
    one_call_each(&ranks);
    drop(ranks.remove(0));
    let t = Instant::now();
    let x = vec![1f32; 1024];
    let mut y = vec![0f32; 1024];
    match ranks[0].all_reduce(Io::host(&x, &mut y), &()) {
        Err(Error::PeerClosed { peer: 0, .. }) => {}
        other => panic!("rank 1 after rank 0 was dropped: {other:?}"),
    }
    assert!(t.elapsed() < BOUND / 4, "PeerClosed took {:?}", t.elapsed());
}
