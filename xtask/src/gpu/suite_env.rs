//! The variables `gpu-test` sets in a suite's environment, each with the reason it prints:
//! CUDA connections (fewer under MPS, whose clients share them), the process-test switch (only
//! where MPS lets processes share a GPU) and ROCm's hardware queues.
use super::platform::GpuPlatform;

/// CUDA's hardware work queues per context; `gpu-test` sets it for every suite.
pub const CONNECTIONS_ENV: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
/// Overrides [`MPS_CONNECTIONS`] for suites running several processes per GPU under MPS.
pub const MPS_CONNECTIONS_ENV: &str = "DETCOLL_MPS_CONNECTIONS";
/// Connections of each process of a suite running several processes per GPU under MPS. MPS
/// caps the connections of all its clients together: with 32 each, worlds of 4 or more
/// processes fail at context creation with `CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED`
/// (measured on an H200); with 2 every world passes.
pub const MPS_CONNECTIONS: u32 = 2;
/// Connections of every other suite unless the user set [`CONNECTIONS_ENV`]: in-process worlds
/// run every rank on its own stream of one context (8 ranks, 8 streams) and want each stream
/// on its own hardware queue (fewer can serialise one rank's kernel behind another's).
pub const IN_PROCESS_CONNECTIONS: u32 = 32;
/// Lets the CUDA conformance suite with one process per rank run (it skips without it, since
/// processes sharing a GPU need MPS); `gpu-test` sets it where MPS is active.
pub const PROCESS_TESTS_ENV: &str = "DETCOLL_CUDA_PROCESS_TESTS";
/// ROCm (ROCclr): hardware queues a process's HIP streams are multiplexed onto.
pub const HW_QUEUES_ENV: &str = "GPU_MAX_HW_QUEUES";
/// What `gpu-test` sets it to on AMD: one queue per rank of the largest world (8). Fewer queues
/// than ranks sharing a GPU can put a rank's kernel behind a peer's that waits for it, which
/// the protocol reports as `PeerTimeout` instead of running the test.
pub const HW_QUEUES: u32 = 8;

/// CUDA's module loading mode; `gpu-test` sets it to `EAGER` on NVIDIA unless the user set it.
pub const MODULE_LOADING_ENV: &str = "CUDA_MODULE_LOADING";

/// A variable `gpu-test` sets in one suite's environment, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteVar {
    pub name: &'static str,
    pub value: String,
    pub why: String,
}

/// Parses a connection count (CUDA accepts 1 to 32).
fn parse_connections(var: &str, value: &str) -> anyhow::Result<u32> {
    match value.trim().parse::<u32>() {
        Ok(n) if (1..=32).contains(&n) => Ok(n),
        _ => anyhow::bail!("{var}={value:?}: expected a number of connections from 1 to 32"),
    }
}

/// The [`CONNECTIONS_ENV`] of a suite: [`MPS_CONNECTIONS`] (or `mps_override`, the value of
/// [`MPS_CONNECTIONS_ENV`]) for a suite running several processes per GPU while MPS is
/// active, whatever `user` (the caller's [`CONNECTIONS_ENV`]) says; otherwise `user`, or
/// [`IN_PROCESS_CONNECTIONS`] when unset.
pub fn suite_connections(
    multiprocess: bool,
    mps_active: bool,
    user: Option<&str>,
    mps_override: Option<&str>,
) -> anyhow::Result<SuiteVar> {
    let set = |value: u32, why: String| Ok(SuiteVar { name: CONNECTIONS_ENV, value: value.to_string(), why });
    let user = user.filter(|v| !v.trim().is_empty());
    if multiprocess && mps_active {
        if let Some(v) = mps_override.filter(|v| !v.trim().is_empty()) {
            let value = parse_connections(MPS_CONNECTIONS_ENV, v)?;
            return set(value, format!("several processes per GPU under MPS; from {MPS_CONNECTIONS_ENV}"));
        }
        let ignored = user.map_or_else(String::new, |u| {
            format!("; your {CONNECTIONS_ENV}={u} is not used here, set {MPS_CONNECTIONS_ENV} to change it")
        });
        return set(
            MPS_CONNECTIONS,
            format!("several processes per GPU under MPS, whose clients share its connections{ignored}"),
        );
    }
    if let Some(u) = user {
        return set(parse_connections(CONNECTIONS_ENV, u)?, "yours".into());
    }
    let why = if multiprocess { "one context per process, no MPS" } else { "ranks' streams in one context" };
    set(IN_PROCESS_CONNECTIONS, format!("default: {why}"))
}

/// [`HW_QUEUES_ENV`] for every suite on AMD: yours when set, else [`HW_QUEUES`]; nothing on
/// NVIDIA.
pub fn hw_queues_var(platform: GpuPlatform, user: Option<&str>) -> Option<SuiteVar> {
    if platform != GpuPlatform::Rocm {
        return None;
    }
    Some(match user.filter(|v| !v.trim().is_empty()) {
        Some(u) => SuiteVar { name: HW_QUEUES_ENV, value: u.trim().to_owned(), why: "yours".into() },
        None => SuiteVar {
            name: HW_QUEUES_ENV,
            value: HW_QUEUES.to_string(),
            why: "default: one hardware queue per rank's stream, up to 8 ranks on one GPU".into(),
        },
    })
}

/// [`MODULE_LOADING_ENV`]`=EAGER` on NVIDIA unless the user set it (to anything): with CUDA's
/// default lazy loading a kernel is loaded at its first launch, which can wait for the device
/// while a peer rank's collective kernel spins on it (ranks sharing one GPU; the layers' suites
/// launch cuBLAS kernels between collectives). Nothing on AMD.
pub fn module_loading_var(platform: GpuPlatform, user_set: bool) -> Option<SuiteVar> {
    (platform == GpuPlatform::Nvidia && !user_set).then(|| SuiteVar {
        name: MODULE_LOADING_ENV,
        value: "EAGER".into(),
        why: "default: every kernel loaded with its module, none at a first launch while a peer's collective waits"
            .into(),
    })
}

/// [`PROCESS_TESTS_ENV`]`=1` for a suite running several processes per GPU while MPS is
/// active, unless the user set the variable (to anything).
pub fn process_tests_var(multiprocess: bool, mps_active: bool, user_set: bool) -> Option<SuiteVar> {
    (multiprocess && mps_active && !user_set).then(|| SuiteVar {
        name: PROCESS_TESTS_ENV,
        value: "1".into(),
        why: "MPS is active: CUDA ranks may share a GPU as processes".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amd_suites_get_a_hardware_queue_per_rank() {
        assert!(hw_queues_var(GpuPlatform::Nvidia, None).is_none());
        assert!(hw_queues_var(GpuPlatform::Nvidia, Some("4")).is_none());
        let d = hw_queues_var(GpuPlatform::Rocm, None).unwrap();
        assert_eq!((d.name, d.value.as_str()), ("GPU_MAX_HW_QUEUES", "8"));
        let y = hw_queues_var(GpuPlatform::Rocm, Some(" 16 ")).unwrap();
        assert_eq!((y.value.as_str(), y.why.as_str()), ("16", "yours"));
        assert_eq!(hw_queues_var(GpuPlatform::Rocm, Some(" ")).unwrap().value, "8");
    }

    #[test]
    fn connections_per_suite() {
        let c = |mp, mps, user, ovr| suite_connections(mp, mps, user, ovr).map(|c| c.value.parse::<u32>().unwrap());
        // Several processes per GPU under MPS: 2, whatever CUDA_DEVICE_MAX_CONNECTIONS says.
        assert_eq!(c(true, true, None, None).unwrap(), MPS_CONNECTIONS);
        assert_eq!(c(true, true, Some("32"), None).unwrap(), 2);
        let why = suite_connections(true, true, Some("32"), None).unwrap().why;
        assert!(why.contains(MPS_CONNECTIONS_ENV) && why.contains("=32"), "{why}");
        // ... unless DETCOLL_MPS_CONNECTIONS says otherwise (blank counts as unset).
        assert_eq!(c(true, true, Some("32"), Some("4")).unwrap(), 4);
        assert_eq!(c(true, true, None, Some(" ")).unwrap(), 2);
        assert!(c(true, true, None, Some("0")).is_err());
        assert!(c(true, true, None, Some("33")).is_err());
        assert!(c(true, true, None, Some("two")).is_err());
        // In-process suites (and processes without MPS): 32 unless the user set a value; the
        // MPS override does not apply to them.
        assert_eq!(c(false, false, None, None).unwrap(), IN_PROCESS_CONNECTIONS);
        assert_eq!(c(false, true, None, Some("2")).unwrap(), 32);
        assert_eq!(c(true, false, None, Some("2")).unwrap(), 32);
        assert_eq!(c(false, false, Some("8"), None).unwrap(), 8);
        assert_eq!(suite_connections(false, false, Some("8"), None).unwrap().why, "yours");
        assert_eq!(c(false, false, Some(""), None).unwrap(), 32);
        assert!(c(false, false, Some("lots"), None).is_err());
        assert_eq!(suite_connections(false, false, None, None).unwrap().name, "CUDA_DEVICE_MAX_CONNECTIONS");
    }

    #[test]
    fn nvidia_suites_load_modules_eagerly_unless_told_otherwise() {
        let v = module_loading_var(GpuPlatform::Nvidia, false).unwrap();
        assert_eq!((v.name, v.value.as_str()), ("CUDA_MODULE_LOADING", "EAGER"));
        assert_eq!(module_loading_var(GpuPlatform::Nvidia, true), None);
        assert_eq!(module_loading_var(GpuPlatform::Rocm, false), None);
    }

    #[test]
    fn process_suites_are_enabled_under_mps_only() {
        let v = process_tests_var(true, true, false).unwrap();
        assert_eq!((v.name, v.value.as_str()), ("DETCOLL_CUDA_PROCESS_TESTS", "1"));
        assert_eq!(process_tests_var(true, false, false), None);
        assert_eq!(process_tests_var(false, true, false), None);
        // The user's own value (even 0) stands.
        assert_eq!(process_tests_var(true, true, true), None);
    }
}
