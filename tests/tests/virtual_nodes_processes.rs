//! Virtual nodes with real processes: `detcoll-run --virtual-nodes N` (here `LaunchSpec::
//! virtual_nodes`) gives each rank a simulated host (`DETCOLL_HOST_ID`) and torchrun's
//! per-node variables, so `cpu::from_bootstrap` routes as across hosts: the hierarchical route
//! (the CPU twin over shared memory inside each virtual node, the host transport over TCP
//! across). At 2x4, 4x2, 3x4 (12 ranks) and 2x8 (16 ranks), every op's bits equal
//! `fixed-tree`'s. And when one node's ranks vanish mid-job, every surviving rank's next call
//! fails with a typed error within the bootstrap's bound, never a hang or an `Ok`.
use std::sync::Arc;
use std::time::{Duration, Instant};

use collective_core::bootstrap::{Bootstrap, TcpBootstrap};
use collective_core::conformance::data::{finite_values, reference_reduce};
use collective_core::{Collective, DType, Io, Op, RawMut, RawRef, Route};
use collective_factory::{Config, cpu};
use detcoll_launch::{LaunchSpec, launch_captured};

const CHILD: &str = "DETCOLL_VNODES_CHILD";
const GONE_ENV: &str = "DETCOLL_VNODES_GONE_NODE";
/// The bootstrap's exchange bound for the job: the cross-node step's bound.
const BOUND_MS: u64 = 3000;
const N: usize = 8 * 29 + 3;
const K: usize = 7;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}

fn bits(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn input(rank: usize, n: usize, seed: u64) -> Vec<f32> {
    f32s(&finite_values(DType::F32, n, seed * 1000 + rank as u64))
}

/// The calls of one rank, each checked against the reference: `OK`, or what went wrong.
fn calls(comm: &impl Collective<Stream = ()>, world: usize, seed: u64) -> Result<(), String> {
    let r = comm.rank();
    let all = |n: usize, s: u64| -> Vec<Vec<u8>> { (0..world).map(|q| bits(&input(q, n, s))).collect() };
    let check = |what: &str, got: &[f32], want: &[u8]| {
        if bits(got) == want { Ok(()) } else { Err(format!("WRONG-BITS {what}")) }
    };
    let err = |what: &str, e: collective_core::Error| format!("ERR {what} {e:?}");
    // all_reduce (with a tail past the last multiple of the node size).
    let x = input(r, N, seed);
    let mut out = vec![f32::NAN; N];
    comm.all_reduce(Io::host(&x, &mut out), &()).map_err(|e| err("all_reduce", e))?;
    check("all_reduce", &out, &reference_reduce(&all(N, seed), DType::F32))?;
    // reduce_scatter.
    let x = input(r, world * K, seed + 1);
    let mut out = vec![f32::NAN; K];
    comm.reduce_scatter(Io::host(&x, &mut out), &()).map_err(|e| err("reduce_scatter", e))?;
    let want = reference_reduce(&all(world * K, seed + 1), DType::F32);
    check("reduce_scatter", &out, &want[r * K * 4..(r + 1) * K * 4])?;
    // reduce_scatter_many, two lanes.
    let (a, b) = (input(r, world * K, seed + 2), input(r, world * 2 * K, seed + 3));
    let (mut oa, mut ob) = (vec![f32::NAN; K], vec![f32::NAN; 2 * K]);
    let lanes = [Io::host(&a, &mut oa), Io::host(&b, &mut ob)];
    comm.reduce_scatter_many(&lanes, &()).map_err(|e| err("reduce_scatter_many", e))?;
    let wa = reference_reduce(&all(world * K, seed + 2), DType::F32);
    let wb = reference_reduce(&all(world * 2 * K, seed + 3), DType::F32);
    check("rsm lane 0", &oa, &wa[r * K * 4..(r + 1) * K * 4])?;
    check("rsm lane 1", &ob, &wb[r * 2 * K * 4..(r + 1) * 2 * K * 4])?;
    // all_gather, in place.
    let mut whole = vec![f32::NAN; world * K];
    whole[r * K..(r + 1) * K].copy_from_slice(&input(r, K, seed + 4));
    // SAFETY: `whole`, borrowed mutably for the call.
    let view = unsafe { RawMut::from_raw(whole.as_mut_ptr() as u64, whole.len(), DType::F32) };
    comm.all_gather(Io::InPlace(view), &()).map_err(|e| err("all_gather", e))?;
    check("all_gather", &whole, &all(K, seed + 4).concat())?;
    let _ = RawRef::host(&whole);
    Ok(())
}

fn child() {
    let boot: Arc<dyn Bootstrap> = Arc::new(TcpBootstrap::from_env().expect("bootstrap"));
    let (rank, world, local) = (boot.rank(), boot.world_size(), boot.local_world_size());
    let comm = cpu::from_bootstrap(boot, &Config::new().with_capacity(1 << 16)).expect("collective");
    let route = comm.route(Op::AllReduce, 4096);
    let first = calls(&comm, world, 1);
    let gone: Option<usize> = std::env::var(GONE_ENV).ok().and_then(|v| v.parse().ok());
    if first.is_ok() && gone == Some(rank / local) {
        // Vanish without closing: the sockets close when the process exits.
        std::process::exit(0);
    }
    let start = Instant::now();
    let second = if first.is_ok() { calls(&comm, world, 2) } else { Ok(()) };
    let ms = start.elapsed().as_millis();
    let report = |r: &Result<(), String>| match r {
        Ok(()) => "OK".to_owned(),
        Err(e) => e.replace('\n', " "),
    };
    println!("VNODES {rank} {route:?} FIRST {} SECOND {} MS {ms} END", report(&first), report(&second));
    if gone.is_none() {
        comm.close().expect("close");
    }
}

/// Each rank's `(route, first, second, ms)`; `None` for the ranks of the node sent away.
fn run_job(nodes: usize, local: usize, gone: Option<usize>) -> Vec<Option<(String, String, String, u128)>> {
    let exe = std::env::current_exe().expect("test binary");
    let name = if gone.is_some() {
        "a_node_vanishing_fails_every_survivor_in_bounded_time"
    } else {
        "every_layout_gives_fixed_tree_bits"
    };
    let mut spec = LaunchSpec::new(nodes * local, exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("DETCOLL_BOOTSTRAP_TIMEOUT_MS", BOUND_MS.to_string());
    spec.virtual_nodes = Some(nodes);
    spec.prefix_output = false;
    if let Some(g) = gone {
        spec = spec.env(GONE_ENV, g.to_string());
    }
    spec.stop_on_failure = false;
    let (outcome, outputs) = launch_captured(&spec).expect("launch");
    assert!(outcome.success(), "{nodes}x{local}: {outcome:?}: {outputs:#?}");
    outputs
        .iter()
        .enumerate()
        .map(|(rank, out)| {
            if gone == Some(rank / local) {
                return None;
            }
            let line = out.lines().find_map(|l| l.split_once("VNODES ").map(|(_, r)| r.to_owned()));
            let line = line.unwrap_or_else(|| panic!("{nodes}x{local}: rank {rank} printed no result: {out}"));
            let field = |a: &str, b: &str| {
                line.split_once(a).and_then(|(_, t)| t.split_once(b)).map(|(v, _)| v.trim().to_owned()).expect("format")
            };
            let route = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
            let ms = field(" MS ", " END").parse().expect("ms");
            Some((route, field(" FIRST ", " SECOND "), field(" SECOND ", " MS "), ms))
        })
        .collect()
}

#[test]
fn every_layout_gives_fixed_tree_bits() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    for (nodes, local) in [(2, 4), (4, 2), (3, 4), (2, 8)] {
        for (rank, r) in run_job(nodes, local, None).into_iter().enumerate() {
            let (route, first, second, _) = r.expect("every rank reports");
            assert_eq!(route, format!("{:?}", Route::Hierarchical), "{nodes}x{local} rank {rank}");
            assert_eq!((first.as_str(), second.as_str()), ("OK", "OK"), "{nodes}x{local} rank {rank}");
        }
        println!("{nodes}x{local}: hierarchical, every op = fixed-tree on every rank");
    }
}

#[test]
fn a_node_vanishing_fails_every_survivor_in_bounded_time() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    // The twin's own peer timeout and the bootstrap's bound, with room for a loaded CI host.
    let bound = Duration::from_millis(BOUND_MS) + Duration::from_secs(12);
    for (nodes, local, gone) in [(2, 4, 1), (4, 2, 2), (3, 4, 0)] {
        for (rank, r) in run_job(nodes, local, Some(gone)).into_iter().enumerate() {
            let Some((_, first, second, ms)) = r else { continue };
            assert_eq!(first, "OK", "{nodes}x{local} rank {rank}: the call before the loss");
            assert!(second.starts_with("ERR "), "{nodes}x{local} rank {rank}: expected a typed error, got {second}");
            assert!(ms < bound.as_millis(), "{nodes}x{local} rank {rank}: failed after {ms} ms, bound {bound:?}");
            println!("{nodes}x{local}, node {gone} gone: rank {rank} {second} after {ms} ms");
        }
    }
}

const DIES_ENV: &str = "DETCOLL_VNODES_DIES";

/// Child of [`a_dead_rank_is_named_by_its_world_rank`]: the calls once, then rank `dies` exits
/// without closing; every other rank calls again and closes, printing both errors.
fn child_of_a_dead_rank(dies: usize) {
    let boot: Arc<dyn Bootstrap> = Arc::new(TcpBootstrap::from_env().expect("bootstrap"));
    let (rank, world) = (boot.rank(), boot.world_size());
    let comm = cpu::from_bootstrap(boot, &Config::new().with_capacity(1 << 16)).expect("collective");
    calls(&comm, world, 1).expect("the calls before the loss");
    if rank == dies {
        std::process::exit(0);
    }
    let second = calls(&comm, world, 2).expect_err("a call after the loss");
    let close = comm.close();
    println!("DEAD {rank} CALL {second} CLOSE {close:?} END");
}

#[test]
fn a_dead_rank_is_named_by_its_world_rank() {
    if let Some(dies) = std::env::var(DIES_ENV).ok().and_then(|v| v.parse().ok()) {
        return child_of_a_dead_rank(dies);
    }
    // 2 virtual nodes of 4; rank 5 exits. Its node peers (4, 6, 7) must blame rank 5 in their
    // call and in their close (before: the close said "rank 1", rank 5's index in its node),
    // and rank 1, whose partner across nodes rank 5 is, too; ranks 0, 2, 3 fail in the step
    // across nodes against their own partners (4, 6, 7), which stop after the loss.
    let exe = std::env::current_exe().expect("test binary");
    let mut spec = LaunchSpec::new(8, exe)
        .args(["a_dead_rank_is_named_by_its_world_rank", "--exact", "--nocapture", "--test-threads=1"])
        .env(DIES_ENV, "5")
        .env("DETCOLL_BOOTSTRAP_TIMEOUT_MS", BOUND_MS.to_string());
    spec.virtual_nodes = Some(2);
    spec.prefix_output = false;
    spec.stop_on_failure = false;
    let (outcome, outputs) = launch_captured(&spec).expect("launch");
    assert!(outcome.success(), "{outcome:?}: {outputs:#?}");
    for (rank, out) in outputs.iter().enumerate() {
        if rank == 5 {
            continue;
        }
        let line = out.lines().find_map(|l| l.split_once("DEAD ").map(|(_, r)| r.to_owned()));
        let line = line.unwrap_or_else(|| panic!("rank {rank} printed no result: {out}"));
        let (call, close) = line.split_once(" CLOSE ").expect("format");
        let blames = |text: &str, r: usize| {
            text.contains(&format!("peer: {r},"))
                || text.contains(&format!("peer: {r} "))
                || text.contains(&format!("rank: {r},"))
        };
        match rank {
            4 | 6 | 7 => {
                assert!(blames(call, 5), "rank {rank}'s call blames rank 5: {call}");
                assert!(close.starts_with("Ok") || blames(close, 5), "rank {rank}'s close blames rank 5: {close}");
            }
            1 => assert!(blames(call, 5), "rank 1's call blames rank 5 (its partner across): {call}"),
            _ => assert!(blames(call, rank + 4), "rank {rank}'s call blames its partner {}: {call}", rank + 4),
        }
        println!("rank {rank}: {line}");
    }
}
