//! The HIP kernel compile driver, shared by `cargo xtask build --arch gfxNNN` and the tests.
//!
//! kernels/detcoll_hip.hip is self-contained (no HIP headers, no device libraries), so any
//! clang with the AMDGPU target builds the same code object as hipcc. Toolchains, in order of
//! preference (the first that builds a target wins; a toolchain that refuses the target, e.g.
//! LLVM 19 for gfx950, falls through to the next):
//!
//! 1. ROCm: `$ROCM_PATH/bin/hipcc` (default `/opt/rocm`), with ROCm's own clang and ld.lld;
//! 2. a system clang (`clang-22` ... `clang-19`, `clang`) with ld.lld (Debian: `apt-get install
//!    clang-19 lld-19`); LLVM 19 knows gfx942 but not gfx950 (LLVM >= 20);
//! 3. the clang and ld.lld bundled with zig (`pip install ziglang`: LLVM 21+), which knows gfx950.
//!
//! Every toolchain runs the same three steps, because zig's clang cannot run its own device
//! link step (it looks for a separate lld executable):
//!
//! ```text
//! cc -x hip --offload-arch=gfxNNN --offload-device-only -nogpulib -nogpuinc <strict flags> -mcode-object-version=5 -S  -> .s
//! cc -target amdgcn-amd-amdhsa -mcpu=gfxNNN -mcode-object-version=5 -c .s                                           -> .o
//! ld.lld -shared .o                                                                           -> detcoll_hip.gfxNNN.co
//! ```
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The code object version of every HIP build: v5. Upstream clang now emits v6 by default,
/// which ROCm before 6.3 refuses at load (`HSA_STATUS_ERROR_INVALID_CODE_OBJECT`); every ROCm
/// 6 loads v5. Passed to every compile (hipcc, a system clang, zig's clang), to the assembler
/// step, and to hiprtc (through [`HIP_FLAGS`]); the compile test checks the ELF header's
/// `EI_ABIVERSION` ([`ELFABIVERSION_AMDGPU_HSA_V5`]).
pub const CODE_OBJECT_VERSION_FLAG: &str = "-mcode-object-version=5";

/// `e_ident[EI_ABIVERSION]` of an AMDHSA code object v5 (LLVM's `ELFABIVERSION_AMDGPU_HSA_V5`).
pub const ELFABIVERSION_AMDGPU_HSA_V5: u8 = 3;

/// Flags of every HIP compile: strict IEEE arithmetic (no fast math, no denormal flushing, no
/// contraction), device code only, no HIP headers or device libraries, code object v5.
pub const HIP_FLAGS: [&str; 11] = [
    "-x",
    "hip",
    "--offload-device-only",
    "-nogpulib",
    "-nogpuinc",
    "-O3",
    "-std=c++17",
    "-fno-fast-math",
    "-fno-gpu-flush-denormals-to-zero",
    "-ffp-contract=off",
    CODE_OBJECT_VERSION_FLAG,
];

/// One way to compile: the compiler, the assembler and the linker, each a program plus leading
/// arguments (zig's are `python3 -m ziglang clang`).
#[derive(Debug, Clone)]
pub struct Toolchain {
    /// Shown in messages: `hipcc (/opt/rocm)`, `clang-19`, `zig clang (ziglang)`.
    pub name: String,
    pub cc: Vec<OsString>,
    pub asm: Vec<OsString>,
    pub lld: Vec<OsString>,
}

/// What one target produced.
#[derive(Debug, Clone)]
pub struct Built {
    pub gfx: String,
    pub toolchain: String,
    pub code_object: PathBuf,
    pub assembly: PathBuf,
}

/// Why a target was not built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "no HIP-capable compiler found for {gfx}: install ROCm (hipcc), or `apt-get install clang-19 lld-19` \
         (gfx90a/gfx942), or `pip install ziglang` (LLVM >= 20, needed for gfx950)"
    )]
    NoToolchain { gfx: String },
    #[error("{gfx} could not be built by any toolchain:\n{}", .attempts.join("\n"))]
    Failed { gfx: String, attempts: Vec<String> },
    #[error("`{target}` is not a gfx target (expected e.g. gfx942)")]
    NotGfx { target: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Whether `target` names an AMD GPU (`gfx` + hex digits, e.g. `gfx942`, `gfx90a`).
pub fn is_gfx(target: &str) -> bool {
    target.len() > 3 && target.starts_with("gfx") && target[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// The kernel sources (the HIP entry and the portable headers): the `detcoll-kernels` crate's
/// folder ([`detcoll_kernels::source_dir`]), which also exists in a packaged build.
pub fn kernels_dir() -> PathBuf {
    detcoll_kernels::source_dir().to_path_buf()
}

/// `program` on `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|d| d.join(program)).find(|c| c.is_file())
}

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

fn runs(cmd: &[OsString], arg: &str) -> bool {
    let Some((prog, rest)) = cmd.split_first() else { return false };
    Command::new(prog).args(rest).arg(arg).output().is_ok_and(|o| o.status.success())
}

/// The toolchains available on this machine, in order of preference.
pub fn toolchains() -> Vec<Toolchain> {
    let mut v = Vec::new();
    let rocm = crate::sys::rocm_root();
    let hipcc = rocm.join("bin/hipcc");
    let rocm_clang = rocm.join("llvm/bin/clang");
    let rocm_lld = rocm.join("llvm/bin/ld.lld");
    if hipcc.is_file() && rocm_clang.is_file() && rocm_lld.is_file() {
        v.push(Toolchain {
            name: format!("hipcc ({})", rocm.display()),
            cc: vec![hipcc.into()],
            asm: vec![rocm_clang.into()],
            lld: vec![rocm_lld.into()],
        });
    }
    let system = ["clang-22", "clang-21", "clang-20", "clang-19", "clang"];
    if let Some((name, cc)) = system.iter().find_map(|n| which(n).map(|p| (*n, p))) {
        let suffix = name.strip_prefix("clang").unwrap_or("");
        if let Some(lld) = which(&format!("ld.lld{suffix}")).or_else(|| which("ld.lld")) {
            v.push(Toolchain {
                name: name.to_string(),
                cc: vec![cc.clone().into()],
                asm: vec![cc.into()],
                lld: vec![lld.into()],
            });
        }
    }
    let zig_py = os(&["python3", "-m", "ziglang"]);
    let zig = if which("zig").is_some() { Some(os(&["zig"])) } else { runs(&zig_py, "version").then_some(zig_py) };
    if let Some(zig) = zig {
        let with = |tool: &str| zig.iter().cloned().chain([OsString::from(tool)]).collect::<Vec<_>>();
        v.push(Toolchain { name: "zig clang".into(), cc: with("clang"), asm: with("clang"), lld: with("ld.lld") });
    }
    v
}

fn run(cmd: &[OsString], args: &[OsString]) -> Result<(), String> {
    let Some((prog, rest)) = cmd.split_first() else { return Err("empty command".into()) };
    let out = Command::new(prog).args(rest).args(args).output().map_err(|e| format!("{prog:?}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = err.lines().rev().take(6).collect();
    Err(tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
}

/// Builds `detcoll_hip.<gfx>.{s,co}` into `out_dir` with `tc`.
pub fn compile_with(tc: &Toolchain, gfx: &str, out_dir: &Path) -> Result<Built, String> {
    let kdir = kernels_dir();
    let asm = out_dir.join(format!("detcoll_hip.{gfx}.s"));
    let obj = out_dir.join(format!("detcoll_hip.{gfx}.o"));
    let co = out_dir.join(format!("detcoll_hip.{gfx}.co"));
    let mut a: Vec<OsString> = os(&HIP_FLAGS);
    a.push(format!("--offload-arch={gfx}").into());
    a.push(OsString::from("-I"));
    a.push(kdir.clone().into());
    a.extend([OsString::from("-S"), kdir.join("detcoll_hip.hip").into(), OsString::from("-o"), asm.clone().into()]);
    run(&tc.cc, &a)?;
    let mcpu = format!("-mcpu={gfx}");
    run(
        &tc.asm,
        &[
            "-target".into(),
            "amdgcn-amd-amdhsa".into(),
            mcpu.into(),
            CODE_OBJECT_VERSION_FLAG.into(),
            "-c".into(),
            asm.clone().into(),
            "-o".into(),
            obj.clone().into(),
        ],
    )?;
    run(&tc.lld, &["-shared".into(), obj.clone().into(), "-o".into(), co.clone().into()])?;
    let _ = std::fs::remove_file(&obj);
    Ok(Built { gfx: gfx.into(), toolchain: tc.name.clone(), code_object: co, assembly: asm })
}

/// Builds `gfx` with the first of `toolchains` that can.
pub fn compile(toolchains: &[Toolchain], gfx: &str, out_dir: &Path) -> Result<Built, BuildError> {
    if !is_gfx(gfx) {
        return Err(BuildError::NotGfx { target: gfx.into() });
    }
    if toolchains.is_empty() {
        return Err(BuildError::NoToolchain { gfx: gfx.into() });
    }
    std::fs::create_dir_all(out_dir)?;
    let mut attempts = Vec::new();
    for tc in toolchains {
        match compile_with(tc, gfx, out_dir) {
            Ok(b) => return Ok(b),
            Err(e) => attempts.push(format!("  {}: {e}", tc.name)),
        }
    }
    Err(BuildError::Failed { gfx: gfx.into(), attempts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compile_asks_for_code_object_v5() {
        assert!(HIP_FLAGS.contains(&CODE_OBJECT_VERSION_FLAG));
        assert_eq!(CODE_OBJECT_VERSION_FLAG, "-mcode-object-version=5");
    }

    #[test]
    fn gfx_names() {
        assert!(is_gfx("gfx942") && is_gfx("gfx950") && is_gfx("gfx90a"));
        assert!(!is_gfx("sm_90") && !is_gfx("gfx") && !is_gfx("gfx94x"));
    }
}
