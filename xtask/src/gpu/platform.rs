//! [`GpuPlatform`]: the vendor the GPU suites are built for, its detection on this host, and
//! what it changes in the build (cargo features) and in a bundle run (the bundle's platform
//! stands).
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// The GPU vendor the suites are built for: selects the features of the packages with a device
/// side per vendor ([`suite_features`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GpuPlatform {
    /// NVIDIA: CUDA and NCCL.
    #[default]
    Nvidia,
    /// AMD: HIP and RCCL.
    Rocm,
}

impl GpuPlatform {
    /// The name on the command line and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            GpuPlatform::Nvidia => "nvidia",
            GpuPlatform::Rocm => "rocm",
        }
    }

    /// `gpu-test`'s platform without `--platform`, from what this host has: a usable CUDA GPU →
    /// nvidia, else a usable HIP device → rocm, else nvidia (the suites then skip).
    pub fn detected(cuda: bool, hip: bool) -> GpuPlatform {
        if !cuda && hip { GpuPlatform::Rocm } else { GpuPlatform::Nvidia }
    }

    /// [`GpuPlatform::detected`] on this host (loads libcuda / libamdhip64 if present; never
    /// panics without them).
    pub fn detect() -> GpuPlatform {
        let cuda = detcoll_benches::harness::cuda_available();
        GpuPlatform::detected(cuda, !cuda && detcoll_benches::harness::hip_available())
    }
}

/// Cargo feature arguments a GPU package's suites need on `platform` beyond `-p`: the factory's
/// GPU tests are behind `cuda` / `rocm` (without them they compile to empty binaries that pass
/// with 0 tests).
pub fn suite_features(package: &str, platform: GpuPlatform) -> &'static [&'static str] {
    match (platform, package) {
        (GpuPlatform::Nvidia, "collective-factory") => &["--features", "cuda"],
        (GpuPlatform::Rocm, "collective-factory") => &["--features", "rocm"],
        // The layers' GPU path is NVIDIA only (its ROCm suites are the CPU ones).
        (GpuPlatform::Nvidia, "detcoll-layers") => &["--features", "cuda"],
        _ => &[],
    }
}

/// Whether a GPU suite is the other vendor's, which a `platform` bundle leaves out: on this
/// vendor's GPUs it only reports skipped, and without it an NVIDIA bundle fits the 64 MiB a
/// device call may carry. NVIDIA: the HIP twin's suites and the RCCL transport's (`*_hip`);
/// ROCm: the CUDA twin's and the NCCL transport's (`conformance`, `gpu`).
pub fn other_vendor_suite(platform: GpuPlatform, package: &str, target: &str) -> bool {
    match platform {
        GpuPlatform::Nvidia => package == "hip-ipc" || (package == "ccl-transport" && target.ends_with("_hip")),
        GpuPlatform::Rocm => {
            package == "cuda-ipc" || (package == "ccl-transport" && matches!(target, "conformance" | "gpu"))
        }
    }
}

/// The platform of a `gpu-test --bundle` run: the bundle's; `--platform` may only confirm it
/// (its suites cannot be rebuilt for another).
pub fn bundle_platform(bundle: GpuPlatform, asked: Option<GpuPlatform>) -> anyhow::Result<GpuPlatform> {
    match asked {
        Some(p) if p != bundle => anyhow::bail!(
            "--platform {} given, but the bundle was built for {} (make one with `cargo xtask gpu-bundle --platform {}`)",
            p.name(),
            bundle.name(),
            p.name()
        ),
        _ => Ok(bundle),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::workspace::GPU_PACKAGES;

    #[test]
    fn suite_features_follow_the_platform() {
        use GpuPlatform::{Nvidia, Rocm};
        let f = |p, pl| suite_features(p, pl).join(" ");
        assert_eq!(f("collective-factory", Nvidia), "--features cuda");
        assert_eq!(f("collective-factory", Rocm), "--features rocm");
        assert_eq!(f("detcoll-layers", Nvidia), "--features cuda");
        assert!(suite_features("detcoll-layers", Rocm).is_empty());
        // ccl-transport has no vendor features (its GPU suites run both vendors' devices).
        for p in ["ccl-transport", "cuda-ipc", "hip-ipc", "unknown"] {
            assert!(suite_features(p, Nvidia).is_empty() && suite_features(p, Rocm).is_empty(), "{p}");
        }
        // Every GPU package's arguments are well-formed cargo flags.
        for &p in GPU_PACKAGES {
            for pl in [Nvidia, Rocm] {
                let a = suite_features(p, pl);
                assert!(a.is_empty() || a[a.len() - 2] == "--features", "{p} {pl:?}: {a:?}");
            }
        }
    }

    #[test]
    fn bundles_leave_out_the_other_vendors_suites() {
        use GpuPlatform::{Nvidia, Rocm};
        for (package, target) in [("hip-ipc", "gpu"), ("hip-ipc", "conformance"), ("ccl-transport", "gpu_hip")] {
            assert!(other_vendor_suite(Nvidia, package, target) && !other_vendor_suite(Rocm, package, target));
        }
        for (package, target) in [("cuda-ipc", "gpu"), ("ccl-transport", "conformance"), ("ccl-transport", "gpu")] {
            assert!(other_vendor_suite(Rocm, package, target) && !other_vendor_suite(Nvidia, package, target));
        }
        // Every other suite goes into both: the CPU-side ones, the factory's and the layers'.
        for (package, target) in
            [("ccl-transport", "no_gpu"), ("collective-factory", "nvidia"), ("detcoll-layers", "gpu_ffn")]
        {
            assert!(!other_vendor_suite(Nvidia, package, target) && !other_vendor_suite(Rocm, package, target));
        }
    }

    #[test]
    fn platform_detection_prefers_cuda() {
        assert_eq!(GpuPlatform::detected(true, false), GpuPlatform::Nvidia);
        assert_eq!(GpuPlatform::detected(true, true), GpuPlatform::Nvidia);
        assert_eq!(GpuPlatform::detected(false, true), GpuPlatform::Rocm);
        assert_eq!(GpuPlatform::detected(false, false), GpuPlatform::Nvidia);
        assert_eq!(GpuPlatform::default(), GpuPlatform::Nvidia);
    }

    #[test]
    fn bundles_keep_their_platform() {
        use GpuPlatform::{Nvidia, Rocm};
        assert_eq!(bundle_platform(Rocm, None).unwrap(), Rocm);
        assert_eq!(bundle_platform(Rocm, Some(Rocm)).unwrap(), Rocm);
        let e = bundle_platform(Nvidia, Some(Rocm)).unwrap_err().to_string();
        assert!(e.contains("built for nvidia") && e.contains("--platform rocm"), "{e}");
    }
}
