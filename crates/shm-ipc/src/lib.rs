//! The CPU twin of detcoll: the IPC protocol of `collective_core::protocol` executed on the
//! host, over shared memory.
//!
//! Each rank owns one region laid out by [`collective_core::protocol::Layout`]: a control block
//! (flags on their own lines) and two staging frames. Between processes the regions are unnamed
//! files in `/dev/shm`, reserved at creation and opened by peers through `/proc/<pid>/fd` (a
//! named object unlinked once every rank mapped it where that is not possible); between threads
//! they are heap allocations shared directly. Every call stages,
//! publishes `generation | signature digest` with a release store, waits (bounded, noticing a
//! dead peer process) for every peer's matching flag, and evaluates the fixed tree reading the
//! peers in rank order — the same protocol the GPU twins run inside one kernel. A shared object
//! truncated under its mappings by any process is a typed error on the ranks that meet it, not
//! a `SIGBUS` (see the guard module).
//!
//! CI and CPU users run the real protocol through this crate; it passes the same conformance
//! suite as the GPU twins.
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
mod engine;
mod executor;
mod guard;
mod region;
#[doc(hidden)]
pub mod testing;
mod wait;

pub use collective::ShmCollective;
pub use config::ShmConfig;
pub use device::{HostAllocation, HostDevice, HostKernels, HostMapping, HostRecord, HostStaging};
