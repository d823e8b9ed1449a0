//! The route is decided once, by the table, and the backend takes it: a non-monotone table
//! (RS+AG for small all_reduce, one-shot in the middle, RS+AG again above) is honoured
//! exactly — `route()` reports what runs for every size, RS+AG asked for an op that has no
//! such route is reported (and run) as its one-shot route — and every call is bit-exact
//! against fixed-tree. Before, the IPC backend applied its own threshold derived from the
//! table's first RS+AG rule, so such a table was accepted but not followed.
use collective_core::conformance::data::{finite_values, reference_reduce};
use collective_core::{Collective, DType, Io, Op, RawMut, RawRef, Route};
use collective_factory::{Config, Routing, cpu};

const TABLE: &str = r#"{
  "platform": "cpu",
  "source": "test: non-monotone",
  "rules": [
    { "op": "all_reduce", "min_bytes": 0, "max_bytes": 4096, "route": "ipc_rs_ag" },
    { "op": "all_reduce", "min_bytes": 4096, "max_bytes": 65536, "route": "ipc_one_shot" },
    { "op": "all_reduce", "min_bytes": 65536, "max_bytes": null, "route": "ipc_rs_ag" },
    { "op": "all_gather", "min_bytes": 0, "max_bytes": null, "route": "ipc_rs_ag" },
    { "op": "reduce_scatter", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot" },
    { "op": "reduce_scatter_many", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot" }
  ]
}"#;

#[test]
fn a_non_monotone_table_is_honoured_and_reported() {
    let routing = Routing::from_json(TABLE).expect("table");
    let world = 4;
    let ranks = cpu::thread_group(world, &Config::new().with_capacity(1 << 20).with_routing(routing)).expect("group");
    let expect = [
        (Op::AllReduce, 1024, Route::IpcReduceScatterAllGather),
        (Op::AllReduce, 16 << 10, Route::IpcOneShot),
        (Op::AllReduce, 256 << 10, Route::IpcReduceScatterAllGather),
        (Op::AllGather, 16 << 10, Route::IpcOneShot),
    ];
    for (op, bytes, route) in expect {
        assert_eq!(ranks[0].route(op, bytes), route, "{op} {bytes} B");
    }
    std::thread::scope(|s| {
        for comm in &ranks {
            s.spawn(move || {
                let r = comm.rank();
                for bytes in [1024usize, 16 << 10, 256 << 10] {
                    let n = bytes / 4;
                    let inputs: Vec<Vec<u8>> =
                        (0..world).map(|q| finite_values(DType::F32, n, (q * 7 + bytes) as u64)).collect();
                    let mut out = vec![0u8; bytes];
                    // SAFETY: host buffers of `n` f32 that outlive the (synchronous) call.
                    let io = unsafe {
                        Io::OutOfPlace {
                            input: RawRef::from_raw(inputs[r].as_ptr() as u64, n, DType::F32),
                            output: RawMut::from_raw(out.as_mut_ptr() as u64, n, DType::F32),
                        }
                    };
                    comm.all_reduce(io, &()).expect("all_reduce");
                    assert_eq!(out, reference_reduce(&inputs, DType::F32), "rank {r}, {bytes} B");
                }
                comm.close().expect("close");
            });
        }
    });
}

const LAYERED: &str = r#"{
  "platform": "cpu",
  "source": "test: every op's ranges, non-monotone",
  "rules": [
    { "op": "all_reduce", "min_bytes": 0, "max_bytes": 2048, "route": "ipc_push_ll" },
    { "op": "all_reduce", "min_bytes": 2048, "max_bytes": 8192, "route": "ipc_rs_ag" },
    { "op": "all_reduce", "min_bytes": 8192, "max_bytes": 65536, "route": "ipc_push" },
    { "op": "all_reduce", "min_bytes": 65536, "max_bytes": null, "route": "ipc_one_shot" },
    { "op": "all_gather", "min_bytes": 0, "max_bytes": 4096, "route": "ipc_push" },
    { "op": "all_gather", "min_bytes": 4096, "max_bytes": null, "route": "ipc_push_ll" },
    { "op": "reduce_scatter", "min_bytes": 0, "max_bytes": 1024, "route": "ipc_one_shot" },
    { "op": "reduce_scatter", "min_bytes": 1024, "max_bytes": null, "route": "ipc_push_ll" },
    { "op": "reduce_scatter_many", "min_bytes": 0, "max_bytes": 512, "route": "ipc_push" },
    { "op": "reduce_scatter_many", "min_bytes": 512, "max_bytes": 4096, "route": "ipc_push_ll" },
    { "op": "reduce_scatter_many", "min_bytes": 4096, "max_bytes": null, "route": "ipc_rs_ag" }
  ]
}"#;

/// One policy: the IPC backend's own `route()` (what it takes when a caller names no route) is
/// a lookup in the same agreed table as the composed collective's, for every op and every size
/// around every boundary — there is no second set of thresholds in the backend. Op fallbacks
/// are decided once (`ipc_route_for`): RS+AG is an all_reduce route, and reduce_scatter_many
/// has no bulk push plan, so both report (and run) one-shot there.
#[test]
fn the_backend_follows_the_agreed_table_for_every_op_and_size() {
    let routing = Routing::from_json(LAYERED).expect("table");
    let ranks = cpu::thread_group(2, &Config::new().with_capacity(1 << 20).with_routing(routing)).expect("group");
    let comm = &ranks[0];
    let ipc = comm.ipc().expect("an IPC backend");
    for op in Op::ALL {
        for b in [0usize, 1, 511, 512, 1023, 1024, 2047, 2048, 4095, 4096, 8191, 8192, 65535, 65536, 1 << 30] {
            assert_eq!(ipc.route(op, b), comm.route(op, b), "{op} at {b} B");
        }
    }
    assert_eq!(comm.route(Op::ReduceScatterMany, 100), Route::IpcOneShot);
    assert_eq!(comm.route(Op::ReduceScatterMany, 1000), Route::IpcPushLl);
    assert_eq!(comm.route(Op::ReduceScatterMany, 5000), Route::IpcOneShot);
    assert_eq!(comm.route(Op::AllReduce, 4096), Route::IpcReduceScatterAllGather);
    assert_eq!(comm.route(Op::AllGather, 4096), Route::IpcPushLl);
    // LL push above the LL slots (512 KiB by default) runs one-shot, and says so (before
    // 2026-12-05 `route()` said LL push: an outside probe).
    assert_eq!(comm.route(Op::AllGather, 512 << 10), Route::IpcPushLl);
    assert_eq!(comm.route(Op::AllGather, (512 << 10) + 1), Route::IpcOneShot);
    // reduce_scatter's payload is one shard.
    assert_eq!(comm.route(Op::ReduceScatter, 2 * (512 << 10)), Route::IpcPushLl);
    assert_eq!(comm.route(Op::ReduceScatter, 2 * (512 << 10) + 2), Route::IpcOneShot);
    std::thread::scope(|s| {
        for c in &ranks {
            s.spawn(move || c.close().expect("close"));
        }
    });
}

/// A world of one rank is decided in one place (the table bound to the world): every op and
/// size is local, in the composed collective and in its backend alike, whatever the table says.
#[test]
fn a_world_of_one_is_local_in_the_collective_and_its_backend() {
    let routing = Routing::from_json(LAYERED).expect("table");
    let ranks = cpu::thread_group(1, &Config::new().with_capacity(1 << 20).with_routing(routing)).expect("group");
    let ipc = ranks[0].ipc().expect("the local backend");
    for op in Op::ALL {
        for b in [0usize, 1, 4096, 1 << 30] {
            assert_eq!(ranks[0].route(op, b), Route::Local, "{op} at {b} B");
            assert_eq!(ipc.route(op, b), Route::Local, "{op} at {b} B");
        }
    }
}
