//! `bootstrap::split`: groups inside a job, with thread ranks (in-process and TCP groups), TP/DP
//! layouts used concurrently, key order, no-color ranks, nested splits, and a member that
//! leaves early failing only its groups.

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use detcoll_bootstrap::{
    Bootstrap, BootstrapError, GroupTransport, LocalBootstrap, SplitOptions, SubBootstrap, TcpBootstrap, TcpConfig,
    split, split_with,
};

const TP: usize = 4;

/// Distinct per parent rank, group tag and round, of varying length (including empty).
fn payload(parent_rank: usize, tag: u8, round: usize) -> Vec<u8> {
    (0..(parent_rank + round) % 5).map(|i| (parent_rank * 16 + round + i) as u8 ^ tag).collect()
}

/// `rounds` exchanges on `g`; each must return exactly the group's payloads in group order.
/// `slow` sleeps between rounds so that groups progress at different speeds.
fn run_exchanges(g: &SubBootstrap, tag: u8, rounds: usize, slow: Duration) {
    for round in 0..rounds {
        let me = g.parent_ranks()[g.rank()];
        let got = g.all_gather_bytes(&payload(me, tag, round)).unwrap();
        let want: Vec<Vec<u8>> = g.parent_ranks().iter().map(|&p| payload(p, tag, round)).collect();
        assert_eq!(got, want, "parent rank {me} group {tag} round {round}");
        thread::sleep(slow);
    }
}

fn tp_dp(parent: &dyn Bootstrap, opts: &SplitOptions) -> (SubBootstrap, SubBootstrap) {
    let r = parent.rank();
    let tp = split_with(parent, Some((r / TP) as u32), r as u32, opts).unwrap().unwrap();
    let dp = split_with(parent, Some((r % TP) as u32), r as u32, opts).unwrap().unwrap();
    (tp, dp)
}

fn check_tp_dp_layout(r: usize, tp: &SubBootstrap, dp: &SubBootstrap) {
    assert_eq!((tp.rank(), tp.world_size()), (r % TP, TP));
    assert_eq!(tp.parent_ranks(), &((r / TP) * TP..(r / TP + 1) * TP).collect::<Vec<_>>()[..]);
    assert_eq!((dp.rank(), dp.world_size()), (r / TP, 2));
    assert_eq!(dp.parent_ranks(), &[r % TP, r % TP + TP]);
    // One host: local = group position.
    assert_eq!((tp.local_rank(), tp.local_world_size()), (tp.rank(), TP));
    assert_eq!((dp.local_rank(), dp.local_world_size()), (dp.rank(), 2));
}

/// 8 thread ranks split into TP=4 and DP=2 groups; every rank drives both groups at once from
/// two threads, the TP groups slower than the DP groups (and TP group 1 slowest).
fn tp_dp_concurrently(opts: SplitOptions, want_tcp: bool) {
    let ranks = LocalBootstrap::group_with_timeout(8, Duration::from_secs(20));
    thread::scope(|s| {
        for parent in &ranks {
            let opts = opts.clone();
            s.spawn(move || {
                let r = parent.rank();
                let (tp, dp) = tp_dp(parent, &opts);
                check_tp_dp_layout(r, &tp, &dp);
                assert_eq!(tp.is_tcp(), want_tcp);
                assert_eq!(dp.is_tcp(), want_tcp);
                let slow = Duration::from_millis(if r < TP { 1 } else { 3 });
                thread::scope(|s| {
                    s.spawn(|| run_exchanges(&tp, 1, 15, slow));
                    s.spawn(|| run_exchanges(&dp, 2, 40, Duration::ZERO));
                });
                // The parent is still usable after its groups' work.
                parent.barrier().unwrap();
            });
        }
    });
}

#[test]
fn local_parent_tp_dp_groups_in_process() {
    tp_dp_concurrently(SplitOptions::default(), false);
}

#[test]
fn local_parent_tp_dp_groups_over_tcp() {
    tp_dp_concurrently(SplitOptions { transport: GroupTransport::Tcp, ..SplitOptions::default() }, true);
}

#[test]
fn key_order_no_color_and_nested_split() {
    let ranks = LocalBootstrap::group(6);
    thread::scope(|s| {
        for parent in &ranks {
            s.spawn(move || {
                let r = parent.rank();
                // Ranks 0 and 5 join no group; the others are ordered by descending parent rank.
                let color = if r == 0 || r == 5 { None } else { Some(3) };
                let g = split(parent, color, (10 - r) as u32).unwrap();
                let Some(g) = g else {
                    assert!(r == 0 || r == 5, "rank {r} got no group");
                    // Colorless ranks still take part in the parent's later collectives.
                    parent.barrier().unwrap();
                    return;
                };
                assert_eq!(g.parent_ranks(), &[4, 3, 2, 1]);
                assert_eq!(g.rank(), 4 - r);
                assert_eq!(g.color(), 3);
                let got = g.all_gather_bytes(&[r as u8]).unwrap();
                assert_eq!(got, vec![vec![4], vec![3], vec![2], vec![1]]);
                // A group can be split again: pairs of the group (by group rank).
                let pair = split(&g, Some((g.rank() / 2) as u32), 0).unwrap().unwrap();
                assert_eq!(pair.world_size(), 2);
                let got = pair.all_gather_bytes(&[r as u8]).unwrap();
                let want: Vec<Vec<u8>> = if r >= 3 { vec![vec![4], vec![3]] } else { vec![vec![2], vec![1]] };
                assert_eq!(got, want);
                parent.barrier().unwrap();
            });
        }
    });
}

#[test]
fn tcp_parent_groups_from_threads() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let world = 4;
    thread::scope(|s| {
        for r in 0..world {
            s.spawn(move || {
                let cfg = TcpConfig::single_host(r, world, "127.0.0.1", port)
                    .with_timeout(Duration::from_secs(20))
                    .with_job_token("groups-test");
                let parent = TcpBootstrap::new(cfg).unwrap();
                assert_eq!(parent.timeouts(), Some((Duration::from_secs(20), Duration::from_secs(20))));
                // Same process: the default is an in-process group; forced: TCP on loopback.
                let a = split(&parent, Some((r % 2) as u32), 0).unwrap().unwrap();
                assert!(!a.is_tcp());
                assert_eq!(a.timeouts(), parent.timeouts());
                let opts = SplitOptions { transport: GroupTransport::Tcp, ..SplitOptions::default() };
                let b = split_with(&parent, Some((r / 2) as u32), 0, &opts).unwrap().unwrap();
                assert!(b.is_tcp());
                assert_eq!(a.all_gather_bytes(&[r as u8]).unwrap(), vec![vec![(r % 2) as u8], vec![(r % 2 + 2) as u8]]);
                let base = (r / 2 * 2) as u8;
                assert_eq!(b.all_gather_bytes(&[r as u8]).unwrap(), vec![vec![base], vec![base + 1]]);
                parent.barrier().unwrap();
            });
        }
    });
}

/// Rank 5 leaves right after the split: its TP group (4..8) and its DP group (1, 5) fail within
/// their bound, naming it; the other groups finish; the parent is not poisoned.
fn member_leaves_early(transport: GroupTransport) {
    const GONE: usize = 5;
    let bound = Duration::from_millis(1500);
    let opts = SplitOptions { transport, connect_timeout: Some(bound), exchange_timeout: Some(bound) };
    let ranks = LocalBootstrap::group_with_timeout(8, Duration::from_secs(20));
    thread::scope(|s| {
        for parent in &ranks {
            let opts = opts.clone();
            s.spawn(move || {
                let r = parent.rank();
                let (tp, dp) = tp_dp(parent, &opts);
                if r == GONE {
                    drop((tp, dp));
                } else {
                    let start = Instant::now();
                    let (tp_res, dp_res) = thread::scope(|s| {
                        let t = s.spawn(|| tp.all_gather_bytes(&[r as u8]));
                        let d = dp.all_gather_bytes(&[r as u8]);
                        (t.join().unwrap(), d)
                    });
                    let took = start.elapsed();
                    let check = |res: Result<Vec<Vec<u8>>, BootstrapError>, g: &SubBootstrap, what: &str| {
                        if g.parent_ranks().contains(&GONE) {
                            let e = res.expect_err(what);
                            let gone_rank = g.parent_ranks().iter().position(|&p| p == GONE).unwrap();
                            assert!(
                                matches!(e, BootstrapError::PeerGone { .. } | BootstrapError::PeerTimeout { .. }),
                                "rank {r} {what}: {e}"
                            );
                            assert_eq!(e.culprit(), Some(gone_rank), "rank {r} {what}: {e}");
                        } else {
                            let got = res.unwrap_or_else(|e| panic!("rank {r} {what}: {e}"));
                            let want: Vec<Vec<u8>> = g.parent_ranks().iter().map(|&p| vec![p as u8]).collect();
                            assert_eq!(got, want, "rank {r} {what}");
                        }
                    };
                    check(tp_res, &tp, "tp");
                    check(dp_res, &dp, "dp");
                    assert!(took < bound * 3, "rank {r} waited {took:?}");
                }
                // The parent (and so a later split) still works for everyone.
                parent.barrier().unwrap();
            });
        }
    });
}

#[test]
fn member_leaving_fails_only_its_in_process_groups() {
    member_leaves_early(GroupTransport::Auto);
}

#[test]
fn member_leaving_fails_only_its_tcp_groups() {
    member_leaves_early(GroupTransport::Tcp);
}

#[test]
fn zero_timeouts_are_rejected() {
    let ranks = LocalBootstrap::group(1);
    let opts = SplitOptions { exchange_timeout: Some(Duration::ZERO), ..SplitOptions::default() };
    let e = split_with(&ranks[0], Some(0), 0, &opts).unwrap_err();
    assert!(matches!(e, BootstrapError::InvalidConfig { .. }), "{e}");
    // A world of one: a group of one, no transport needed.
    let g = split(&ranks[0], Some(9), 0).unwrap().unwrap();
    assert_eq!((g.rank(), g.world_size()), (0, 1));
    assert_eq!(g.all_gather_bytes(b"x").unwrap(), vec![b"x".to_vec()]);
}

#[test]
fn a_split_meeting_another_exchange_names_the_peer_out_of_step() {
    // Rank 3 splits while the others make an exchange of their own on the parent: rank 3 is
    // told which peer made another call, and that the ranks are out of step.
    let ranks = LocalBootstrap::group_with_timeout(4, Duration::from_secs(20));
    thread::scope(|s| {
        for parent in &ranks {
            s.spawn(move || {
                if parent.rank() == 3 {
                    let r = split(parent, Some(0), 3);
                    match r {
                        Err(BootstrapError::Protocol(m)) => {
                            assert!(m.contains("rank 0 made another call") && m.contains("out of step"), "{m}")
                        }
                        other => panic!("{other:?}"),
                    }
                } else {
                    // The others' raw exchange gets the split's bytes as data (documented).
                    assert_eq!(parent.all_gather_bytes(&[1, 2, 3]).map(|v| v.len()).ok(), Some(4));
                }
            });
        }
    });
}
