//! A library that opens under libcuda's name but is not a whole NVIDIA driver (another library
//! copied there, an empty file) is a typed `LibraryMissing` naming what is wrong, never a panic:
//! cudarc resolves a driver symbol at its first call and panics when it is missing, which an
//! outside probe (2026-12-05) reached through `Platform::detect` and every constructor with
//! libm posing as libcuda. Runs without a GPU: each case is a child process of this test binary
//! whose `LD_LIBRARY_PATH` puts the fake first (the loader reads it at process start).
use collective_core::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD: &str = "DETCOLL_FAKE_DRIVER_CHILD";

/// A shared library of this system that is certainly not libcuda.
fn some_other_library() -> Option<PathBuf> {
    [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
        "/usr/lib64/libm.so.6",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// Runs this test in a child whose loader path starts with `dir`; returns its output.
fn child(test: &str, dir: &Path) -> String {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", format!("{}:{path}", dir.display()))
        .output()
        .expect("child");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child {test} failed:\n{text}");
    text
}

/// A directory holding `file` under every name cudarc tries first for libcuda.
fn fake_dir(tag: &str, file: impl Fn(&Path)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("detcoll-fake-driver-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for name in ["libcuda.so", "libcuda.so.1"] {
        file(&dir.join(name));
    }
    dir
}

/// In the child: every entry point refuses with `LibraryMissing` whose detail contains `want`.
fn check_refused(want: &str) {
    assert!(!cuda_ipc::driver::driver_present());
    let e = cuda_ipc::driver::ensure_driver().unwrap_err();
    assert!(matches!(&e, Error::LibraryMissing { detail, .. } if detail.contains(want)), "{e}");
    for e in [
        cuda_ipc::driver::device_count().map(drop).unwrap_err(),
        cuda_ipc::driver::open_device(0).map(drop).unwrap_err(),
    ] {
        assert!(matches!(&e, Error::LibraryMissing { detail, .. } if detail.contains(want)), "{e}");
    }
    println!("CHILD REFUSED: {e}");
}

#[test]
fn another_library_under_libcudas_name_is_library_missing() {
    if std::env::var_os(CHILD).is_some() {
        return check_refused("lacks");
    }
    let Some(lib) = some_other_library() else {
        println!("skipped: no libm.so.6 found to pose as libcuda");
        return;
    };
    let dir = fake_dir("libm", |to| {
        std::fs::copy(&lib, to).expect("copy");
    });
    let out = child("another_library_under_libcudas_name_is_library_missing", &dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.contains("CHILD REFUSED") && out.contains("cuInit"), "{out}");
}

#[test]
fn an_empty_file_under_libcudas_name_is_named_with_the_loaders_reason() {
    if std::env::var_os(CHILD).is_some() {
        return check_refused("refused by the loader");
    }
    let dir = fake_dir("empty", |to| {
        std::fs::write(to, b"").expect("write");
    });
    let out = child("an_empty_file_under_libcudas_name_is_named_with_the_loaders_reason", &dir);
    let _ = std::fs::remove_dir_all(&dir);
    // The loader's own words (glibc: "file too short"), not only libloading's "dlopen failed".
    assert!(out.contains("CHILD REFUSED") && out.contains("libcuda.so") && out.contains("too short"), "{out}");
}
