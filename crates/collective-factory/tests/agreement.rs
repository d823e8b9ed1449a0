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
fn disagreements_fail_with_one_error_naming_the_rank() {
    type Change = fn(&mut Facts);
    let cases: Vec<(Change, &str)> = vec![
        (|f| f.platform = "nvidia".into(), "platform"),
        (|f| f.capacity = 1 << 19, "capacity"),
        (|f| f.versions = vec!["rccl=2.21".into()], "libraries"),
        (|f| f.routing = Routing::default_for(Platform::Nvidia).canonical_json(), "routing"),
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
