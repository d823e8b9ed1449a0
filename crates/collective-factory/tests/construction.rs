//! What every constructor refuses at construction (a world of 0 ranks, a capacity of 0), on
//! every rank at once, and what a composed collective promises about call sizes
//! (`Capabilities::max_call_bytes`, per route). The CPU platform; the GPU platforms' refusals
//! are in `tests/nvidia.rs` and `tests/rocm.rs` (they run without a GPU).
#![cfg(feature = "cpu")]
use collective_core::bootstrap::LocalBootstrap;
use collective_core::conformance::memory::{Flaw, MemoryCollective};
use collective_core::{Collective, Error, Io, Op};
use collective_factory::{Config, Routed, Routing, cpu};
use shm_ipc::ShmCollective;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn invalid_config(r: Result<impl std::fmt::Debug, Error>, what: &str) -> String {
    match r {
        Err(Error::InvalidConfig { detail }) if detail.contains(what) => detail,
        other => panic!("expected InvalidConfig naming {what:?}, got {other:?}"),
    }
}

#[test]
fn a_world_of_zero_ranks_is_invalid_config() {
    invalid_config(cpu::thread_group(0, &Config::new()), "0 ranks");
}

#[test]
fn a_world_above_the_trees_limit_is_refused_before_any_rank_starts() {
    let too_many = collective_core::MAX_WORLD_SIZE + 1;
    let t = Instant::now();
    let got = cpu::thread_group(too_many, &Config::new()).map(|v| v.len());
    assert!(matches!(got, Err(Error::UnsupportedWorldSize { world }) if world == too_many), "{got:?}");
    // Refused by a check, not after 4097 threads met: well under a rendezvous of that many.
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
}

#[test]
fn a_block_cap_outside_1_to_1024_is_invalid_config_on_every_platform() {
    // Before 2026-12-05 0 became 1 without a word (an outside probe); the CPU twin, which
    // launches no blocks, refuses it too, as a GPU run would.
    for blocks in [0, 1025, usize::MAX] {
        invalid_config(Config::new().with_max_blocks(blocks).validate(), "with_max_blocks");
        invalid_config(cpu::thread_group(2, &Config::new().with_max_blocks(blocks)), "with_max_blocks");
    }
    for blocks in [1, 1024] {
        assert_eq!(Config::new().with_max_blocks(blocks).max_blocks(), Some(blocks));
        cpu::thread_group(2, &Config::new().with_capacity(4096).with_max_blocks(blocks)).expect("group");
    }
}

/// `validate` refuses what a constructor would refuse later (an outside probe, 2026-12-05:
/// these passed `validate`, then the CPU constructors refused them, and a GPU constructor on a
/// machine without a GPU said only `LibraryMissing`).
#[test]
fn validate_refuses_what_a_constructor_would() {
    for (config, what) in [
        (Config::new().with_timeout(Duration::ZERO), "with_timeouts"),
        (Config::new().with_timeout(Duration::MAX), "with_timeouts"),
        (Config::new().with_capacity(usize::MAX), "with_capacity"),
        (Config::new().with_ll_capacity(usize::MAX), "with_ll_capacity"),
    ] {
        let e = config.validate().unwrap_err();
        assert!(matches!(&e, Error::InvalidConfig { detail } if detail.contains(what)), "{e}");
        assert_eq!(e.to_string().matches("invalid configuration").count(), 1, "{e}");
        invalid_config(cpu::thread_group(2, &config), what);
    }
    // An LL push capacity of 0 is valid: no LL slots, calls routed there take one-shot.
    assert!(Config::new().with_ll_capacity(0).validate().is_ok());
    assert!(Config::new().with_timeout(collective_core::MAX_TIMEOUT).validate().is_ok());
}

#[test]
fn capacity_zero_is_invalid_config_at_construction_on_every_rank() {
    assert!(Config::new().with_capacity(0).validate().is_err());
    assert!(Config::new().with_capacity(127).validate().is_err());
    assert!(Config::new().with_capacity(detcoll_protocol::MIN_CAPACITY).validate().is_ok());
    // The message says what it is once (it nested the protocol's own InvalidConfig).
    let msg = Config::new().with_capacity(64).validate().unwrap_err().to_string();
    assert_eq!(msg.matches("invalid configuration").count(), 1, "{msg}");
    assert!(msg.contains("Config::with_capacity(64)"), "{msg}");
    invalid_config(cpu::thread_group(2, &Config::new().with_capacity(0)), "with_capacity(0)");
    // One process per rank: through the agreement, every rank names the ranks that have it,
    // also when only one rank passes it (no rank waits for one that dropped out).
    for capacities in [[0, 0], [1 << 16, 0]] {
        let boots = LocalBootstrap::group_with_timeout(2, Duration::from_secs(10));
        let t = Instant::now();
        let got: Vec<Result<_, Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = boots
                .iter()
                .zip(capacities)
                .map(|(b, c)| {
                    s.spawn(move || {
                        cpu::with_transport(
                            b,
                            &Config::new().with_capacity(c),
                            None::<fn() -> Result<collective_factory::NoTransport<()>, Error>>,
                        )
                        .map(drop)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
        });
        assert!(t.elapsed() < Duration::from_secs(5), "failing took {:?}", t.elapsed());
        let ranks = if capacities[0] == 0 { "ranks 0-1:" } else { "rank 1:" };
        for r in got {
            let detail = invalid_config(r, "with_capacity(0)");
            assert!(detail.starts_with(ranks), "{capacities:?}: {detail}");
        }
    }
}

/// Each rank of a CPU collective over `world` threads with a memory transport of `capacity`
/// (a hard limit, as NCCL's workspace is), routed by `table`; `f` runs on every rank.
fn with_transport_group(
    world: usize,
    capacity: usize,
    table: &str,
    f: impl Fn(&Routed<ShmCollective, MemoryCollective>) + Sync,
) {
    let routing = Routing::from_json(table).expect("table");
    let boots: Vec<Arc<LocalBootstrap>> = LocalBootstrap::group(world).into_iter().map(Arc::new).collect();
    std::thread::scope(|s| {
        for boot in &boots {
            let (routing, f) = (routing.clone(), &f);
            s.spawn(move || {
                let tb = boot.clone();
                let transport = move || Ok::<_, Error>(MemoryCollective::new(tb, capacity, Flaw::None));
                let config = Config::new().with_capacity(capacity).with_routing(routing);
                let comm = cpu::with_transport(&**boot, &config, Some(transport)).expect("construction");
                f(&comm);
                comm.close().expect("close");
            });
        }
    });
}

fn table_with(all_reduce: &str, all_gather: &str) -> String {
    format!(
        r#"{{"platform":"cpu","source":"test","rules":[{all_reduce},{all_gather},
  {{"op":"reduce_scatter","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
  {{"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}}]}}"#
    )
}

fn table(all_reduce: &str) -> String {
    format!(
        r#"{{"platform":"cpu","source":"test","rules":[{all_reduce},
  {{"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
  {{"op":"reduce_scatter","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
  {{"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}}]}}"#
    )
}

#[test]
fn max_call_bytes_is_what_the_routes_accept() {
    let capacity = 4096;
    // The CPU twin alone: its IPC routes chunk any size through the staging.
    let ranks = cpu::thread_group(2, &Config::new().with_capacity(capacity)).expect("group");
    assert!(
        ranks
            .iter()
            .all(|c| c.capabilities().max_call_bytes == usize::MAX && c.capabilities().capacity_bytes == capacity)
    );
    std::thread::scope(|s| {
        for comm in &ranks {
            s.spawn(move || {
                let input = vec![1.0f32; 16 * capacity / 4];
                let mut out = vec![0.0f32; input.len()];
                comm.all_reduce(Io::host(&input, &mut out), &()).expect("a call 16x the capacity");
                assert!(out.iter().all(|&x| x == 2.0));
            });
        }
    });
    drop(ranks);
    let one = cpu::thread_group(1, &Config::new().with_capacity(capacity)).expect("world 1");
    assert_eq!(one[0].capabilities().max_call_bytes, usize::MAX);

    // An all_reduce on the transport runs in chunks the transport takes (since 2026-12-05):
    // no limit, the right sums.
    let transport_all = table(r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"transport"}"#);
    with_transport_group(2, capacity, &transport_all, |comm| {
        assert_eq!(comm.capabilities().max_call_bytes, usize::MAX);
        let input = vec![1.0f32; 5 * capacity / 4 + 3];
        let mut out = vec![0.0f32; input.len()];
        comm.all_reduce(Io::host(&input, &mut out), &()).expect("an all_reduce 5x the transport's limit");
        assert!(out.iter().all(|&x| x == 2.0));
    });
    // The transport route's other ops keep its limit, and the report says so.
    let gather_on_transport = table_with(
        r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}"#,
        r#"{"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"transport"}"#,
    );
    with_transport_group(2, capacity, &gather_on_transport, |comm| {
        assert_eq!(comm.capabilities().max_call_bytes, capacity);
        let input = vec![1.0f32; 2 * capacity / 4];
        let mut out = vec![0.0f32; 2 * input.len()];
        let e = comm.all_gather(Io::host(&input, &mut out), &()).unwrap_err();
        assert!(matches!(e, Error::CapacityExceeded { op: Op::AllGather, .. }), "{e}");
    });
    // A transport range that starts above the capacity: calls up to just below it are fine.
    let transport_above = table_with(
        r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}"#,
        r#"{"op":"all_gather","min_bytes":0,"max_bytes":16384,"route":"ipc_one_shot"},
  {"op":"all_gather","min_bytes":16384,"max_bytes":null,"route":"transport"}"#,
    );
    with_transport_group(2, capacity, &transport_above, |comm| {
        assert_eq!(comm.capabilities().max_call_bytes, 16383);
        let input = vec![1.0f32; 16380 / 4];
        let mut out = vec![0.0f32; 2 * input.len()];
        comm.all_gather(Io::host(&input, &mut out), &()).expect("below the transport range");
    });
    // The transport only for sizes within its capacity: no route limits a call.
    let transport_small = table_with(
        r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}"#,
        r#"{"op":"all_gather","min_bytes":0,"max_bytes":4097,"route":"transport"},
  {"op":"all_gather","min_bytes":4097,"max_bytes":null,"route":"ipc_one_shot"}"#,
    );
    with_transport_group(2, capacity, &transport_small, |comm| {
        assert_eq!(comm.capabilities().max_call_bytes, usize::MAX);
    });
    // The hybrid all_reduce takes any size too: its gather goes in chunks of whole shards, and
    // uneven sizes take IPC RS+AG (before 2026-12-05 both were refused above the capacity).
    let hybrid = table(r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"ipc_rs_transport_ag"}"#);
    with_transport_group(2, capacity, &hybrid, |comm| {
        assert_eq!(comm.capabilities().max_call_bytes, usize::MAX);
        for n in [6 * capacity / 4, 6 * capacity / 4 + 1] {
            let input = vec![1.0f32; n];
            let mut out = vec![0.0f32; n];
            comm.all_reduce(Io::host(&input, &mut out), &()).expect("a hybrid all_reduce 6x the capacity");
            assert!(out.iter().all(|&x| x == 2.0), "{n}");
        }
    });
}
