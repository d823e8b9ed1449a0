//! What must hold on any host, GPU or not: a missing library is a typed error (never a panic),
//! construction fails closed on every rank, and the binding's layout matches `nccl.h`.
use ccl_transport::sys::{NCCL_UNIQUE_ID_BYTES, ncclConfig_t, ncclUniqueId};
use ccl_transport::{Device, NcclError, RawStream, TransportCollective, TransportConfig, Vendor, load_from, loader};
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::{DType, Error};
use std::ffi::OsStr;
use std::sync::{Arc, Mutex};

#[test]
fn a_missing_library_is_library_missing() {
    let list = loader::candidates(Some(Vendor::Nvidia), Some(OsStr::new("/nonexistent/libnccl.so.2")), None);
    assert_eq!(list, ["/nonexistent/libnccl.so.2"]);
    let e = load_from(&list).expect_err("nothing there");
    assert!(matches!(e, NcclError::LibraryMissing { .. }), "{e:?}");
    assert!(matches!(Error::from(e), Error::LibraryMissing { .. }));
}

#[test]
fn binding_layout_matches_nccl_h() {
    assert_eq!(size_of::<ncclUniqueId>(), NCCL_UNIQUE_ID_BYTES);
    assert_eq!(size_of::<ncclConfig_t>(), 80);
    let id = ncclUniqueId::from_bytes(&[7u8; 128]).expect("128 bytes");
    assert_eq!(id.to_bytes(), [7u8; 128]);
}

/// A device side that never works: lets construction run without a GPU. Records the kernel
/// worlds construction asks it to load.
#[derive(Debug, Default)]
struct NoDevice {
    loaded: Arc<Mutex<Vec<usize>>>,
}

fn nope() -> Error {
    Error::Backend { backend: "test", detail: "no device".into() }
}

impl Device for NoDevice {
    type Stream = ();
    type Allocation = ();
    type Event = ();
    const VENDOR: Vendor = Vendor::Nvidia;
    fn describe(&self) -> String {
        "none".into()
    }
    fn raw_stream(&self, _: &()) -> Result<RawStream, Error> {
        Err(nope())
    }
    fn bind(&self) -> Result<(), Error> {
        Ok(())
    }
    fn load_tree(&self, world: usize) -> Result<(), Error> {
        self.loaded.lock().expect("not poisoned").push(world);
        Ok(())
    }
    fn alloc(&self, _: usize) -> Result<(), Error> {
        Err(nope())
    }
    fn address(&self, _: &()) -> u64 {
        0
    }
    fn leak(&self, _: ()) {}
    unsafe fn copy(&self, _: u64, _: u64, _: usize, _: RawStream) -> Result<(), Error> {
        Err(nope())
    }
    unsafe fn copy_to_host(&self, _: *mut u8, _: u64, _: usize, _: RawStream) -> Result<(), Error> {
        Err(nope())
    }
    unsafe fn copy_from_host(&self, _: u64, _: *const u8, _: usize, _: RawStream) -> Result<(), Error> {
        Err(nope())
    }
    unsafe fn tree(&self, _: &[u64], _: u64, _: usize, _: DType, _: RawStream) -> Result<(), Error> {
        Err(nope())
    }
    fn event(&self) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn record(&self, _: &(), _: RawStream) -> Result<(), Error> {
        Err(nope())
    }
    unsafe fn wait_event(&self, _: RawStream, _: &()) -> Result<(), Error> {
        Err(nope())
    }
    fn event_done(&self, _: &()) -> Result<bool, Error> {
        Ok(true)
    }
    unsafe fn stream_done(&self, _: RawStream) -> Result<bool, Error> {
        Ok(true)
    }
}

/// Builds one rank per thread; returns every rank's outcome.
fn build(world: usize, config_of: impl Fn(usize) -> TransportConfig + Sync) -> Vec<Result<(), Error>> {
    build_loading(world, config_of).into_iter().map(|(r, _)| r).collect()
}

/// [`build`], with the kernel worlds each rank's device was asked to load.
fn build_loading(
    world: usize,
    config_of: impl Fn(usize) -> TransportConfig + Sync,
) -> Vec<(Result<(), Error>, Vec<usize>)> {
    std::thread::scope(|s| {
        let config_of = &config_of;
        let hs: Vec<_> = LocalBootstrap::group(world)
            .into_iter()
            .map(|b| {
                s.spawn(move || {
                    let dev = NoDevice::default();
                    let loaded = dev.loaded.clone();
                    let r = TransportCollective::with_device(|| Ok(dev), &b, &config_of(b.rank())).map(drop);
                    let worlds = loaded.lock().expect("not poisoned").clone();
                    (r, worlds)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("no panic")).collect()
    })
}

#[test]
fn every_rank_fails_when_one_rank_cannot_load_the_library() {
    let got = build(2, |r| {
        if r == 0 {
            TransportConfig::default().with_library("/nonexistent/libnccl.so.2")
        } else {
            TransportConfig::default()
        }
    });
    assert!(matches!(got[0], Err(Error::LibraryMissing { .. })), "{:?}", got[0]);
    // Rank 1 either cannot load NCCL itself (no NCCL here) or learns that rank 0 cannot.
    match &got[1] {
        Err(Error::LibraryMissing { .. }) => {}
        Err(Error::ConfigMismatch { detail }) => assert!(detail.contains("rank 0"), "{detail}"),
        other => panic!("rank 1: {other:?}"),
    }
}

/// A bootstrap claiming `world` ranks whose every peer says what this rank says (for a world
/// too large to run as threads: construction fails locally before any exchange matters).
#[derive(Debug)]
struct Echo {
    world: usize,
}

impl Bootstrap for Echo {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn local_rank(&self) -> usize {
        0
    }
    fn local_world_size(&self) -> usize {
        1
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, collective_core::bootstrap::BootstrapError> {
        Ok(vec![mine.to_vec(); self.world])
    }
}

#[test]
fn worlds_above_the_canonical_trees_limit_are_refused() {
    let config = TransportConfig::default().with_library("/nonexistent/libnccl.so.2");
    let boot = Echo { world: collective_core::MAX_WORLD_SIZE + 1 };
    let dev = NoDevice::default();
    let loaded = dev.loaded.clone();
    let r = TransportCollective::with_device(|| Ok(dev), &boot, &config).map(drop);
    assert!(matches!(r, Err(Error::UnsupportedWorldSize { world: 4097 })), "{r:?}");
    assert!(loaded.lock().expect("not poisoned").is_empty(), "nothing loaded for a refused world");
}

#[test]
fn worlds_above_8_are_built_with_the_kernel_worlds_of_their_passes() {
    // No NCCL library: every rank fails at the library, past the world check and the kernel
    // loads (which come first), and each device was asked for the kernel worlds its multi-pass
    // trees launch, each at most 8: 9 = 8 + 1 then 2; 17 = 8 + 8 + 1 then 3; 100 = 12 x 8 + 4,
    // then 13 = 8 + 5, then 2. (Worlds up to 4096: the plan's unit tests.)
    let config = TransportConfig::default().with_library("/nonexistent/libnccl.so.2");
    for (world, want) in [(8usize, vec![8usize]), (9, vec![1, 2, 8]), (17, vec![1, 3, 8]), (100, vec![2, 4, 5, 8])] {
        for (rank, (r, loaded)) in build_loading(world, |_| config.clone()).into_iter().enumerate() {
            match r {
                Err(Error::LibraryMissing { .. }) => {}
                Err(Error::ConfigMismatch { detail }) => assert!(detail.contains("rank"), "{detail}"),
                other => panic!("world {world} rank {rank}: {other:?}"),
            }
            assert_eq!(loaded, want, "world {world} rank {rank}");
        }
    }
}

#[test]
fn invalid_timeouts_are_refused() {
    let c = TransportConfig::default()
        .with_timeouts(collective_core::Timeouts { peer: std::time::Duration::ZERO, ..Default::default() });
    let got = build(1, |_| c.clone());
    assert!(matches!(got[0], Err(Error::InvalidConfig { .. })), "{:?}", got[0]);
}

#[test]
fn the_cuda_constructor_never_panics_without_its_libraries() {
    // No GPU: libcuda is missing. GPU host: the named NCCL library is missing. Either way a
    // typed error, no panic.
    let boot = LocalBootstrap::group(1).pop().expect("one bootstrap");
    let config = TransportConfig::default().with_library("/nonexistent/libnccl.so.2");
    match TransportCollective::with_device(|| cuda_ipc::CudaDevice::open(0), &boot, &config) {
        Err(Error::LibraryMissing { .. }) => {}
        Err(e) => println!("device 0 unusable here: {e}"),
        Ok(_) => panic!("a nonexistent NCCL library was loaded"),
    }
    assert_eq!(boot.world_size(), 1);
}

#[test]
fn the_hip_constructors_never_panic_without_their_libraries() {
    use hip_ipc::HipDevice;
    use hip_ipc::result::runtime_present;
    // No AMD GPU: libamdhip64 is missing, and every constructor says so. AMD host: the named
    // RCCL library is missing. Either way a typed error, no panic.
    let runtime = runtime_present();
    let boot = LocalBootstrap::group(1).pop().expect("one bootstrap");
    let config = TransportConfig::default().with_library("/nonexistent/librccl.so.1");
    let missing = |r: Result<TransportCollective<HipDevice>, Error>, what: &str| match r {
        Err(Error::LibraryMissing { .. }) => {}
        Err(e) if runtime => println!("{what}: HIP device 0 unusable here: {e}"),
        Err(e) => panic!("{what} without libamdhip64: {e:?}"),
        Ok(_) => panic!("{what}: a nonexistent RCCL library was loaded"),
    };
    missing(TransportCollective::with_device(|| HipDevice::open(0), &boot, &config), "HipDevice::open");
    if !runtime {
        assert!(matches!(HipDevice::open(0), Err(Error::LibraryMissing { .. })));
    }
    assert_eq!(boot.world_size(), 1);
}
