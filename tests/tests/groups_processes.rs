//! Groups inside a job, with real processes: 8 ranks started like torchrun split into TP=4 and
//! DP=2 groups (`bootstrap::split`), build a shm-ipc collective per group and all-reduce on both
//! groups at once from two threads; the bits must equal `fixed-tree` over the group's inputs.
//! And: when one rank exits right after the split, the members of its groups get an error
//! naming it within the bound while the other groups complete.
use std::time::{Duration, Instant};

use collective_core::bootstrap::{Bootstrap, SubBootstrap, TcpBootstrap, split};
use collective_core::{Collective, Error, Io};
use detcoll_launch::{LaunchSpec, launch_captured};
use shm_ipc::{ShmCollective, ShmConfig};

const CHILD: &str = "DETCOLL_GROUPS_CHILD";
const GONE_ENV: &str = "DETCOLL_GROUPS_GONE";
const TP: usize = 4;
const N: usize = 3001;
/// Bootstrap bound of the job (the groups inherit it).
const BOUND_MS: u64 = 4000;

/// Parent rank `rank`'s input to the group tagged `tag`: deterministic, so every rank can
/// compute every other rank's input for the reference.
fn input(rank: usize, tag: u32) -> Vec<f32> {
    let mut x = (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(tag) << 40;
    (0..N)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mixed signs and magnitudes, so the reduction order shows in the bits.
            ((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * 2f32.powi((x % 24) as i32 - 12)
        })
        .collect()
}

fn reference(g: &SubBootstrap, tag: u32) -> Vec<u32> {
    let ins: Vec<Vec<f32>> = g.parent_ranks().iter().map(|&p| input(p, tag)).collect();
    let refs: Vec<&[f32]> = ins.iter().map(Vec::as_slice).collect();
    let mut want = vec![0f32; N];
    fixed_tree::reduce(&refs, &mut want).expect("reference");
    want.iter().map(|v| v.to_bits()).collect()
}

/// Why a group failed, for the parent: `ERR <culprit group rank> <ms since start>`.
fn failure(e: &Error, tag: u32, start: Instant) -> String {
    let culprit = match e {
        Error::Bootstrap(b) => b.culprit().map_or("none".to_owned(), |c| c.to_string()),
        _ => "none".to_owned(),
    };
    eprintln!("group {tag} failed: {e}");
    format!("ERR {culprit} {}", start.elapsed().as_millis())
}

/// One group's all-reduce, compared with the reference: `OK`, `WRONG-BITS` or a failure.
fn all_reduce(comm: &ShmCollective, g: &SubBootstrap, tag: u32, parent_rank: usize, start: Instant) -> String {
    let mine = input(parent_rank, tag);
    let mut out = vec![0f32; N];
    let res = comm.all_reduce(Io::host(&mine, &mut out), &()).and_then(|()| comm.close());
    match res {
        Ok(()) if out.iter().map(|v| v.to_bits()).collect::<Vec<_>>() == reference(g, tag) => "OK".to_owned(),
        Ok(()) => "WRONG-BITS".to_owned(),
        Err(e) => failure(&e, tag, start),
    }
}

fn child() {
    let parent = TcpBootstrap::from_env().expect("bootstrap");
    let r = parent.rank();
    let tp = split(&parent, Some((r / TP) as u32), r as u32).expect("split tp").expect("tp group");
    let dp = split(&parent, Some((r % TP) as u32), r as u32).expect("split dp").expect("dp group");
    assert!(tp.is_tcp() && dp.is_tcp(), "groups of processes run over TCP");
    assert_eq!((tp.rank(), tp.world_size(), dp.rank(), dp.world_size()), (r % TP, TP, r / TP, 2));
    let gone: Option<usize> = std::env::var(GONE_ENV).ok().and_then(|v| v.parse().ok());
    if gone == Some(r) {
        // Leave without a word: the sockets close when the process exits.
        std::process::exit(0);
    }
    // The two groups' collectives are constructed one after the other (shm-ipc names its
    // regions by pid, group rank and time), then used at the same time from two threads.
    let start = Instant::now();
    let tp_comm = ShmCollective::new(&tp, ShmConfig::new(1 << 16));
    let dp_comm = ShmCollective::new(&dp, ShmConfig::new(1 << 16));
    let (tp_line, dp_line) = std::thread::scope(|s| {
        let t = s.spawn(|| match &tp_comm {
            Ok(c) => all_reduce(c, &tp, 1, r, start),
            Err(e) => failure(e, 1, start),
        });
        let d = match &dp_comm {
            Ok(c) => all_reduce(c, &dp, 2, r, start),
            Err(e) => failure(e, 2, start),
        };
        (t.join().expect("tp thread"), d)
    });
    println!("GROUPS {r} TP {tp_line} DP {dp_line} END");
}

fn run_job(gone: Option<usize>) -> Vec<(String, String)> {
    let exe = std::env::current_exe().unwrap();
    let name = if gone.is_some() { "a_rank_leaving_fails_only_its_groups" } else { "tp_and_dp_all_reduce_at_once" };
    let mut spec = LaunchSpec::new(8, exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("DETCOLL_BOOTSTRAP_TIMEOUT_MS", BOUND_MS.to_string());
    if let Some(g) = gone {
        spec = spec.env(GONE_ENV, g.to_string());
    }
    spec.stop_on_failure = false;
    let (outcome, outputs) = launch_captured(&spec).expect("launch");
    if !outcome.success() {
        let tails: Vec<String> = outputs
            .iter()
            .map(|o| o.chars().rev().take(1500).collect::<Vec<_>>().into_iter().rev().collect())
            .collect();
        panic!("{outcome:?}: {tails:#?}");
    }
    outputs
        .iter()
        .enumerate()
        .map(|(rank, out)| {
            if gone == Some(rank) {
                return (String::new(), String::new());
            }
            let line = out.lines().find_map(|l| l.split_once("GROUPS ").map(|(_, r)| r.to_owned()));
            let line = line.unwrap_or_else(|| panic!("rank {rank} printed no result: {out}"));
            let (tp, rest) = line.split_once(" TP ").and_then(|(_, t)| t.split_once(" DP ")).expect("format");
            let dp = rest.split(" END").next().unwrap_or_default();
            eprintln!("rank {rank}: TP {tp} DP {dp}");
            (tp.to_owned(), dp.to_owned())
        })
        .collect()
}

#[test]
fn tp_and_dp_all_reduce_at_once() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    for (rank, (tp, dp)) in run_job(None).into_iter().enumerate() {
        assert_eq!(tp, "OK", "rank {rank} TP");
        assert_eq!(dp, "OK", "rank {rank} DP");
    }
}

#[test]
fn a_rank_leaving_fails_only_its_groups() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    const GONE: usize = 5;
    let bound = Duration::from_millis(BOUND_MS);
    for (rank, (tp, dp)) in run_job(Some(GONE)).into_iter().enumerate() {
        if rank == GONE {
            continue;
        }
        // Rank 5 is group rank 1 of TP group 4..8 and of DP group (1, 5).
        for (what, line, hit) in [("TP", &tp, rank / TP == GONE / TP), ("DP", &dp, rank % TP == GONE % TP)] {
            if !hit {
                assert_eq!(line, "OK", "rank {rank} {what}");
                continue;
            }
            let mut f = line.split(' ');
            assert_eq!(f.next(), Some("ERR"), "rank {rank} {what}: {line}");
            assert_eq!(f.next(), Some("1"), "rank {rank} {what} must blame group rank 1: {line}");
            let ms: u64 = f.next().and_then(|m| m.parse().ok()).expect("elapsed");
            assert!(Duration::from_millis(ms) < bound * 2, "rank {rank} {what} waited {ms} ms");
        }
    }
}
