//! CI check without an AMD GPU: the HIP kernels compile for gfx942 and gfx950 through the same
//! driver as `cargo xtask build`, with strict arithmetic, and a missing HIP runtime is an
//! error, not a panic.
use collective_core::Error;
use hip_ipc::build::{self, BuildError};

/// The strict-arithmetic checks on the assembly of a HIP build of the entry file.
fn check_assembly(gfx: &str, s: &str) {
    for k in [
        "detcoll_collective_s",
        "detcoll_collective_m",
        "detcoll_tree",
        "detcoll_tree_soft",
        "detcoll_noop",
        "detcoll_copy",
        "detcoll_clock",
        "detcoll_residual_rmsnorm",
        "detcoll_collective_norm",
    ] {
        assert!(s.contains(&format!(".name:           {k}")), "{gfx}: kernel {k} missing");
    }
    // Denormals kept (mode 3 = no flushing) for f32 and f16/f64 in every kernel.
    assert!(!s.contains(".amdhsa_float_denorm_mode_32 0"), "{gfx}: f32 denormals flushed");
    assert!(!s.contains(".amdhsa_float_denorm_mode_16_64 0"), "{gfx}: f16 denormals flushed");
    assert!(s.contains("s_memrealtime") && s.contains("s_sleep"), "{gfx}: bounded waits missing");
    // The hardware path: packed f16 adds, packed f32 adds of widened bf16 lanes, and on
    // gfx950 the packed round-to-nearest-even bf16 conversion; the software path's scalar
    // f32 adds (detcoll_tree_soft). No fused or mixed-precision multiply-add on data:
    // v_pk_fma / v_fma_mix would round once for two operations. (v_fmac_f32 does appear:
    // the compiler expands 64-bit integer division of tile indices through f32
    // reciprocals, not data.)
    for insn in ["v_pk_add_f16", "v_pk_add_f32", "v_add_f32"] {
        assert!(s.contains(insn), "{gfx}: no {insn} in the reductions");
    }
    if gfx == "gfx950" {
        assert!(s.contains("v_cvt_pk_bf16_f32"), "{gfx}: bf16 sums not rounded by v_cvt_pk_bf16_f32");
    }
    for insn in ["v_pk_fma", "v_fma_mix", "v_pk_mul"] {
        assert!(!s.contains(insn), "{gfx}: {insn} in the kernels");
    }
}

/// The system-scope acquire loads of the assembly: a 64-bit load carrying `sc0 sc1` (system
/// scope) whose next instruction, past `s_waitcnt`, is `buffer_inv sc0 sc1` (the acquire's
/// invalidate) — what `__hip_atomic_load(ACQUIRE, SYSTEM)` compiles to on gfx94x/gfx950. In the
/// kernels the only acquire loads are `dc_wait`'s (detcoll_protocol.h): the poll of the peer's
/// flag and its re-read after a close acknowledgement. Returns the load lines found.
///
/// What this records, for docs/rocm.md ("Poll local memory"): the load is `flat_` (a generic
/// pointer), and its address is `h.ctl[t] + off`, the PEER's control block: today's pull
/// protocol polls remote memory. A change of the protocol (the push protocol polls its own
/// block) or of the compiler's acquire sequence changes what this finds, and the test says so.
fn acquire_loads(s: &str) -> Vec<String> {
    let insns: Vec<&str> =
        s.lines().map(str::trim).filter(|x| !x.is_empty() && !x.starts_with(';') && !x.ends_with(':')).collect();
    let mut found = Vec::new();
    for (i, l) in insns.iter().enumerate() {
        let is_load =
            (l.starts_with("flat_load_dwordx2") || l.starts_with("global_load_dwordx2")) && l.ends_with("sc0 sc1");
        let next = insns[i + 1..].iter().find(|x| !x.starts_with("s_waitcnt"));
        if is_load && next == Some(&"buffer_inv sc0 sc1") {
            found.push(l.to_string());
        }
    }
    found
}

/// 64-bit loads at system scope not followed by an invalidate: the relaxed loads (`dc_wait`'s
/// peer-status and own-ack reads, the block-start status reads).
fn relaxed_system_loads(s: &str) -> usize {
    s.lines().map(str::trim).filter(|l| l.starts_with("flat_load_dwordx2") && l.ends_with("sc0 sc1")).count()
        - acquire_loads(s).len()
}

fn check_polls(gfx: &str, s: &str) {
    let polls = acquire_loads(s);
    println!(
        "{gfx}: {} system-scope acquire loads (load sc0 sc1, then buffer_inv sc0 sc1), {} relaxed system-scope 64-bit loads:",
        polls.len(),
        relaxed_system_loads(s)
    );
    for p in &polls {
        println!("  {p}");
    }
    // Two waits (ready, phase 2) in each of detcoll_collective_s / _m, each polling with an
    // acquire load.
    assert!(polls.len() >= 4, "{gfx}: expected >= 4 acquire loads in the waits, found {polls:?}");
    // Generic (flat) addresses: the kernels cannot tell the load's target; the source does
    // (`h.ctl[t]`, the peer's block). A global_ load here would mean the compiler proved an
    // address space: update docs/rocm.md.
    assert!(polls.iter().all(|p| p.starts_with("flat_load_dwordx2")), "{gfx}: {polls:?}");
}

/// The code object's ELF header: ELFOSABI_AMDGPU_HSA (64) and code object v5
/// (`e_ident[EI_ABIVERSION]` = ELFABIVERSION_AMDGPU_HSA_V5 = 3; v6 would be 4, which ROCm
/// before 6.3 refuses).
fn check_code_object_version(gfx: &str, co: &[u8], s: &str) {
    assert!(co.len() > 16 && co.starts_with(b"\x7fELF"), "{gfx}: not an ELF code object");
    assert_eq!(co[7], 64, "{gfx}: EI_OSABI is not ELFOSABI_AMDGPU_HSA");
    assert_eq!(co[8], build::ELFABIVERSION_AMDGPU_HSA_V5, "{gfx}: EI_ABIVERSION {} is not code object v5 (3)", co[8]);
    assert!(s.contains(".amdhsa_code_object_version 5"), "{gfx}: the assembly does not declare code object v5");
}

fn no_toolchain() -> bool {
    let none = build::toolchains().is_empty();
    if none {
        collective_core::conformance::skip(
            "no HIP compiler found (hipcc, clang-19 + lld-19, or `pip install ziglang`)",
        );
    }
    none
}

fn compile_target(gfx: &str) {
    if no_toolchain() {
        return;
    }
    let out = std::env::temp_dir().join(format!("detcoll-hip-test-{}-{gfx}", std::process::id()));
    match build::compile(&build::toolchains(), gfx, &out) {
        Ok(b) => {
            println!("{gfx}: built by {}", b.toolchain);
            let co = std::fs::read(&b.code_object).expect("code object");
            let s = std::fs::read_to_string(&b.assembly).expect("assembly");
            check_code_object_version(gfx, &co, &s);
            check_assembly(gfx, &s);
            check_polls(gfx, &s);
            let _ = std::fs::remove_dir_all(&out);
        }
        Err(BuildError::Failed { attempts, .. }) if gfx == "gfx950" => {
            collective_core::conformance::skip(&format!(
                "gfx950 needs LLVM >= 20 (`pip install ziglang`); tried:\n{}",
                attempts.join("\n")
            ));
        }
        Err(e) => panic!("{gfx}: {e}"),
    }
}

#[test]
fn hip_kernels_compile_for_gfx942() {
    compile_target("gfx942");
}

#[test]
fn hip_kernels_compile_for_gfx950() {
    compile_target("gfx950");
}

#[test]
fn missing_runtime_is_an_error_not_a_panic() {
    if hip_ipc::result::runtime_present() {
        collective_core::conformance::skip("libamdhip64 is present");
        return;
    }
    assert!(matches!(hip_ipc::runtime::device_count(), Err(Error::LibraryMissing { .. })));
    assert!(matches!(hip_ipc::runtime::Stream::new(0), Err(Error::LibraryMissing { .. })));
    assert!(matches!(hip_ipc::runtime::DeviceMemory::fine_grained(0, 4096), Err(Error::LibraryMissing { .. })));
}

#[test]
fn arch_name_is_parsed_from_device_properties() {
    let mut buf = vec![0u8; 512];
    buf[..18].copy_from_slice(b"AMD Instinct MI300");
    buf[300..322].copy_from_slice(b"gfx942:sramecc+:xnack-");
    assert_eq!(hip_ipc::runtime::find_gfx(&buf[256..]).as_deref(), Some("gfx942"));
}

/// The hiprtc configuration of the entry file, checked without ROCm: kernels/detcoll_hip.hip
/// compiled for gfx942 by the local toolchain with `-D__HIPCC_RTC__` and
/// `-include tests/hiprtc_prelude.h`, the same way as offline otherwise (HIP_FLAGS, `-S`).
///
/// The prelude STANDS IN for the HIP headers hiprtc pre-includes (it defines the attribute
/// macros, a HIP-shaped `uint4`, `__uint_as_float`, `__float_as_uint`, `__fadd_rn` and
/// `wall_clock64` as HIP does); it is not ROCm's headers. So this proves only that the entry's
/// `__HIPCC_RTC__` guards are consistent — nothing it still defines there clashes with what the
/// headers provide, and nothing it needs from them is missing — and that the result keeps the
/// strict-arithmetic properties of [`check_assembly`]. It does not prove hiprtc itself accepts
/// the file or the options (never run here: no ROCm).
#[test]
fn hip_entry_compiles_in_the_hiprtc_configuration() {
    if no_toolchain() {
        return;
    }
    let gfx = "gfx942";
    let prelude = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hiprtc_prelude.h");
    let out = std::env::temp_dir().join(format!("detcoll-hiprtc-config-{}-{gfx}.s", std::process::id()));
    let mut attempts = Vec::new();
    for tc in build::toolchains() {
        let (prog, lead) = tc.cc.split_first().expect("compiler command");
        let run = std::process::Command::new(prog)
            .args(lead)
            .args(build::HIP_FLAGS)
            .arg(format!("--offload-arch={gfx}"))
            .args(["-D__HIPCC_RTC__", "-include"])
            .arg(&prelude)
            .arg("-I")
            .arg(build::kernels_dir())
            .arg("-S")
            .arg(build::kernels_dir().join("detcoll_hip.hip"))
            .arg("-o")
            .arg(&out)
            .output()
            .expect("running the compiler");
        if run.status.success() {
            println!("{gfx} (hiprtc configuration): compiled by {}", tc.name);
            check_assembly(gfx, &std::fs::read_to_string(&out).expect("assembly"));
            let _ = std::fs::remove_file(&out);
            return;
        }
        attempts.push(format!("  {}: {}", tc.name, String::from_utf8_lossy(&run.stderr)));
    }
    panic!("the entry does not compile with -D__HIPCC_RTC__ and the test prelude:\n{}", attempts.join("\n"));
}
