//! A ROCm build of the factory pulls no CUDA code, and a CUDA build no HIP code (design brief
//! §3): checked on the resolved dependency graph, `cargo tree -e normal`.
use std::process::Command;

fn tree(features: &str) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", "collective-factory", "--no-default-features", "--features", features, "-e", "normal"])
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

#[test]
fn rocm_build_pulls_no_cuda() {
    let t = tree("rocm");
    let names = crates(&t);
    assert!(names.iter().any(|n| n == "hip-ipc"), "rocm build lacks hip-ipc:\n{t}");
    for banned in ["cudarc", "cuda-ipc"] {
        assert!(!names.iter().any(|n| n == banned), "rocm build pulls {banned}:\n{t}");
    }
}

#[test]
fn cuda_build_pulls_no_hip() {
    let t = tree("cuda");
    let names = crates(&t);
    assert!(names.iter().any(|n| n == "cuda-ipc"), "cuda build lacks cuda-ipc:\n{t}");
    assert!(!names.iter().any(|n| n == "hip-ipc" || n.contains("amdhip")), "cuda build pulls HIP code:\n{t}");
}
