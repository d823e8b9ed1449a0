//! A ROCm build of the factory pulls no CUDA code, and a CUDA build no HIP code (design brief
//! §3): checked on the resolved dependency graph, `cargo tree -e normal`, for the factory and
//! for the transport crate whose device side each feature selects.
use std::process::Command;

/// The source tree this test reads, or `None` (with a "skipped" line) when the binary runs
/// outside it: a GPU bundle on a host without Rust (`cargo xtask gpu-bundle`) carries the test
/// binaries but not the workspace. Under `cargo test` (CI, developers) cargo sets `$CARGO` and
/// the manifest directory exists, so the check always runs there.
fn workspace() -> Option<&'static str> {
    let dir = env!("CARGO_MANIFEST_DIR");
    if std::env::var_os("CARGO").is_some() && std::path::Path::new(dir).join("Cargo.toml").exists() {
        Some(dir)
    } else {
        eprintln!("skipped: not run by cargo inside the source tree (the dependency graph needs both)");
        None
    }
}

fn tree(package: &str, features: &str) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["tree", "-p", package, "--no-default-features", "-e", "normal"]);
    if !features.is_empty() {
        cmd.args(["--features", features]);
    }
    let out = cmd
        .args(["--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn crates(tree: &str) -> Vec<String> {
    tree.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

/// `package` built with only `features` pulls every crate of `wanted` and none of `banned`
/// (banning `hip-ipc` bans any `*amdhip*` crate too).
fn check(package: &str, features: &str, wanted: &[&str], banned: &[&str]) {
    if workspace().is_none() {
        return;
    }
    let t = tree(package, features);
    let names = crates(&t);
    for w in wanted {
        assert!(names.iter().any(|n| n == w), "{package} --features {features} lacks {w}:\n{t}");
    }
    for b in banned {
        assert!(
            !names.iter().any(|n| n == b || (*b == "hip-ipc" && n.contains("amdhip"))),
            "{package} --features {features} pulls {b}:\n{t}"
        );
    }
}

#[test]
fn rocm_build_pulls_no_cuda() {
    check("collective-factory", "rocm", &["hip-ipc", "ccl-transport"], &["cudarc", "cuda-ipc"]);
}

#[test]
fn cuda_build_pulls_no_hip() {
    check("collective-factory", "cuda", &["cuda-ipc", "ccl-transport"], &["hip-ipc"]);
}

#[test]
fn the_transport_pulls_no_vendor() {
    // It runs on the protocol crate's device trait; the factory brings the vendor's device.
    check("ccl-transport", "", &["detcoll-protocol"], &["cudarc", "cuda-ipc", "hip-ipc", "ipc-engine"]);
}
