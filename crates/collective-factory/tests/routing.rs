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
        // The fused all_reduce + RMSNorm takes one-shot where the all_reduce takes LL push
        // (measured faster there) and up to 4 MiB inclusive (measured faster than bulk push
        // there, 2026-12-06), and the all_reduce's route above.
        for bytes in [0, 4 * KIB, 512 * KIB, 512 * KIB + 1, (4 << 20) - 1, 4 << 20] {
            assert_eq!(r.fused_norm_route(bytes), Route::IpcOneShot, "fused {bytes} at world {world}");
        }
        for bytes in [(4 << 20) + 1, 1 << 30] {
            assert_eq!(r.fused_norm_route(bytes), r.route(Op::AllReduce, bytes), "fused {bytes} at world {world}");
        }
        // The LL ranges stay within the default LL capacity, so no call the table sends there
        // falls back for lack of LL slots.
        assert!(r.route(Op::AllReduce, detcoll_protocol::DEFAULT_LL_CAPACITY) == Route::IpcPushLl);
        assert!(r.route(Op::AllReduce, detcoll_protocol::DEFAULT_LL_CAPACITY + 1) != Route::IpcPushLl);
    }
    for world in [4, 8] {
        let r = Routing::default_for_world(Platform::Nvidia, world);
        assert_eq!(r, Routing::default_for(Platform::Nvidia));
        // The fused call takes one-shot up to 2 MiB inclusive, where the all_reduce takes RS+AG
        // from 256 KiB (one kernel against two launches: measured faster, 2026-12-06), and the
        // all_reduce's route above.
        for bytes in [0, 4 * KIB, 256 * KIB, 256 * KIB + 1, 2 << 20] {
            assert_eq!(r.fused_norm_route(bytes), Route::IpcOneShot, "fused {bytes} at world {world}");
        }
        for bytes in [(2 << 20) + 1, 1 << 30] {
            assert_eq!(r.fused_norm_route(bytes), r.route(Op::AllReduce, bytes), "fused {bytes} at world {world}");
        }
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
            "gap: no rule covers 10..11 bytes",
        ),
        (
            r#"{"op":"all_reduce","min_bytes":0,"max_bytes":10,"route":"ipc_one_shot"},{"op":"all_reduce","min_bytes":5,"max_bytes":null,"route":"transport"}"#,
            "overlap at 5..10 bytes",
        ),
        (r#"{"op":"all_reduce","min_bytes":0,"max_bytes":10,"route":"ipc_one_shot"}"#, "no rule"),
        (r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"teleport"}"#, "unknown route"),
        (r#"{"op":"all_sum","min_bytes":0,"max_bytes":null,"route":"transport"}"#, "unknown op"),
        (r#"{"op":"all_reduce","min_bytes":0,"max_bytes":5,"route":"transport"}"#, "no rule from 5 bytes upwards"),
        (r#"{"op":"all_reduce","min_bytes":3,"max_bytes":3,"route":"transport"}"#, "rule 3..3 is empty"),
        (
            r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"transport"},{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}"#,
            "overlap: a rule from 0 bytes follows one to ∞",
        ),
        // The fused call's rules are checked as every op's.
        (
            r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"transport"},{"op":"all_reduce_residual_rmsnorm","min_bytes":0,"max_bytes":64,"route":"ipc_one_shot"}"#,
            "all_reduce_residual_rmsnorm has no rule from 64 bytes upwards",
        ),
        (
            r#"{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"transport"},{"op":"all_reduce_residual_rmsnorm","min_bytes":0,"max_bytes":null,"route":"warp"}"#,
            "unknown route `warp`",
        ),
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

#[test]
fn fallbacks_map_the_fused_calls_rules_as_all_reduce_routes() {
    let r = Routing::default_for_world(Platform::Nvidia, 2);
    let t_only = r.transport_only();
    assert_eq!(t_only.fused_norm_route(4 * KIB), Route::Transport);
    let across = r.across_nodes();
    assert_eq!(across.fused_norm_route(4 * KIB), Route::Hierarchical);
    // And the JSON they travel as says the same.
    for mapped in [t_only, across] {
        let back = Routing::from_json(&mapped.canonical_json()).unwrap();
        assert_eq!(back.fused_norm_route(4 * KIB), mapped.fused_norm_route(4 * KIB));
        assert_eq!(back, mapped);
    }
}

/// A table of `platform` whose all_reduce takes `all_reduce_route`, the other ops `ipc_one_shot`.
fn table_of(platform: &str, all_reduce_route: &str) -> String {
    let full = r#"{"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"},
        {"op":"reduce_scatter","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"},
        {"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}"#;
    format!(
        r#"{{"platform":"{platform}","source":"test","rules":[
        {{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"{all_reduce_route}"}},{full}]}}"#
    )
}

#[test]
fn unknown_fields_and_platforms_are_rejected() {
    // A misspelt `max_bytes` was ignored: the rule became unbounded and the table valid.
    let typo = table(r#"{"op":"all_reduce","min_bytes":0,"max_byte":10,"route":"ipc_one_shot"}"#);
    let err = Routing::from_json(&typo).expect_err("a misspelt rule field").to_string();
    assert!(err.contains("max_byte"), "{err}");
    // Leaving it out did the same until 2026-12-05 (an outside probe): `null` says unbounded.
    let missing = table(r#"{"op":"all_reduce","min_bytes":0,"route":"ipc_one_shot"}"#);
    let err = Routing::from_json(&missing).expect_err("a rule without max_bytes").to_string();
    assert!(err.contains("missing field `max_bytes`"), "{err}");
    let extra = table_of("cpu", "ipc_one_shot").replacen(r#""source":"test""#, r#""source":"test","world":2"#, 1);
    let err = Routing::from_json(&extra).expect_err("an unknown table field").to_string();
    assert!(err.contains("world"), "{err}");
    let err = Routing::from_json(&table_of("tpu", "ipc_one_shot")).expect_err("an unknown platform").to_string();
    assert!(err.contains("unknown platform `tpu`"), "{err}");
    for p in ["cpu", "nvidia", "rocm"] {
        assert_eq!(Routing::from_json(&table_of(p, "ipc_one_shot")).unwrap().table().platform, p);
    }
}

#[test]
fn tables_are_checked_for_the_platform_and_the_world() {
    for p in [Platform::Nvidia, Platform::Rocm, Platform::Cpu] {
        for world in [1, 2, 4, 8] {
            Routing::default_for_world(p, world).check_for(p, world).unwrap();
        }
        for other in [Platform::Nvidia, Platform::Rocm, Platform::Cpu].into_iter().filter(|o| *o != p) {
            let err = Routing::default_for(p).check_for(other, 2).unwrap_err().to_string();
            assert!(err.contains(&format!("platform `{}`", p.name())) && err.contains(other.name()), "{err}");
        }
    }
    let local = Routing::from_json(&table_of("cpu", "local")).unwrap();
    local.check_for(Platform::Cpu, 1).unwrap();
    for world in [2, 4, 8] {
        let err = local.check_for(Platform::Cpu, world).unwrap_err().to_string();
        assert!(err.contains("`local`") && err.contains(&format!("has {world}")), "{err}");
    }
}

/// Constructors refuse such tables at construction, on every rank, instead of every call
/// failing later.
#[cfg(feature = "cpu")]
#[test]
fn construction_refuses_a_table_of_another_platform_or_an_impossible_route() {
    use collective_core::Error;
    use collective_factory::{Config, cpu};
    let build = |world: usize, routing: &Routing| {
        cpu::thread_group(world, &Config::new().with_capacity(1 << 16).with_routing(routing.clone()))
    };
    let local = Routing::from_json(&table_of("cpu", "local")).unwrap();
    let nvidia = Routing::default_for(Platform::Nvidia);
    for (routing, why) in [(&local, "`local`"), (&nvidia, "platform `nvidia`")] {
        for world in [2, 4] {
            match build(world, routing) {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(why), "{detail}"),
                Err(e) => panic!("world {world}: expected InvalidConfig saying {why}, got {e}"),
                Ok(_) => panic!("world {world}: a table saying {why} was accepted"),
            }
        }
    }
    // At world 1 every call is local, whatever the table says.
    let one = build(1, &local).expect("world 1");
    let (x, mut y) = (vec![1.5f32; 8], vec![0f32; 8]);
    collective_core::Collective::all_reduce(&one[0], collective_core::Io::host(&x, &mut y), &()).unwrap();
    assert_eq!(y, x);
    assert!(matches!(build(1, &nvidia), Err(Error::InvalidConfig { .. })));
}
