//! The CPU twin of detcoll: the engine (`ipc_engine::IpcCollective`) on a host device.
//!
//! [`HostDevice`] implements the engine's device traits on host memory, and its "kernel" is the
//! reference executor of the kernel ABI (`executor`): it runs the packed parameters the GPU
//! kernels receive (header and segments, as `dc_collective` in `kernels/detcoll_protocol.h`
//! reads them) on the calling thread — the same three modes (pull, LL push, bulk push), flags,
//! tiles, epoch refresh and error record. So there is one host path for every backend (the
//! engine's validation, routes, chunks, packing, poison, close), and CI runs it without a GPU.
//!
//! Between processes each rank's staging is an unnamed file in `/dev/shm`, reserved at creation
//! and opened by peers through `/proc/<pid>/fd` (a named object unlinked once every rank mapped
//! it where that is not possible); between threads it is heap memory shared directly. A wait
//! also notices a peer process that exited, and a shared object truncated under its mappings
//! by any process is a typed error on the ranks that meet it, not a `SIGBUS` (see the guard
//! module). [`ShmCollective`] is that engine built from a [`ShmConfig`]; it passes the same
//! conformance suite as the GPU twins.
//!
//! ```
//! use collective_core::{Collective, Io};
//! use shm_ipc::{ShmCollective, ShmConfig};
//! use half::bf16;
//!
//! let ranks = ShmCollective::group(4, ShmConfig::new(1 << 20))?; // 4 ranks as threads
//! let outs: Vec<Vec<bf16>> = std::thread::scope(|s| {
//!     let hs: Vec<_> = ranks.iter().map(|comm| s.spawn(move || {
//!         let input = vec![bf16::from_f32(comm.rank() as f32 + 0.1); 1024];
//!         let mut out = vec![bf16::ZERO; 1024];
//!         comm.all_reduce(Io::host(&input, &mut out), &()).unwrap(); // (r0+r1)+(r2+r3), in bf16
//!         out
//!     })).collect();
//!     hs.into_iter().map(|h| h.join().unwrap()).collect()
//! });
//! let x = |r: f32| bf16::from_f32(r + 0.1);
//! let want = (x(0.0) + x(1.0)) + (x(2.0) + x(3.0));
//! assert!(outs.iter().all(|o| o.iter().all(|v| v.to_bits() == want.to_bits())));
//! # Ok::<(), collective_core::Error>(())
//! ```

mod collective;
mod config;
mod device;
mod executor;
mod guard;
mod liveness;
mod norm;
mod region;
#[doc(hidden)]
pub mod testing;

pub use collective::ShmCollective;
pub use config::ShmConfig;
pub use device::{HostAllocation, HostDevice, HostKernels, HostMapping, HostRecord, HostStaging};
