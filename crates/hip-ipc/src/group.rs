//! Constructors in HIP terms (device ordinals) over the engine's generic ones
//! ([`ipc_engine::IpcCollective::group`], [`ipc_engine::IpcCollective::new`]).
use crate::device::HipDevice;
use crate::{HipIpcCollective, HipIpcConfig};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;

/// `world` ranks as threads sharing HIP device `ordinal`. Returns [`Error::LibraryMissing`]
/// when there is no HIP runtime (instead of panicking).
pub fn group_on_ordinal(ordinal: usize, world: usize, config: &HipIpcConfig) -> Result<Vec<HipIpcCollective>, Error> {
    HipIpcCollective::group_on(&HipDevice::open(ordinal)?, world, config)
}

/// One rank per entry of `ordinals` (rank `r` runs on HIP device `ordinals[r]`), all in this
/// process; ranks on one device share its code object. See
/// [`ipc_engine::IpcCollective::group`].
pub fn group(ordinals: &[usize], config: &HipIpcConfig) -> Result<Vec<HipIpcCollective>, Error> {
    let mut devices: Vec<HipDevice> = Vec::with_capacity(ordinals.len());
    for &o in ordinals {
        let d = match devices.iter().find(|d| d.ordinal() == o) {
            Some(d) => d.clone(),
            None => HipDevice::open(o)?,
        };
        devices.push(d);
    }
    HipIpcCollective::group(&devices, config)
}

/// One rank of a group with one process per rank, on HIP device `ordinal` (see
/// [`ipc_engine::IpcCollective::new`]).
pub fn new(boot: Box<dyn Bootstrap>, ordinal: usize, config: &HipIpcConfig) -> Result<HipIpcCollective, Error> {
    HipIpcCollective::new(boot, HipDevice::open(ordinal)?, config)
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
