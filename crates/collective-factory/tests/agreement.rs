//! `decide` is a pure function of every rank's facts: same answer (or same error) everywhere.
use collective_core::Error;
use collective_factory::{Facts, Platform, Routing, decide};

fn facts(n: usize) -> Vec<Facts> {
    let routing = Routing::default_for(Platform::Rocm).canonical_json();
    (0..n)
        .map(|_| Facts {
            platform: "rocm".into(),
            host: "h/1".into(),
            ipc: true,
            transport: true,
            versions: vec!["rccl=2.22".into()],
            capacity: 1 << 20,
            routing: routing.clone(),
            device: String::new(),
            errors: Vec::new(),
            missing: Vec::new(),
            nodes: false,
            transport_config: Vec::new(),
            staged: false,
        })
        .collect()
}

#[test]
fn a_local_failure_on_one_rank_fails_every_rank_naming_it() {
    let mut all = facts(4);
    all[3].errors.push("environment variable DETCOLL_PLATFORM=\"foo\" is invalid".into());
    match decide(&all) {
        Err(Error::InvalidConfig { detail }) => {
            assert!(detail.starts_with("rank 3:") && detail.contains("DETCOLL_PLATFORM"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn agreeing_ranks_keep_the_table() {
    let d = decide(&facts(8)).unwrap();
    assert!(d.ipc && d.transport);
    assert_eq!(d.routing, Routing::default_for(Platform::Rocm));
}

#[test]
fn the_same_rules_in_another_order_or_from_another_source_agree() {
    // Before 2026-12-05 ranks compared the tables' text: one rank's table with its rules in
    // another order failed every rank with `ConfigMismatch` (an outside probe).
    let mut all = facts(4);
    let mut table = Routing::default_for(Platform::Rocm).table().clone();
    table.rules.reverse();
    table.source = "the same rules, measured elsewhere".into();
    all[2].routing = serde_json::to_string(&table).unwrap();
    let d = decide(&all).unwrap();
    assert_eq!(d.routing, Routing::default_for(Platform::Rocm), "rank 0's table is the one kept");
    // One rule moved: a different table.
    let mut other = Routing::default_for(Platform::Rocm).table().clone();
    other.rules[0].max_bytes = other.rules[0].max_bytes.map(|m| m - 1);
    other.rules[1].min_bytes -= 1;
    all[2].routing = serde_json::to_string(&other).unwrap();
    assert!(matches!(decide(&all), Err(Error::ConfigMismatch { .. })));
}

#[test]
fn disagreements_fail_with_one_error_naming_the_rank() {
    type Change = fn(&mut Facts);
    let cases: Vec<(Change, &str)> = vec![
        (|f| f.platform = "nvidia".into(), "platform"),
        (|f| f.capacity = 1 << 19, "capacity"),
        (|f| f.versions = vec!["rccl=2.21".into()], "libraries"),
        (|f| f.routing = Routing::default_for(Platform::Nvidia).canonical_json(), "routing"),
        (|f| f.transport_config = vec!["blocking=1".into()], "transport configuration"),
    ];
    for (change, what) in cases {
        let mut all = facts(4);
        change(&mut all[2]);
        let err = decide(&all).unwrap_err();
        assert!(matches!(err, Error::ConfigMismatch { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(what) && msg.contains("rank 2"), "{msg}");
    }
}

#[test]
fn several_hosts_route_everything_through_the_transport() {
    let mut all = facts(4);
    all[3].host = "other/2".into();
    let d = decide(&all).unwrap();
    assert!(!d.ipc && d.transport);
    assert!(d.routing.routes().all(|r| r == collective_core::Route::Transport));
}

#[test]
fn a_rank_without_the_transport_moves_everyone_to_ipc() {
    let mut all = facts(4);
    all[1].transport = false;
    let d = decide(&all).unwrap();
    assert!(d.ipc && !d.transport);
}

#[test]
fn no_possible_route_is_an_error_everywhere() {
    let mut all = facts(2);
    all[1].host = "other/2".into();
    all[0].transport = false;
    let err = decide(&all).unwrap_err().to_string();
    assert!(err.contains("no route is possible") && err.contains("more than one host"), "{err}");
}

#[test]
fn ranks_sharing_a_gpu_are_routed_without_the_transport() {
    let mut f = facts(4);
    for (q, x) in f.iter_mut().enumerate() {
        x.device = format!("gpu-{}", q % 2);
    }
    let d = decide(&f).unwrap();
    assert!(!d.transport, "NCCL refuses two ranks on one GPU");
    assert!(d.routing.routes().all(|r| !r.needs_transport()));
    // Distinct devices keep it; unknown devices (empty) are not treated as shared.
    for (q, x) in f.iter_mut().enumerate() {
        x.device = format!("gpu-{q}");
    }
    assert!(decide(&f).unwrap().transport);
    for x in f.iter_mut() {
        x.device.clear();
    }
    assert!(decide(&f).unwrap().transport);
    // Shared GPUs without IPC: one error on every rank.
    for (q, x) in f.iter_mut().enumerate() {
        x.device = "gpu-0".into();
        x.ipc = q != 3;
    }
    let e = decide(&f).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }) && e.to_string().contains("share one GPU"), "{e}");
}

#[test]
fn a_missing_library_is_library_missing_on_every_rank_naming_the_ranks() {
    let driver = || ("libcuda.so (NVIDIA driver)".to_string(), "not found".to_string());
    // One rank lacks it: every rank gets LibraryMissing (the same typed error, so every rank
    // can take the same next step), naming that rank.
    let mut all = facts(4);
    all[1].missing.push(driver());
    match decide(&all) {
        Err(Error::LibraryMissing { library, detail }) => {
            assert_eq!(library, "libcuda.so (NVIDIA driver)");
            assert_eq!(detail, "rank 1: not found");
        }
        other => panic!("{other:?}"),
    }
    // Every rank lacks it: one message naming them all, not "rank 0" alone.
    let mut all = facts(4);
    for f in &mut all {
        f.missing.push(driver());
    }
    let e = decide(&all).unwrap_err();
    assert!(matches!(&e, Error::LibraryMissing { detail, .. } if detail == "ranks 0-3: not found"), "{e:?}");
    // Ranks with different reasons are each named with theirs; a missing library wins the kind.
    let mut all = facts(8);
    for q in [0, 2, 5, 6, 7] {
        all[q].missing.push(driver());
    }
    all[3].errors.push("DETCOLL_TIMEOUT_MS=\"x\" is invalid".into());
    all[6].missing.push(("libnvrtc.so".into(), "absent".into()));
    match decide(&all) {
        Err(Error::LibraryMissing { library, detail }) => {
            assert_eq!(library, "libcuda.so (NVIDIA driver)");
            assert_eq!(
                detail,
                "ranks 0, 2, 5, 7: not found; rank 3: DETCOLL_TIMEOUT_MS=\"x\" is invalid; \
                 rank 6: not found; libnvrtc.so could not be loaded: absent"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn local_errors_of_several_ranks_name_each_rank() {
    let mut all = facts(2);
    for f in &mut all {
        f.errors.push("bad".into());
    }
    match decide(&all) {
        Err(Error::InvalidConfig { detail }) => assert_eq!(detail, "ranks 0-1: bad"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn facts_fail_sorts_missing_libraries_from_other_failures() {
    let mut f = facts(1).remove(0);
    f.fail("opening its CUDA device", Error::LibraryMissing { library: "libcuda".into(), detail: "gone".into() });
    f.fail("opening its CUDA device", Error::InvalidConfig { detail: "no device 3".into() });
    assert_eq!(f.missing, vec![("libcuda".to_string(), "gone".to_string())]);
    // An InvalidConfig reason without its own prefix: the world's error (InvalidConfig) says it once.
    assert_eq!(f.errors, vec!["opening its CUDA device: no device 3".to_string()]);
    // Facts from an older peer (without `missing`) still parse.
    let mut json: serde_json::Value = serde_json::to_value(&f).unwrap();
    json.as_object_mut().unwrap().remove("missing");
    let old: Facts = serde_json::from_value(json).unwrap();
    assert!(old.missing.is_empty());
}

/// Several hosts: the hierarchical route where every rank offers it and the hosts' layout
/// allows (node-major, the same power-of-two ranks per host), the flat transport route
/// otherwise; on one host a `hierarchical` range is IPC RS+AG.
#[test]
fn the_node_layout_decides_hierarchical_or_flat() {
    use collective_core::{Op, Route};
    use collective_factory::nodes::NodeLayout;
    let ipc_only = r#"{ "platform": "rocm", "source": "test", "rules": [
        { "op": "all_reduce", "min_bytes": 0, "max_bytes": null, "route": "ipc_rs_ag" },
        { "op": "all_gather", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot" },
        { "op": "reduce_scatter", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot" },
        { "op": "reduce_scatter_many", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot" } ] }"#;
    let ipc_only = Routing::from_json(ipc_only).unwrap().canonical_json();
    let on_table = |hosts: &[&str], nodes: bool, table: Option<&str>| {
        let mut all = facts(hosts.len());
        for (f, h) in all.iter_mut().zip(hosts) {
            f.host = (*h).into();
            f.nodes = nodes;
            if let Some(t) = table {
                f.routing = t.to_string();
            }
        }
        decide(&all).unwrap()
    };
    let on = |hosts: &[&str], nodes: bool| on_table(hosts, nodes, Some(&ipc_only));
    let d = on(&["a", "a", "b", "b", "c", "c", "d", "d"], true);
    assert_eq!(d.nodes, Some(NodeLayout { nodes: 4, local: 2 }));
    assert!(!d.ipc && !d.transport, "no world-wide IPC, no flat transport: {d:?}");
    for op in Op::ALL {
        assert_eq!(d.routing.route(op, 1 << 20), Route::Hierarchical, "{op}");
    }
    // A table's transport ranges stay flat (and build the flat transport) beside it.
    let d = on_table(&["a", "a", "b", "b"], true, None);
    assert_eq!(d.nodes, Some(NodeLayout { nodes: 2, local: 2 }));
    assert_eq!(d.routing.route(Op::AllReduce, 1 << 20), Route::Transport);
    assert_eq!(d.routing.route(Op::AllReduce, 4096), Route::Hierarchical);
    assert!(d.transport);
    // A rank that cannot run it, ranks not node-major, uneven or odd hosts: flat.
    for (hosts, nodes) in [
        (&["a", "a", "b", "b"][..], false),
        (&["a", "b", "a", "b"][..], true),
        (&["a", "a", "a", "b"][..], true),
        (&["a", "a", "a", "b", "b", "b"][..], true),
    ] {
        let d = on(hosts, nodes);
        assert_eq!(d.nodes, None, "{hosts:?}");
        assert!(d.transport && d.routing.routes().all(|r| r == Route::Transport), "{hosts:?}: {d:?}");
    }
    // One host: a table naming `hierarchical` runs IPC RS+AG there.
    let table = r#"{ "platform": "rocm", "source": "test", "rules": [
        { "op": "all_reduce", "min_bytes": 0, "max_bytes": null, "route": "hierarchical" },
        { "op": "all_gather", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot" },
        { "op": "reduce_scatter", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot" },
        { "op": "reduce_scatter_many", "min_bytes": 0, "max_bytes": null, "route": "ipc_one_shot" } ] }"#;
    let mut all = facts(4);
    for f in &mut all {
        f.routing = Routing::from_json(table).unwrap().canonical_json();
        f.nodes = true;
    }
    let d = decide(&all).unwrap();
    assert_eq!(d.nodes, None);
    assert_eq!(d.routing.route(Op::AllReduce, 4096), Route::IpcReduceScatterAllGather);
}

/// GPU ranks (as `nvidia`/`rocm` report them: the hierarchical route and host staging
/// possible, NCCL/RCCL loaded) on `hosts`, rank `r` on device `devices[r]` (identities unique
/// across machines, like GPU UUIDs).
fn gpu(hosts: &[&str], devices: &[String]) -> Vec<Facts> {
    let mut all = facts(hosts.len());
    for (r, f) in all.iter_mut().enumerate() {
        f.host = hosts[r].to_string();
        f.device = devices[r].clone();
        f.nodes = true;
        f.staged = true;
    }
    all
}

#[test]
fn the_transport_of_each_group_is_native_unless_a_gpu_is_shared_in_it() {
    use collective_core::{Op, Route};
    use collective_factory::nodes::NodeLayout;
    // Two hosts of 8 GPUs each: NCCL/RCCL per rail, nothing staged.
    let hosts: Vec<&str> = [["a"; 8], ["b"; 8]].concat();
    let devices: Vec<String> = (0..16).map(|r| format!("{}-gpu-{}", hosts[r], r % 8)).collect();
    let d = decide(&gpu(&hosts, &devices)).unwrap();
    assert_eq!(d.nodes, Some(NodeLayout { nodes: 2, local: 8 }));
    assert!(!d.cross_staged && !d.staged, "{d:?}");
    assert_eq!(d.routing.route(Op::AllReduce, 4096), Route::Hierarchical);
    // 16 ranks on one host of 8 GPUs: two nodes of 8, the ranks of one local rank share a GPU,
    // so the step across nodes is staged through the host.
    let one_gpu = |n: usize| vec!["gpu-0".to_string(); n];
    let devices: Vec<String> = (0..16).map(|r| format!("h-gpu-{}", r % 8)).collect();
    let d = decide(&gpu(&["h"; 16], &devices)).unwrap();
    assert_eq!(d.nodes, Some(NodeLayout { nodes: 2, local: 8 }));
    assert!(d.cross_staged, "{d:?}");
    assert!(!d.ipc, "no IPC collective spans 16 ranks");
    // Nothing takes the flat route through the host: every range is hierarchical.
    assert!(!d.transport && d.routing.routes().all(|r| r == Route::Hierarchical), "{d:?}");
    // Virtual nodes on one GPU (2 x 2): staged across.
    let d = decide(&gpu(&["v0", "v0", "v1", "v1"], &one_gpu(4))).unwrap();
    assert_eq!(d.nodes, Some(NodeLayout { nodes: 2, local: 2 }));
    assert!(d.cross_staged);
    // Odd virtual nodes on one GPU (3 x 3): the flat transport route, staged.
    let d = decide(&gpu(&["v0", "v0", "v0", "v1", "v1", "v1", "v2", "v2", "v2"], &one_gpu(9))).unwrap();
    assert_eq!(d.nodes, None);
    assert!(d.transport && d.staged, "{d:?}");
    assert!(d.routing.routes().all(|r| r == Route::Transport));
    // One host, one IPC world, ranks sharing a GPU: IPC only, never staged.
    let d = decide(&gpu(&["h"; 4], &one_gpu(4))).unwrap();
    assert!(d.ipc && !d.transport && !d.staged && d.nodes.is_none(), "{d:?}");
    assert!(d.routing.routes().all(|r| r.needs_ipc()), "{d:?}");
    // Ranks that cannot stage (the CPU platform's facts) and share a device across hosts:
    // no route, one error everywhere.
    let mut all = gpu(&["v0", "v0", "v1", "v1"], &one_gpu(4));
    all.iter_mut().for_each(|f| f.staged = false);
    assert!(matches!(decide(&all), Err(Error::InvalidConfig { .. })));
}
