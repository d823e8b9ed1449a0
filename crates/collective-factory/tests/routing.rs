//! Routing tables: defaults valid, boundaries exact, bad tables rejected, fallbacks mapped.
use collective_core::{Op, Route};
use collective_factory::{Platform, Routing};

const KIB: usize = 1024;

#[test]
fn defaults_are_valid_and_cover_every_op() {
    for p in [Platform::Nvidia, Platform::Rocm, Platform::Cpu] {
        let r = Routing::default_for(p);
        assert_eq!(r.table().platform, p.name());
        for op in Op::ALL {
            for bytes in [0, 1, 4 * KIB, 1 << 20, 1 << 30] {
                let _ = r.route(op, bytes);
            }
        }
    }
}

#[test]
fn mi300x_table_matches_the_seeds() {
    let r = Routing::default_for(Platform::Rocm);
    assert_eq!(r.route(Op::AllReduce, 4 * KIB), Route::IpcOneShot);
    assert_eq!(r.route(Op::AllReduce, 768 * KIB), Route::IpcOneShot);
    assert_eq!(r.route(Op::AllReduce, 768 * KIB + 1), Route::Transport);
    assert_eq!(r.route(Op::AllReduce, 2176 * KIB - 1), Route::Transport);
    assert_eq!(r.route(Op::AllReduce, 2176 * KIB), Route::IpcReduceScatterTransportAllGather);
    assert_eq!(r.route(Op::AllGather, 256 * KIB), Route::IpcOneShot);
    assert_eq!(r.route(Op::AllGather, 256 * KIB + 1), Route::Transport);
    assert_eq!(r.route(Op::ReduceScatter, 1 << 30), Route::IpcOneShot);
}

#[test]
fn nvidia_default_starts_at_256_kib() {
    let r = Routing::default_for(Platform::Nvidia);
    assert_eq!(r.route(Op::AllReduce, 256 * KIB), Route::IpcOneShot);
    assert_eq!(r.route(Op::AllReduce, 256 * KIB + 1), Route::IpcReduceScatterAllGather);
}

#[test]
fn nvidia_worlds_of_two_take_the_measured_push_and_pull_table() {
    for world in [1, 2] {
        let r = Routing::default_for_world(Platform::Nvidia, world);
        assert!(r.table().source.contains("measured"), "{}", r.table().source);
        // LL push for small calls (up to the default LL capacity), bulk push for large
        // all_reduce and reduce_scatter, one-shot between and for large all_gather.
        let expect = [
            (Op::AllReduce, 4 * KIB, Route::IpcPushLl),
            (Op::AllReduce, 512 * KIB, Route::IpcPushLl),
            (Op::AllReduce, 512 * KIB + 1, Route::IpcOneShot),
            (Op::AllReduce, 4 << 20, Route::IpcPush),
            (Op::AllReduce, 1 << 30, Route::IpcPush),
            (Op::AllGather, 512 * KIB, Route::IpcPushLl),
            (Op::AllGather, 1 << 30, Route::IpcOneShot),
            (Op::ReduceScatter, 64 * KIB, Route::IpcPushLl),
            (Op::ReduceScatter, 64 * KIB + 1, Route::IpcPush),
            (Op::ReduceScatterMany, 4 * KIB, Route::IpcOneShot),
            (Op::ReduceScatterMany, 1 << 30, Route::IpcOneShot),
        ];
        for (op, bytes, route) in expect {
            assert_eq!(r.route(op, bytes), route, "{op} {bytes} at world {world}");
        }
        // The LL ranges stay within the default LL capacity, so no call the table sends there
        // falls back for lack of LL slots.
        assert!(r.route(Op::AllReduce, collective_core::protocol::DEFAULT_LL_CAPACITY) == Route::IpcPushLl);
        assert!(r.route(Op::AllReduce, collective_core::protocol::DEFAULT_LL_CAPACITY + 1) != Route::IpcPushLl);
    }
    for world in [4, 8] {
        assert_eq!(Routing::default_for_world(Platform::Nvidia, world), Routing::default_for(Platform::Nvidia));
    }
    // Other platforms have one table for every world.
    assert_eq!(Routing::default_for_world(Platform::Rocm, 2), Routing::default_for(Platform::Rocm));
}

fn table(rules: &str) -> String {
    let full = r#"{"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"},
        {"op":"reduce_scatter","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"},
        {"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}"#;
    format!(r#"{{"platform":"cpu","source":"test","rules":[{rules},{full}]}}"#)
}

#[test]
fn bad_tables_are_rejected_with_the_reason() {
    let cases = [
        (
            r#"{"op":"all_reduce","min_bytes":0,"max_bytes":10,"route":"ipc_one_shot"},{"op":"all_reduce","min_bytes":11,"max_bytes":null,"route":"transport"}"#,
            "gap",
        ),
        (
            r#"{"op":"all_reduce","min_bytes":0,"max_bytes":10,"route":"ipc_one_shot"},{"op":"all_reduce","min_bytes":5,"max_bytes":null,"route":"transport"}"#,
            "gap or overlap",
        ),
        (r#"{"op":"all_reduce","min_bytes":0,"max_bytes":10,"route":"ipc_one_shot"}"#, "no rule"),
        (r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"teleport"}"#, "unknown route"),
        (r#"{"op":"all_sum","min_bytes":0,"max_bytes":null,"route":"transport"}"#, "unknown op"),
    ];
    for (rules, why) in cases {
        let err = Routing::from_json(&table(rules)).expect_err(why).to_string();
        assert!(err.contains(why), "{err} does not say {why}");
    }
    let hybrid_gather = r#"{"platform":"cpu","source":"t","rules":[{"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"ipc_rs_transport_ag"}]}"#;
    assert!(Routing::from_json(hybrid_gather).is_err());
}

#[test]
fn fallbacks_replace_only_impossible_routes() {
    let r = Routing::default_for(Platform::Rocm);
    let no_t = r.without_transport();
    assert!(no_t.routes().all(|x| !x.needs_transport()));
    assert_eq!(no_t.route(Op::AllReduce, 4 << 20), Route::IpcReduceScatterAllGather);
    assert_eq!(no_t.route(Op::AllReduce, 4 * KIB), Route::IpcOneShot);
    let t_only = r.transport_only();
    assert!(t_only.routes().all(|x| x == Route::Transport));
    // The mapped tables stay valid tables (they travel as JSON between ranks).
    Routing::from_json(&no_t.canonical_json()).unwrap();
    Routing::from_json(&t_only.canonical_json()).unwrap();
}
