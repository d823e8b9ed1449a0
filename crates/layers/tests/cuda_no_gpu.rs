//! Checks of the GPU path that need no GPU and run in CI: the layers' kernels compile with
//! NVRTC for sm_80, sm_90 and sm_100 with strict arithmetic (when NVRTC can be found), and the
//! entry points that need the driver or cuBLAS return typed errors without them.
#![cfg(feature = "cuda")]
use detcoll_layers::cuda::kernels::{ENTRIES, compile_ptx};
use std::path::PathBuf;

/// NVRTC where `ensure_nvrtc` looks, else from a pip wheel (`pip install nvidia-cuda-nvrtc`:
/// `site-packages/nvidia/<cu13 or cuda_nvrtc>/lib/libnvrtc.so.*`), loaded by path.
fn nvrtc() -> Result<(), String> {
    let Err(e) = cuda_ipc::kernels::ensure_nvrtc() else { return Ok(()) };
    let script = "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))";
    let out = std::process::Command::new("python3").args(["-c", script]).output().map_err(|_| e.to_string())?;
    let wheels = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|root| std::fs::read_dir(PathBuf::from(root).join("nvidia")).ok())
        .flat_map(|dirs| dirs.flatten().filter_map(|d| std::fs::read_dir(d.path().join("lib")).ok()))
        .flat_map(|libs| libs.flatten().map(|l| l.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc.so.")))
        .collect::<Vec<_>>();
    // A library loaded by path is found by soname from then on (`compile_ptx` asks again).
    match wheels.iter().find(|w| cuda_ipc::kernels::load_nvrtc_from(w).is_ok()) {
        Some(_) => Ok(()),
        None => Err(e.to_string()),
    }
}

#[test]
fn kernels_compile_for_every_target_with_strict_arithmetic() {
    if let Err(e) = nvrtc() {
        println!("skipped: NVRTC not found ({e})");
        return;
    }
    for arch in ["sm_80", "sm_90", "sm_100"] {
        let ptx = compile_ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        // No flush to zero and no fast-math approximation in the layers' own arithmetic: the
        // only `.ftz` is the `ex2.approx.ftz.f32` inside CUDA's accurate `expf` (which also
        // brings the `fma` of its range reduction: a fixed function of the value).
        let ftz = ptx.lines().filter(|l| l.contains(".ftz") && !l.contains("ex2.approx.ftz.f32")).count();
        assert_eq!(ftz, 0, "{arch}: PTX contains a flush-to-zero instruction besides expf's");
        for fast in ["mad.f32", "mad.rn.f32", "div.approx", "div.full", "lg2.approx.ftz", "sqrt.approx"] {
            assert!(!ptx.contains(fast), "{arch}: PTX contains {fast}");
        }
        for entry in ENTRIES {
            assert!(ptx.contains(&format!(".entry {entry}(")), "{arch}: entry {entry} missing");
        }
        for op in ["add.rn.f32", "mul.rn.f32", "div.rn.f32"] {
            assert!(ptx.contains(op), "{arch}: expected the explicit round-to-nearest {op}");
        }
        println!("{arch}: PTX {} bytes, strict", ptx.len());
    }
}

#[test]
fn without_a_gpu_the_entry_points_return_typed_errors() {
    match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => {
            println!("skipped: a CUDA device is present (this checks the no-GPU path)");
        }
        other => {
            // The factory refuses to build a group, as a typed error, not a panic.
            let r = collective_factory::nvidia::thread_group(1, &collective_factory::Config::new());
            assert!(r.is_err(), "a thread group without a device: {other:?}");
            println!("no device ({other:?}): thread_group -> {}", r.err().map(|e| e.to_string()).unwrap_or_default());
        }
    }
    // cuBLAS missing is a typed error (or it is present here).
    match detcoll_layers::cuda::blas::ensure_cublas() {
        Ok(()) => println!("libcublas is loadable here"),
        Err(e) => {
            assert!(matches!(e, detcoll_layers::Error::Cuda { .. }), "{e}");
            let source = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
            println!("libcublas missing: {e}: {source}");
        }
    }
}
