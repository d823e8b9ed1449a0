//! A library that opens under libcuda's name but is not a whole NVIDIA driver (libm copied
//! there): the platform is the CPU twin, `auto` falls back to it, and the NVIDIA constructors
//! are `LibraryMissing` — never a panic (cudarc panics on a driver symbol it cannot resolve; an
//! outside probe reached it through `Platform::detect`, 2026-12-05). The child process of each
//! case has the fake first on its loader path. (`cuda-ipc`'s `tests/fake_driver.rs` checks the
//! driver entry points themselves.)
#![cfg(all(feature = "cuda", feature = "cpu"))]

use collective_factory::{Config, Error, Platform, auto, nvidia};
use std::path::PathBuf;
use std::process::Command;

const CHILD: &str = "DETCOLL_FACTORY_FAKE_DRIVER_CHILD";

#[test]
fn a_foreign_libcuda_falls_back_to_the_cpu_twin_without_a_panic() {
    if std::env::var_os(CHILD).is_some() {
        assert_eq!(Platform::detect().expect("detect"), Platform::Cpu);
        let ranks = auto::thread_group(2, &Config::new()).expect("auto");
        assert!(ranks.into_iter().all(|r| r.into_cpu().is_ok()), "auto did not pick the CPU twin");
        let e = nvidia::thread_group(2, &Config::new()).map(drop).unwrap_err();
        assert!(matches!(&e, Error::LibraryMissing { detail, .. } if detail.contains("lacks")), "{e}");
        println!("CHILD OK: {e}");
        return;
    }
    let Some(lib) = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    else {
        println!("skipped: no libm.so.6 found to pose as libcuda");
        return;
    };
    let dir = std::env::temp_dir().join(format!("detcoll-factory-fake-driver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for name in ["libcuda.so", "libcuda.so.1"] {
        std::fs::copy(&lib, dir.join(name)).expect("copy");
    }
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["a_foreign_libcuda_falls_back_to_the_cpu_twin_without_a_panic", "--exact", "--nocapture"])
        .env(CHILD, "1")
        .env_remove("DETCOLL_PLATFORM")
        .env("LD_LIBRARY_PATH", format!("{}:{path}", dir.display()))
        .output()
        .expect("child");
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("CHILD OK"), "{text}");
}
