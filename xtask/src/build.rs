//! `cargo xtask build --arch gfx942,gfx950,sm_90`: prebuilt kernel images in `kernels/build/`.
//!
//! * `gfxNNN`: kernels/detcoll_hip.hip -> `detcoll_hip.<gfx>.{co,s}` through
//!   `hip_ipc::build` (hipcc when ROCm is installed, else a system clang, else zig's clang);
//! * `sm_XY`: kernels/detcoll_cuda.cu -> `detcoll_cuda.<sm_XY>.cubin` with `nvcc -cubin` when
//!   nvcc exists, else `detcoll_cuda.<sm_XY>.{cubin,ptx}` with NVRTC (the library cuda-ipc uses
//!   at run time, also found in a pip `nvidia-cuda-nvrtc` wheel).
//!
//! Prints which compiler built which target; fails only when a requested target could not be
//! built by anything.
use crate::util::{show, which, workspace_root};
use anyhow::Context;
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Arguments of `cargo xtask build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Comma-separated targets: gfxNNN (AMD) and sm_XY (NVIDIA), e.g. gfx942,gfx950,sm_90.
    #[arg(long, value_delimiter = ',', required = true)]
    pub arch: Vec<String>,
    /// Output folder (default: kernels/build of the workspace).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn main(args: BuildArgs) -> anyhow::Result<ExitCode> {
    let root = workspace_root()?;
    let out = args.out.unwrap_or_else(|| root.join("kernels").join("build"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let hip = hip_ipc::build::toolchains();
    let mut failed = Vec::new();
    for target in args.arch.iter().map(|a| a.trim()).filter(|a| !a.is_empty()) {
        let result = if hip_ipc::build::is_gfx(target) {
            build_gfx(&hip, target, &out)
        } else if is_sm(target) {
            build_sm(&root, target, &out)
        } else {
            Err(anyhow::anyhow!("unknown target `{target}`: expected gfxNNN or sm_XY"))
        };
        match result {
            Ok(line) => println!("[build] {target}: {line}"),
            Err(e) => {
                eprintln!("[build] {target}: FAILED: {e:#}");
                failed.push(target.to_string());
            }
        }
    }
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("[build] not built: {}", failed.join(", "));
        Ok(ExitCode::FAILURE)
    }
}

fn is_sm(t: &str) -> bool {
    t.strip_prefix("sm_").is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_alphanumeric()))
}

fn build_gfx(toolchains: &[hip_ipc::build::Toolchain], gfx: &str, out: &Path) -> anyhow::Result<String> {
    let b = hip_ipc::build::compile(toolchains, gfx, out)?;
    Ok(format!("{} and {} built by {}", b.code_object.display(), b.assembly.display(), b.toolchain))
}

fn build_sm(root: &Path, sm: &str, out: &Path) -> anyhow::Result<String> {
    let kernels = root.join("kernels");
    if let Some(nvcc) = which("nvcc") {
        let cubin = out.join(format!("detcoll_cuda.{sm}.cubin"));
        let mut cmd = Command::new(nvcc);
        cmd.args(["-cubin", &format!("-arch={sm}")])
            .args(cuda_ipc::kernels::NVRTC_FLAGS.map(|f| f.replace("--std=", "-std=")))
            .arg("-I")
            .arg(&kernels)
            .arg("-o")
            .arg(&cubin)
            .arg(kernels.join("detcoll_cuda.cu"));
        let status = cmd.status().with_context(|| show(&cmd))?;
        anyhow::ensure!(status.success(), "{} failed", show(&cmd));
        return Ok(format!("{} built by nvcc", cubin.display()));
    }
    load_wheel_nvrtc();
    use cuda_ipc::kernels::{ImageKind, compile};
    let cubin = compile(sm, ImageKind::Cubin).context("NVRTC (install nvcc, or `pip install nvidia-cuda-nvrtc`)")?;
    let mut ptx = compile(sm, ImageKind::Ptx)?;
    if ptx.last() == Some(&0) {
        ptx.pop();
    }
    let (c, p) = (out.join(format!("detcoll_cuda.{sm}.cubin")), out.join(format!("detcoll_cuda.{sm}.ptx")));
    std::fs::write(&c, cubin)?;
    std::fs::write(&p, ptx)?;
    Ok(format!("{} and {} built by NVRTC (nvcc not found)", c.display(), p.display()))
}

/// Makes NVRTC from a pip wheel (`site-packages/nvidia/*/lib/libnvrtc.so.*`) loadable when the
/// loader's path has none.
fn load_wheel_nvrtc() {
    if cuda_ipc::kernels::ensure_nvrtc().is_ok() {
        return;
    }
    let script = "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))";
    let Ok(o) = Command::new("python3").args(["-c", script]).output() else { return };
    for root in String::from_utf8_lossy(&o.stdout).lines().map(PathBuf::from) {
        let Ok(vendors) = std::fs::read_dir(root.join("nvidia")) else { continue };
        for lib in vendors.flatten().filter_map(|v| std::fs::read_dir(v.path().join("lib")).ok()).flatten().flatten() {
            let name = lib.file_name().to_string_lossy().into_owned();
            if name.starts_with("libnvrtc.so.")
                && !name.contains("builtins")
                && cuda_ipc::kernels::load_nvrtc_from(&lib.path()).is_ok()
            {
                return;
            }
        }
    }
}
