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
