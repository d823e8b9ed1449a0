//! What the GPU tests share: a thread group of the NVIDIA collective on this host's GPUs (all
//! ranks on GPU 0 of a one-GPU host), one host thread and one stream per rank, and uploads.
use collective_factory::{Config, NvidiaCollective, nvidia};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use detcoll_layers::cuda::Rendezvous;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// One rank's view in [`on_ranks`]: its collective, its own stream and the group's barrier
/// (one party per rank; also what [`detcoll_layers::cuda::Lockstep`] waits on).
pub struct Rank<'a> {
    pub comm: &'a NvidiaCollective,
    pub stream: Arc<CudaStream>,
    pub barrier: &'a Rendezvous,
}

/// A `world`-rank thread group with `capacity` staging bytes, or `None` (a skip line printed)
/// without a CUDA device or cuBLAS. cudarc's event tracking is disabled on the ranks' contexts:
/// each rank uses its buffers on its one stream, and graph capture must not record cudarc's
/// tracking events.
///
/// The group holds the process's GPU lock: tests of one binary run in parallel threads, and
/// ranks sharing a GPU must not see another group allocate while their collectives are in
/// flight, so one group at a time uses the GPU.
pub fn group(world: usize, capacity: usize) -> Option<Group> {
    available()?;
    static GPU: Mutex<()> = Mutex::new(());
    let lock = GPU.lock().unwrap_or_else(|p| p.into_inner());
    let config = detcoll_layers::cuda::thread_group_config(Config::new().with_capacity(capacity), world)
        .expect("the thread group's configuration");
    let ranks = nvidia::thread_group(world, &config).expect("a thread group");
    for r in &ranks {
        // SAFETY: every buffer of these tests is used on its rank's one stream only.
        unsafe { r.context().disable_event_tracking() };
    }
    Some(Group { ranks, _lock: lock })
}

/// The ranks of a thread group, and the GPU lock while they live (dropped after them).
pub struct Group {
    ranks: Vec<NvidiaCollective>,
    _lock: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Group {
    type Target = [NvidiaCollective];
    fn deref(&self) -> &[NvidiaCollective] {
        &self.ranks
    }
}

/// `Some(())` when a CUDA device and cuBLAS are there, else `None` with a skip line printed.
pub fn available() -> Option<()> {
    if let Err(e) = detcoll_layers::cuda::require_device() {
        println!("skipped: no CUDA device ({e}: {:?})", std::error::Error::source(&e));
        return None;
    }
    if let Err(e) = detcoll_layers::cuda::blas::ensure_cublas() {
        println!("skipped: no cuBLAS ({e})");
        return None;
    }
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // Up to 8 ranks share one GPU, each with its own stream, and their kernels wait for each
        // other: fewer hardware queues than streams can serialise them (`cargo xtask gpu-test`
        // sets 32).
        println!("note: CUDA_DEVICE_MAX_CONNECTIONS is unset; set it to 32 for the 8-rank groups");
    }
    if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        // Lazy loading loads a kernel (cuBLAS's too) at its first launch, which can wait for the
        // device while a peer's collective spins (`cargo xtask gpu-test` sets EAGER).
        println!("note: CUDA_MODULE_LOADING is unset; set it to EAGER for groups sharing one GPU");
    }
    Some(())
}

/// Runs `f` on every rank, one host thread each with a stream of its own; results in rank
/// order. A rank that panics poisons the group's rendezvous first, so that its peers fail at
/// their next wait instead of waiting for it forever.
pub fn on_ranks<R: Send>(ranks: &[NvidiaCollective], f: impl Fn(Rank<'_>) -> R + Sync) -> Vec<R> {
    let barrier = Rendezvous::new(ranks.len(), Duration::from_secs(60));
    std::thread::scope(|s| {
        let (f, barrier) = (&f, &barrier);
        let hs: Vec<_> = ranks
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let stream = comm.context().new_stream().expect("a stream");
                    let run = std::panic::AssertUnwindSafe(|| f(Rank { comm, stream, barrier }));
                    match std::panic::catch_unwind(run) {
                        Ok(r) => r,
                        Err(panic) => {
                            barrier.poison("a rank panicked");
                            std::panic::resume_unwind(panic)
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// `host` on the device.
pub fn upload<T: DeviceRepr>(stream: &Arc<CudaStream>, host: &[T]) -> CudaSlice<T> {
    stream.clone_htod(host).expect("an upload")
}

/// `dev` on the host (synchronises the stream).
pub fn download<T: DeviceRepr>(stream: &Arc<CudaStream>, dev: &CudaSlice<T>) -> Vec<T> {
    stream.clone_dtoh(dev).expect("a download")
}
