//! Constructors in HIP terms (device ordinals) over the engine's generic ones
//! ([`ipc_engine::IpcCollective::group`], [`ipc_engine::IpcCollective::new`]), with the two
//! checks of ranks sharing one AMD GPU that the engine does not know about:
//!
//! * threads: CLR multiplexes a device's streams onto `GPU_MAX_HW_QUEUES` hardware queues (4
//!   when unset); streams beyond that share a queue, in order, so a rank's kernel can sit
//!   behind a peer's kernel that spins waiting for it — a deadlock the wait bound turns into a
//!   timeout at best. [`check_hw_queues`] refuses more ranks on one device than queues.
//! * processes: there is no MPS on AMD; processes sharing a GPU depend on the hardware
//!   scheduler's process slots (`hws_max_conc_proc`), and oversubscription has been reported
//!   to hang. [`new`] refuses ranks sharing a GPU unless `DETCOLL_HIP_ALLOW_SHARED_GPU=1` on
//!   every rank ([`check_shared_gpu`]).
//!
//! Neither was observed here (no AMD GPU): see docs/rocm.md ("First contact").
use crate::device::HipDevice;
use crate::{HipIpcCollective, HipIpcConfig};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use ipc_engine::IpcDevice;

/// CLR's hardware-queue count per device. It must be set before HIP initialises (before the
/// first HIP call of the process), so it is checked, never set, here.
pub const HW_QUEUES_ENV: &str = "GPU_MAX_HW_QUEUES";
/// CLR's `GPU_MAX_HW_QUEUES` when unset.
pub const DEFAULT_HW_QUEUES: usize = 4;
/// Set to `1` (any `collective_core::env::parse_bool` truth) on every rank to let process
/// ranks share one GPU.
pub const ALLOW_SHARED_GPU_ENV: &str = "DETCOLL_HIP_ALLOW_SHARED_GPU";

/// Whether thread ranks on `ordinals` (rank r on device `ordinals[r]`) fit in the hardware
/// queues: at most the effective `GPU_MAX_HW_QUEUES` (`queues_env`: its value, unset = 4)
/// ranks on any one device, each rank's stream on its own queue. Otherwise an
/// [`Error::InvalidConfig`] naming the variable and the value needed; an unparsable value is
/// one too.
pub fn check_hw_queues(ordinals: &[usize], queues_env: Option<&str>) -> Result<(), Error> {
    let queues = match queues_env.map(str::trim) {
        None => DEFAULT_HW_QUEUES,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(Error::InvalidConfig {
                    detail: format!("{HW_QUEUES_ENV}={v:?}: expected a positive number of hardware queues"),
                });
            }
        },
    };
    let mut most = (0usize, 0usize); // (ranks, ordinal)
    for &o in ordinals {
        let n = ordinals.iter().filter(|&&x| x == o).count();
        if n > most.0 {
            most = (n, o);
        }
    }
    let (ranks, ordinal) = most;
    if ranks <= queues {
        return Ok(());
    }
    let how = if queues_env.is_some() { "is" } else { "defaults to" };
    Err(Error::InvalidConfig {
        detail: format!(
            "{ranks} ranks share HIP device {ordinal} but {HW_QUEUES_ENV} {how} {queues}: streams beyond the hardware \
             queues share one and spinning ranks deadlock; set {HW_QUEUES_ENV}={ranks} (or more) in the environment \
             before the process starts (HIP reads it at initialisation)"
        ),
    })
}

/// One rank's word in the shared-GPU exchange of [`new`]: 0 = not allowed, 1 = allowed,
/// 2 = `DETCOLL_HIP_ALLOW_SHARED_GPU` unparsable (every rank then fails, not just this one).
fn allow_code(value: Option<&str>) -> (u8, Option<Error>) {
    match value.map(|v| collective_core::env::parse_bool(ALLOW_SHARED_GPU_ENV, v)) {
        None | Some(Ok(false)) => (0, None),
        Some(Ok(true)) => (1, None),
        Some(Err(e)) => (2, Some(e)),
    }
}

/// The decision for process ranks, from every rank's `(device identity, allow code)` in rank
/// order: ranks sharing a GPU (equal identities) are refused with an [`Error::InvalidConfig`]
/// unless every rank allows it; an unparsable value on any rank refuses the group. Every rank
/// computes the same answer from the same exchange.
pub fn check_shared_gpu(ranks: &[([u8; 16], u8)]) -> Result<(), Error> {
    if let Some(r) = ranks.iter().position(|(_, a)| *a > 1) {
        return Err(Error::InvalidConfig {
            detail: format!(
                "rank {r} has an invalid {ALLOW_SHARED_GPU_ENV} (expected 1/true/yes/on or 0/false/no/off)"
            ),
        });
    }
    let Some((r, q)) = ranks
        .iter()
        .enumerate()
        .find_map(|(r, (id, _))| ranks[..r].iter().position(|(other, _)| other == id).map(|q| (r, q)))
    else {
        return Ok(());
    };
    if ranks.iter().all(|(_, a)| *a == 1) {
        return Ok(());
    }
    Err(Error::InvalidConfig {
        detail: format!(
            "ranks {q} and {r} drive the same GPU: AMD has no MPS, processes sharing a GPU depend on the hardware \
             scheduler's process slots (hws_max_conc_proc) and oversubscription has been reported to hang; give each \
             rank its own GPU, or set {ALLOW_SHARED_GPU_ENV}=1 on every rank (and max_blocks so the ranks' grids fit)"
        ),
    })
}

/// `world` ranks as threads sharing HIP device `ordinal`. Returns [`Error::LibraryMissing`]
/// when there is no HIP runtime (instead of panicking).
/// More than `GPU_MAX_HW_QUEUES` ranks (4 when unset) is an [`Error::InvalidConfig`]
/// ([`check_hw_queues`]).
///
/// ```no_run
/// let ranks = hip_ipc::group_on_ordinal(0, 2, &hip_ipc::HipIpcConfig::new(1 << 20)).expect("HIP device 0");
/// # let _ = ranks;
/// ```
pub fn group_on_ordinal(ordinal: usize, world: usize, config: &HipIpcConfig) -> Result<Vec<HipIpcCollective>, Error> {
    let device = HipDevice::open(ordinal)?;
    check_hw_queues(&vec![ordinal; world], collective_core::env::var(HW_QUEUES_ENV)?.as_deref())?;
    HipIpcCollective::group_on(&device, world, config)
}

/// One rank per entry of `ordinals` (rank `r` runs on HIP device `ordinals[r]`), all in this
/// process; ranks on one device share its code object. See
/// [`ipc_engine::IpcCollective::group`]. More ranks on one device than `GPU_MAX_HW_QUEUES`
/// (4 when unset) is an [`Error::InvalidConfig`] ([`check_hw_queues`]).
pub fn group(ordinals: &[usize], config: &HipIpcConfig) -> Result<Vec<HipIpcCollective>, Error> {
    let mut devices: Vec<HipDevice> = Vec::with_capacity(ordinals.len());
    for &o in ordinals {
        let d = match devices.iter().find(|d| d.ordinal() == o) {
            Some(d) => d.clone(),
            None => HipDevice::open(o)?,
        };
        devices.push(d);
    }
    check_hw_queues(ordinals, collective_core::env::var(HW_QUEUES_ENV)?.as_deref())?;
    HipIpcCollective::group(&devices, config)
}

/// One rank of a group with one process per rank, on HIP device `ordinal` (see
/// [`ipc_engine::IpcCollective::new`] and [`new_on`]).
pub fn new(boot: Box<dyn Bootstrap>, ordinal: usize, config: &HipIpcConfig) -> Result<HipIpcCollective, Error> {
    new_on(boot, HipDevice::open(ordinal)?, config)
}

/// One rank of a group with one process per rank, on `device`. Before the engine's
/// construction, one extra bootstrap exchange of every rank's device identity (PCI bus id) and
/// `DETCOLL_HIP_ALLOW_SHARED_GPU`: ranks sharing a GPU are refused unless every rank allows it
/// ([`check_shared_gpu`]; the same answer on every rank).
pub fn new_on(boot: Box<dyn Bootstrap>, device: HipDevice, config: &HipIpcConfig) -> Result<HipIpcCollective, Error> {
    if boot.world_size() > 1 {
        let (code, own_error) = allow_code(collective_core::env::var(ALLOW_SHARED_GPU_ENV)?.as_deref());
        let mut mine = device.identity()?.to_vec();
        mine.push(code);
        let all = boot.all_gather_bytes(&mine)?;
        let mut ranks = Vec::with_capacity(all.len());
        for (q, b) in all.iter().enumerate() {
            let (id, a) = b.split_at_checked(16).filter(|(_, a)| a.len() == 1).ok_or_else(|| Error::InvalidConfig {
                detail: format!("rank {q} sent {} bytes in the shared-GPU exchange, expected 17", b.len()),
            })?;
            ranks.push((id.try_into().unwrap_or([0; 16]), a[0]));
        }
        if let Some(e) = own_error {
            return Err(e);
        }
        check_shared_gpu(&ranks)?;
    }
    HipIpcCollective::new(boot, device, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use collective_core::bootstrap::BootstrapError;

    /// A bootstrap that must never be reached: construction fails before any exchange.
    #[derive(Debug)]
    struct Unreachable;
    impl Bootstrap for Unreachable {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            2
        }
        fn local_rank(&self) -> usize {
            0
        }
        fn local_world_size(&self) -> usize {
            2
        }
        fn all_gather_bytes(&self, _mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
            unreachable!("construction must fail before the first exchange")
        }
    }

    #[test]
    fn thread_ranks_per_device_must_fit_the_hardware_queues() {
        // Unset: CLR's default of 4.
        assert!(check_hw_queues(&[0; 4], None).is_ok());
        assert!(check_hw_queues(&[0, 1, 2, 3, 4, 5, 6, 7], None).is_ok());
        assert!(check_hw_queues(&[0, 0, 0, 0, 1, 1, 1, 1], None).is_ok());
        assert!(check_hw_queues(&[], None).is_ok());
        assert!(check_hw_queues(&[0; 8], Some("8")).is_ok());
        assert!(check_hw_queues(&[0; 8], Some(" 16 ")).is_ok());
        for (ordinals, env, needed, what) in [
            (vec![0; 5], None, 5, "defaults to 4"),
            (vec![0; 8], None, 8, "defaults to 4"),
            (vec![0; 8], Some("4"), 8, "is 4"),
            (vec![1, 0, 1, 1, 1, 1], Some("2"), 5, "is 2"),
        ] {
            match check_hw_queues(&ordinals, env) {
                Err(Error::InvalidConfig { detail }) => {
                    assert!(detail.contains(&format!("{HW_QUEUES_ENV}={needed}")), "{detail}");
                    assert!(detail.contains(what), "{detail}");
                }
                other => panic!("{ordinals:?} {env:?}: expected InvalidConfig, got {other:?}"),
            }
        }
        for bad in ["", "0", "-1", "eight"] {
            match check_hw_queues(&[0], Some(bad)) {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(HW_QUEUES_ENV), "{detail}"),
                other => panic!("{bad:?}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn process_ranks_sharing_a_gpu_are_refused_unless_every_rank_allows_it() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert_eq!(allow_code(None).0, 0);
        assert_eq!(allow_code(Some("0")).0, 0);
        assert_eq!(allow_code(Some("1")).0, 1);
        assert_eq!(allow_code(Some(" yes ")).0, 1);
        assert!(matches!(allow_code(Some("maybe")), (2, Some(Error::InvalidConfig { .. }))));
        // Distinct GPUs: allowed whatever the variable says.
        assert!(check_shared_gpu(&[(a, 0), (b, 0)]).is_ok());
        assert!(check_shared_gpu(&[(a, 0)]).is_ok());
        // Shared, allowed on every rank.
        assert!(check_shared_gpu(&[(a, 1), (b, 1), (a, 1)]).is_ok());
        // Shared, not allowed everywhere: refused, naming the ranks and the variable.
        for ranks in [vec![(a, 0), (a, 0)], vec![(a, 1), (b, 1), (a, 0)], vec![(b, 0), (a, 1), (a, 1)]] {
            match check_shared_gpu(&ranks) {
                Err(Error::InvalidConfig { detail }) => {
                    assert!(detail.contains(ALLOW_SHARED_GPU_ENV) && detail.contains("hws_max_conc_proc"), "{detail}")
                }
                other => panic!("{ranks:?}: expected InvalidConfig, got {other:?}"),
            }
        }
        match check_shared_gpu(&[(a, 0), (a, 1)]) {
            Err(Error::InvalidConfig { detail }) => assert!(detail.contains("ranks 0 and 1"), "{detail}"),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
        // An invalid value on any rank refuses the group, shared or not.
        match check_shared_gpu(&[(a, 1), (b, 2)]) {
            Err(Error::InvalidConfig { detail }) => assert!(detail.contains("rank 1 has an invalid"), "{detail}"),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn no_runtime_is_library_missing() {
        if crate::result::runtime_present() {
            eprintln!("skipped: libamdhip64 is present");
            return;
        }
        let config = HipIpcConfig::new(1 << 20);
        for world in [1, 2, 8] {
            match group_on_ordinal(0, world, &config) {
                Err(Error::LibraryMissing { .. }) => {}
                other => panic!("world {world}: expected LibraryMissing, got {other:?}"),
            }
        }
        match group(&[0, 1], &config) {
            Err(Error::LibraryMissing { .. }) => {}
            other => panic!("expected LibraryMissing, got {other:?}"),
        }
        match new(Box::new(Unreachable), 0, &config) {
            Err(Error::LibraryMissing { .. }) => {}
            other => panic!("expected LibraryMissing, got {other:?}"),
        }
    }
}
