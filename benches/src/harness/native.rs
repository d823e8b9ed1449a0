//! The native NCCL/RCCL references of the GPU backends: plain communicators of the library the
//! transport loads, measured on the same buffers as the strict collective. NOT deterministic:
//! a performance reference only, in columns labelled so.
use super::args::BenchOp;
use super::backend::NativeKind;
use anyhow::Context;
use ccl_transport::{Device, TransportCollective, TransportConfig, Watchdog};
use collective_core::bootstrap::Bootstrap;
use collective_core::{Collective, Error, Io};

/// `DETCOLL_BENCH_NATIVE=0` skips the references (e.g. under compute-sanitizer).
/// Any value but a boolean stops the bench with an error naming the variable.
pub fn wanted() -> anyhow::Result<bool> {
    Ok(collective_core::env::read("DETCOLL_BENCH_NATIVE", collective_core::env::parse_bool)?.unwrap_or(true))
}

/// One rank's native communicators, in [`NativeKind::ALL`] order.
pub struct Natives<D: Device> {
    comms: [Option<TransportCollective<D>>; 2],
}

/// Runs `make` with `kind`'s library environment set (NCCL and RCCL read the same variables at
/// communicator creation), restoring it after.
fn with_env<T>(kind: NativeKind, make: impl FnOnce() -> T) -> T {
    let pinned: &[(&str, &str)] = match kind {
        NativeKind::Default => &[],
        NativeKind::TreeSimple => &[("NCCL_ALGO", "Tree"), ("NCCL_PROTO", "Simple")],
    };
    let saved: Vec<(&str, Option<std::ffi::OsString>)> =
        pinned.iter().map(|(k, _)| (*k, std::env::var_os(k))).collect();
    for (k, v) in pinned {
        // SAFETY: `Natives::build` runs before this process created any communicator or other
        // thread that reads the environment, and the value is restored right after.
        unsafe { std::env::set_var(k, v) };
    }
    let out = make();
    for (k, v) in saved {
        // SAFETY: as above.
        unsafe {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
    out
}

impl<D: Device> Natives<D> {
    /// No references (thread runs, ranks sharing a GPU).
    pub fn none() -> Self {
        Natives { comms: [None, None] }
    }

    /// Builds both references with `make` (collective: every rank calls it, before the
    /// factory's collective so no communicator exists while the environment is changed).
    /// Blocking communicators, as the library's own default and its tests use: non-blocking
    /// calls are polled to completion on the host, which would bill the reference tens of
    /// microseconds per call. No transport watchdog either: the reference is the plain library.
    /// A failure is reported by rank 0 and leaves no references (the
    /// transport's construction fails on every rank alike).
    pub fn build(
        boot: &dyn Bootstrap,
        capacity: usize,
        make: impl Fn(&dyn Bootstrap, &TransportConfig) -> Result<TransportCollective<D>, Error>,
    ) -> Self {
        let config = TransportConfig::new(capacity).with_blocking(true).with_watchdog(Watchdog::Off);
        let tree = with_env(NativeKind::TreeSimple, || make(boot, &config));
        let default = with_env(NativeKind::Default, || make(boot, &config));
        match (default, tree) {
            (Ok(d), Ok(t)) => Natives { comms: [Some(d), Some(t)] },
            (d, t) => {
                if boot.rank() == 0 {
                    let why = d.err().or(t.err()).map(|e| format!("{e:#}")).unwrap_or_default();
                    eprintln!("[bench] no native library reference: {why}");
                }
                Self::none()
            }
        }
    }

    /// Whether `op` can run as `kind`: the library has no reduce_scatter_many, and its Tree
    /// algorithm exists for all_reduce only ("no algorithm/protocol available for function
    /// AllGather" otherwise, measured with NCCL 2.28).
    pub fn has(&self, kind: NativeKind, op: BenchOp) -> bool {
        let supported = match kind {
            NativeKind::Default => op != BenchOp::ReduceScatterMany,
            NativeKind::TreeSimple => op == BenchOp::AllReduce,
        };
        supported && self.comms[kind as usize].is_some()
    }

    /// Enqueues one native call of `op` on `stream`.
    pub fn call(&self, kind: NativeKind, op: BenchOp, io: Io<'_>, stream: &D::Stream) -> anyhow::Result<()> {
        let t = self.comms[kind as usize].as_ref().context("no native communicator")?;
        match op {
            BenchOp::AllReduce => t.native_all_reduce(io, stream)?,
            BenchOp::ReduceScatter => t.native_reduce_scatter(io, stream)?,
            // The transport's all_gather is the library's all_gather straight into the output.
            BenchOp::AllGather => t.all_gather(io, stream)?,
            BenchOp::ReduceScatterMany => anyhow::bail!("the native library has no reduce_scatter_many"),
        }
        Ok(())
    }

    /// Closes the communicators.
    pub fn close(&self) -> anyhow::Result<()> {
        for t in self.comms.iter().flatten() {
            t.close().context("closing a native communicator")?;
        }
        Ok(())
    }

    /// What the report records, e.g. `libnccl.so.2 2.28.3`.
    pub fn library(&self) -> Option<String> {
        self.comms.iter().flatten().next().map(|t| format!("{} {}", t.library(), t.library_version()))
    }
}
