//! Checks that need no GPU and run in CI: the kernels compile with NVRTC for every target
//! architecture and keep the arithmetic strict, and a missing driver is an error, not a panic.
use collective_core::Error;
use cuda_ipc::CudaIpcConfig;
use cuda_ipc::kernels::{
    ImageKind, Variant, Worlds, compile, compile_variant, compile_worlds, ensure_nvrtc, load_nvrtc_from,
};
use std::path::PathBuf;

/// NVRTC from the loader's path, the usual toolkit places, or a pip wheel
/// (`pip install nvidia-cuda-nvrtc`: site-packages/nvidia/*/lib/libnvrtc.so.*).
fn nvrtc() -> bool {
    if ensure_nvrtc().is_ok() {
        return true;
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    for py in ["python3", "python"] {
        if let Ok(out) = std::process::Command::new(py)
            .args(["-c", "import site,sys; print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))"])
            .output()
        {
            roots.extend(String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from));
        }
    }
    for root in roots {
        let Ok(vendors) = std::fs::read_dir(root.join("nvidia")) else { continue };
        for v in vendors.flatten() {
            let Ok(libs) = std::fs::read_dir(v.path().join("lib")) else { continue };
            for l in libs.flatten() {
                let name = l.file_name().to_string_lossy().into_owned();
                if name.starts_with("libnvrtc.so.") && !name.contains("builtins") && load_nvrtc_from(&l.path()).is_ok()
                {
                    // The process-wide result of the first search is cached: test the library
                    // directly.
                    return compile("sm_90", ImageKind::Ptx).is_ok() || ensure_nvrtc().is_ok();
                }
            }
        }
    }
    false
}

#[test]
fn kernels_compile_for_every_target_with_strict_arithmetic() {
    if !nvrtc() {
        collective_core::conformance::skip("NVRTC not found (pip install nvidia-cuda-nvrtc, or set DETCOLL_NVRTC)");
        return;
    }
    // sm_90 with every world (what `cargo xtask build` ships); the other targets with the one
    // world a process compiles at run time (the arithmetic does not depend on the world, and a
    // full image per target would triple this test's time on CI).
    let images = [
        ("sm_80", Worlds::for_world(6).expect("world 6")),
        ("sm_90", Worlds::ALL),
        ("sm_100", Worlds::for_world(8).expect("world 8")),
    ];
    for (arch, worlds) in images {
        let t = std::time::Instant::now();
        let cubin =
            compile_worlds(arch, ImageKind::Cubin, Variant::Main, worlds).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(cubin.len() > 1000 && cubin.starts_with(b"\x7fELF"), "{arch}: not an ELF cubin");
        println!(
            "{arch} worlds {:#x}: cubin {} bytes in {:.1} s",
            worlds.mask(),
            cubin.len(),
            t.elapsed().as_secs_f64()
        );
        if arch == "sm_100" {
            // Same source path as sm_90 (arch >= 900); its PTX check would repeat sm_90's.
            continue;
        }
        let ptx =
            compile_worlds(arch, ImageKind::Ptx, Variant::Main, worlds).unwrap_or_else(|e| panic!("{arch} PTX: {e}"));
        let ptx = String::from_utf8_lossy(&ptx);
        // No flush to zero anywhere, no fused multiply-add of f32/f16 values.
        assert!(!ptx.contains(".ftz"), "{arch}: PTX contains a flush-to-zero instruction");
        for fused in ["fma.rn.f32", "fma.rn.f16", "mad.f32", "mad.rn.f32"] {
            assert!(!ptx.contains(fused), "{arch}: PTX contains {fused}");
        }
        assert!(ptx.contains("add.rn.f32") && ptx.contains("add.rn.f16x2"), "{arch}: expected explicit RNE adds");
        if arch == "sm_80" {
            // No bf16 add before sm_90: the exact fma(a, 1.0, b) form.
            assert!(ptx.contains("fma.rn.bf16x2"), "sm_80: expected fma.rn.bf16x2");
        } else {
            assert!(ptx.contains("add.rn.bf16x2"), "{arch}: expected add.rn.bf16x2");
        }
        for entry in [
            "detcoll_collective_s",
            "detcoll_collective_m",
            "detcoll_tree",
            "detcoll_noop",
            "detcoll_copy",
            "detcoll_residual_rmsnorm",
            "detcoll_collective_norm",
        ] {
            assert!(ptx.contains(&format!(".entry {entry}(")), "{arch}: entry {entry} missing");
        }
        check_norm_ptx(arch, &ptx);
        check_fused_ptx(arch, &ptx);
        println!("{arch}: PTX strict");
    }
}

/// The residual + RMSNorm entry in a PTX image: its one parameter is `DcNormParams` of the
/// host's size, it runs blocks of 256 threads, and its f32 arithmetic is the contract's: the
/// explicit round-to-nearest multiply, add, division and square root (no approximate
/// reciprocal square root, no flush to zero, no contraction; the whole-image checks of the
/// caller cover `.ftz` and `fma`).
fn check_norm_ptx(arch: &str, ptx: &str) {
    let start = ptx.find(".entry detcoll_residual_rmsnorm(").unwrap_or_else(|| panic!("{arch}: no norm entry"));
    let body = &ptx[start..];
    let body = &body[..body.find("\n}\n").map_or(body.len(), |e| e + 3)];
    let size = size_of::<detcoll_protocol::NormParams>();
    assert!(
        body.contains(&format!(".param .align 8 .b8 detcoll_residual_rmsnorm_param_0[{size}]")),
        "{arch}: the norm entry's parameter is not a {size}-byte DcNormParams:\n{}",
        &body[..body.len().min(400)]
    );
    assert!(body.contains(".maxntid 256, 1, 1"), "{arch}: the norm entry is not bounded to 256 threads");
    for insn in ["mul.rn.f32", "add.rn.f32", "div.rn.f32", "sqrt.rn.f32", "shfl.sync.down"] {
        assert!(body.contains(insn), "{arch}: no {insn} in the norm entry");
    }
    for banned in ["rsqrt", "sqrt.approx", "div.approx", "div.full", "fma.rn.f32", "mad."] {
        assert!(!body.contains(banned), "{arch}: {banned} in the norm entry");
    }
    // The vector paths (hidden % 8 == 0, 16-byte aligned tensors): 16-byte global loads and
    // stores of sum, residual, weight, h and y; and the scalar path (any other shape) still
    // there: 2-byte element loads and stores. The per-thread arrays of the vector paths (h
    // kept between the passes) stay in registers: no local-memory frame in the PTX.
    for insn in ["ld.global.v4.u32", "st.global.v4.u32", "ld.global.u16", "st.global.u16"] {
        assert!(body.contains(insn), "{arch}: no {insn} in the norm entry");
    }
    assert!(!body.contains("__local_depot"), "{arch}: the norm entry uses local memory");
}

/// The fused all_reduce + RMSNorm entry: its one parameter is `DcCollectiveNormParams` of the
/// host's size, blocks of the collective's 512 threads, and no approximate operation in it; its
/// out-of-line epilogue (`dc_norm_epilogue`, the norm's rows) keeps the per-thread arrays in
/// registers as the standalone entry does: no local-memory frame.
fn check_fused_ptx(arch: &str, ptx: &str) {
    let epilogue = ptx
        .match_indices("dc_norm_epilogue")
        .map(|(at, _)| at)
        .find(|&at| {
            let line_start = ptx[..at].rfind('\n').map_or(0, |l| l + 1);
            let rest = &ptx[at..];
            ptx[line_start..at].contains(".func")
                && rest.find("\n)").is_some_and(|c| rest[c + 2..].trim_start().starts_with('{'))
        })
        .unwrap_or_else(|| panic!("{arch}: no definition of dc_norm_epilogue"));
    let body = &ptx[epilogue..];
    let body = &body[..body.find("\n}\n").map_or(body.len(), |e| e + 3)];
    // 16-byte loads and stores (generic ones: the out-of-line function's pointers come through
    // a reference, not the kernel's parameters).
    for insn in ["mul.rn.f32", "div.rn.f32", "sqrt.rn.f32", "ld.v4.u32", "st.v4.u32"] {
        assert!(body.contains(insn), "{arch}: no {insn} in the fused epilogue");
    }
    assert!(!body.contains("__local_depot"), "{arch}: the fused epilogue uses local memory");
    for banned in ["rsqrt", "sqrt.approx", "div.approx", "div.full", "fma.rn.f32", "mad."] {
        assert!(!body.contains(banned), "{arch}: {banned} in the fused epilogue");
    }
    let start = ptx.find(".entry detcoll_collective_norm(").unwrap_or_else(|| panic!("{arch}: no fused entry"));
    let body = &ptx[start..];
    let body = &body[..body.find("\n}\n").map_or(body.len(), |e| e + 3)];
    let size = size_of::<detcoll_protocol::params::CollectiveNormParams>();
    assert!(
        body.contains(&format!(".param .align 8 .b8 detcoll_collective_norm_param_0[{size}]")),
        "{arch}: the fused entry's parameter is not a {size}-byte DcCollectiveNormParams:\n{}",
        &body[..body.len().min(400)]
    );
    assert!(body.contains(".maxntid 512, 1, 1"), "{arch}: the fused entry is not bounded to 512 threads");
    for banned in ["rsqrt", "sqrt.approx", "div.approx", "div.full", "fma.rn.f32", "mad."] {
        assert!(!body.contains(banned), "{arch}: {banned} in the fused entry");
    }
}

/// `ptx` without the bodies of the norm (every image has them, whatever its worlds): the
/// standalone entry and the fused call's out-of-line epilogue (`dc_norm_epilogue`), definitions
/// and declarations alike. Each must be found: a renamed
/// function would otherwise stay in and make the comparison meaningless.
fn without_norm_entry(ptx: &str) -> String {
    let mut out = ptx.to_string();
    for name in ["detcoll_residual_rmsnorm(", "dc_norm_epilogue"] {
        let (mut found, mut from) = (false, 0);
        while let Some(at) = out[from..].find(name).map(|i| from + i) {
            let start = out[..at].rfind('\n').map_or(0, |l| l + 1);
            let line = &out[start..at];
            if !(line.contains(".func") || line.contains(".entry")) {
                from = at + name.len(); // a call site
                continue;
            }
            found = true;
            // The parameter list ends at the first ")" line; a body follows as "{", a
            // declaration ends with ";".
            let close = out[at..].find("\n)").map_or(out.len(), |c| at + c + 2);
            let rest = out[close..].trim_start();
            let end = if rest.starts_with(';') {
                out.len() - rest.len() + 1
            } else {
                out[close..].find("\n}\n").map_or(out.len(), |e| close + e + 3)
            };
            out = format!("{}{}", &out[..start], &out[end..]);
            from = start;
        }
        // The epilogue is part of the protocol bodies, which a world-1 image does not carry.
        assert!(found || name == "dc_norm_epilogue", "{name} not in the PTX");
    }
    out
}

/// The norm's constants in detcoll_norm.h are the reference's lanes and vector and the host's
/// launch shape.
#[test]
fn norm_constants_match_the_reference() {
    let header = cuda_ipc::kernels::NORM_HEADER;
    let define = |name: &str| -> usize {
        let line = header
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
            .unwrap_or_else(|| panic!("#define {name} missing from detcoll_norm.h"));
        line.split_whitespace().nth(2).expect("a value").parse().expect("decimal")
    };
    use detcoll_protocol::norm::{NORM_MAX_HIDDEN, NORM_THREADS, NORM_VECTOR};
    assert_eq!(define("DC_NORM_THREADS"), fixed_tree::rmsnorm::RMSNORM_LANES);
    assert_eq!(define("DC_NORM_THREADS"), NORM_THREADS as usize);
    assert_eq!(define("DC_NORM_VECTOR"), fixed_tree::rmsnorm::RMSNORM_VECTOR);
    assert_eq!(define("DC_NORM_VECTOR"), NORM_VECTOR);
    assert_eq!(NORM_MAX_HIDDEN, fixed_tree::rmsnorm::RMSNORM_MAX_HIDDEN);
}

/// A run-time image instantiates only its worlds: the world-1 image (what the fused tree's
/// empty kernel and copies load first) is a fraction of one with a world of peers and carries no
/// protocol body, world 8's has one per mode for world 8 only, and a world outside the image
/// traps instead of returning with the output unwritten.
#[test]
fn a_world_image_instantiates_only_its_worlds() {
    if !nvrtc() {
        collective_core::conformance::skip("NVRTC not found (pip install nvidia-cuda-nvrtc, or set DETCOLL_NVRTC)");
        return;
    }
    let ptx = |w: usize| {
        let img = compile_worlds("sm_90", ImageKind::Ptx, Variant::Main, Worlds::for_world(w).expect("world"))
            .unwrap_or_else(|e| panic!("world {w}: {e}"));
        String::from_utf8_lossy(&img).into_owned()
    };
    let (one, eight) = (ptx(1), ptx(8));
    println!("sm_90 PTX: world 1 {} bytes, world 8 {} bytes", one.len(), eight.len());
    // Compared without the norm entry, which does not depend on the world.
    let (one_rest, eight_rest) = (without_norm_entry(&one), without_norm_entry(&eight));
    println!("without the norm entry: world 1 {} bytes, world 8 {} bytes", one_rest.len(), eight_rest.len());
    assert!(one_rest.len() * 2 < eight_rest.len(), "the world-1 image should not carry the reductions of 8 ranks");
    // One protocol body per mode and world with peers (a world of one rank makes no collective
    // launch): none in the world-1 image, three (pull, LL push, bulk push) of world 8.
    let bodies =
        |ptx: &str, w: usize| (0..3).filter(|m| ptx.contains(&format!("dc_collective_modeILj{m}ELi{w}E"))).count();
    assert_eq!((bodies(&one, 1), bodies(&eight, 8), bodies(&eight, 1)), (0, 3, 0), "protocol bodies per world");
    assert!(one.contains("trap;"), "a world outside the image must trap");
    // The norm does not depend on the world: every image has it.
    for (w, img) in [(1, &one), (8, &eight)] {
        assert!(img.contains(".entry detcoll_residual_rmsnorm("), "world {w}: no norm entry");
    }
    assert!(Worlds::for_world(0).is_err() && Worlds::for_world(9).is_err());
    assert!(Worlds::for_world(6).expect("6").has(6) && Worlds::for_world(6).expect("6").has(1));
    assert!(!Worlds::for_world(6).expect("6").has(8) && (1..=8).all(|w| Worlds::ALL.has(w)));
}

#[test]
fn software_arithmetic_module_compiles_strict() {
    if !nvrtc() {
        collective_core::conformance::skip("NVRTC not found (pip install nvidia-cuda-nvrtc, or set DETCOLL_NVRTC)");
        return;
    }
    let ptx = compile_variant("sm_90", ImageKind::Ptx, Variant::Soft).unwrap_or_else(|e| panic!("soft module: {e}"));
    let ptx = String::from_utf8_lossy(&ptx);
    assert!(ptx.contains(".entry detcoll_tree_soft(") && !ptx.contains(".entry detcoll_collective_s("));
    assert!(!ptx.contains(".ftz") && !ptx.contains("fma.rn.f32"), "soft module: flush to zero or contraction");
    // The software path must not use the hardware f16/bf16 adds.
    assert!(!ptx.contains("add.rn.f16") && !ptx.contains("add.rn.bf16"), "soft module uses hardware half adds");
}

#[test]
fn missing_driver_is_an_error_not_a_panic() {
    if cuda_ipc::driver::driver_present() {
        collective_core::conformance::skip("libcuda is present, the missing-driver path cannot be exercised here");
        return;
    }
    match cuda_ipc::group_on_ordinal(0, 2, &CudaIpcConfig::new(1 << 16)) {
        Err(Error::LibraryMissing { library, .. }) => assert!(library.contains("libcuda")),
        other => panic!("expected LibraryMissing, got {other:?}"),
    }
    assert!(matches!(cuda_ipc::driver::device_count(), Err(Error::LibraryMissing { .. })));
    assert!(matches!(cuda_ipc::driver::open_device(0), Err(Error::LibraryMissing { .. })));
}

/// Every constant the host mirrors from the header the kernels are compiled from, in one place:
/// ABI version (the protocol's and the kernels crate's), world and thread limits, segment
/// flags, modes, segment counts, error codes, status-line words, the LL epoch mask and the close
/// acknowledgement. A `#define DC_*` of a constant the host does not mirror is listed as such, so
/// a new kernel constant cannot be forgotten here.
#[test]
fn kernel_constants_match_the_host() {
    use detcoll_protocol::{CLOSE_ACK, params, status};
    let header = cuda_ipc::kernels::PROTOCOL_HEADER;
    let define = |name: &str| -> u64 {
        let line = header
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
            .unwrap_or_else(|| panic!("#define {name} missing from detcoll_protocol.h"));
        let v = line.split_whitespace().nth(2).expect("a value").trim_end_matches("ull").trim_end_matches('u');
        match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16).expect("hex"),
            None => v.parse().expect("decimal"),
        }
    };
    let host: Vec<(&str, u64)> = vec![
        ("DC_ABI_VERSION", u64::from(params::ABI_VERSION)),
        ("DC_MAX_WORLD", params::MAX_WORLD as u64),
        ("DC_THREADS", u64::from(params::THREADS)),
        ("DC_SEG_WRITE_BACK", u64::from(params::SEG_WRITE_BACK)),
        ("DC_SEG_GATHER", u64::from(params::SEG_GATHER)),
        ("DC_SEG_SEND", u64::from(params::SEG_SEND)),
        ("DC_SEG_SCATTER", u64::from(params::SEG_SCATTER)),
        ("DC_SEG_SEND_TO", u64::from(params::SEG_SEND_TO)),
        ("DC_SEG_AG", u64::from(params::SEG_AG)),
        ("DC_SEG_NORM_READ", u64::from(params::SEG_NORM_READ)),
        ("DC_MODE_PULL", u64::from(params::MODE_PULL)),
        ("DC_MODE_PUSH_LL", u64::from(params::MODE_PUSH_LL)),
        ("DC_MODE_PUSH", u64::from(params::MODE_PUSH)),
        ("DC_ERR_TIMEOUT_READY", status::ERR_TIMEOUT_READY),
        ("DC_ERR_TIMEOUT_PHASE2", status::ERR_TIMEOUT_PHASE2),
        ("DC_ERR_MISMATCH", status::ERR_MISMATCH),
        ("DC_ERR_CORRUPT", status::ERR_CORRUPT),
        ("DC_ERR_PEER_FAILED", status::ERR_PEER_FAILED),
        ("DC_ERR_PEER_CLOSED", status::ERR_PEER_CLOSED),
        ("DC_CLOSE_ACK", CLOSE_ACK),
        ("DC_SEGS_SINGLE", params::SEGS_SINGLE as u64),
        ("DC_SEGS_MANY", params::SEGS_MANY as u64),
        ("DC_ST_ABORT", status::ST_ABORT as u64),
        ("DC_ST_GEN", status::ST_GEN as u64),
        ("DC_ST_FINISHED", status::ST_FINISHED as u64),
        ("DC_ST_REFRESH", status::ST_REFRESH as u64),
        ("DC_LL_EPOCH_MASK", u64::from(status::LL_EPOCH_MASK)),
        ("DC_WORLDS", u64::from(Worlds::ALL.mask())),
    ];
    for (name, value) in &host {
        assert_eq!(define(name), *value, "{name}: the header and the host disagree");
    }
    assert_eq!(define("DC_ABI_VERSION"), u64::from(detcoll_kernels::ABI_VERSION), "detcoll-kernels' ABI_VERSION");
    // Defines that are not numeric constants the host mirrors (macros, guards, device-side
    // helpers); anything else new must be added above.
    let device_only = NOT_MIRRORED;
    for line in header.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let Some(name) = words.next() else { continue };
        let name = name.split('(').next().unwrap_or(name);
        if !name.starts_with("DC_") || host.iter().any(|(n, _)| *n == name) || device_only.contains(&name) {
            continue;
        }
        panic!("#define {name} in detcoll_protocol.h is neither mirrored by the host nor listed as device-only");
    }
}

/// `#define DC_*` names of detcoll_protocol.h that have no host mirror (function-like macros,
/// device-side tuning).
const NOT_MIRRORED: &[&str] = &[
    // The world-set machinery around DC_WORLDS (which is mirrored: `Worlds::ALL`).
    "DC_HAS_WORLD",
    "DC_IF_WORLD_1",
    "DC_IF_WORLD_2",
    "DC_IF_WORLD_3",
    "DC_IF_WORLD_4",
    "DC_IF_WORLD_5",
    "DC_IF_WORLD_6",
    "DC_IF_WORLD_7",
    "DC_IF_WORLD_8",
    "DC_FOR_PEER_WORLDS",
    "DC_FOR_WORLDS",
    "DC_CASE",
];
