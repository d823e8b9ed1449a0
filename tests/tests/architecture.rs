//! docs/architecture.md says which library crate depends on which; this checks it against the
//! dependency graph cargo resolves (normal dependencies between the workspace's library crates,
//! optional ones included), so the page cannot drift from the code.
use std::collections::BTreeMap;
use std::process::Command;

type Graph = BTreeMap<String, Vec<String>>;

/// Packages that are not libraries users depend on (gpu-conformance: the GPU test suite, a
/// dev-dependency of the IPC crates only, never published).
const TOOLS: [&str; 4] = ["xtask", "detcoll-benches", "detcoll-integration", "gpu-conformance"];

fn documented() -> Graph {
    let doc = include_str!("../../docs/architecture.md");
    let block = doc.split("```deps\n").nth(1).and_then(|b| b.split("```").next()).expect("a ```deps block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, deps) = l.split_once(':').expect("`crate: deps`");
            let mut deps: Vec<String> =
                deps.split(',').map(|d| d.trim().to_string()).filter(|d| !d.is_empty()).collect();
            deps.sort();
            (name.trim().to_string(), deps)
        })
        .collect()
}

fn actual() -> Option<Graph> {
    let cargo = std::env::var_os("CARGO")?;
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some(parse(&text))
}

/// Each library package's normal dependencies on other workspace packages.
fn parse(json: &str) -> Graph {
    let m: serde_json::Value = serde_json::from_str(json).expect("cargo metadata JSON");
    let packages = m["packages"].as_array().expect("packages");
    let names: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .filter_map(|p| {
            let name = p["name"].as_str()?;
            if TOOLS.contains(&name) {
                return None;
            }
            let mut deps: Vec<String> = p["dependencies"]
                .as_array()?
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|d| names.contains(d))
                .map(str::to_string)
                .collect();
            deps.sort();
            deps.dedup();
            Some((name.to_string(), deps))
        })
        .collect()
}

#[test]
fn the_documented_dependency_graph_is_the_real_one() {
    let Some(actual) = actual() else {
        println!("skipped: not run by cargo (needs `cargo metadata`)");
        return;
    };
    let documented = documented();
    assert_eq!(
        documented,
        actual,
        "docs/architecture.md's ```deps block differs from the workspace; the real graph is:\n{}",
        actual.iter().map(|(k, v)| format!("{k}: {}", v.join(", "))).collect::<Vec<_>>().join("\n")
    );
    // The layering the design asks for: the engine and the transport never reach a vendor
    // crate, no backend reaches the factory, the transport does not reach the engine (both sit
    // on the protocol crate's device traits).
    assert!(!actual["ccl-transport"].contains(&"ipc-engine".to_string()), "ccl-transport depends on ipc-engine");
    for low in ["ipc-engine", "ccl-transport", "detcoll-protocol", "collective-core", "fixed-tree"] {
        for high in ["cuda-ipc", "hip-ipc", "shm-ipc", "collective-factory"] {
            assert!(!actual[low].contains(&high.to_string()), "{low} depends on {high}");
        }
    }
}
