//! The platform picked at run time: one constructor for every platform this build has.
//!
//! [`from_bootstrap`] and [`thread_group`] pick the platform as [`platform`] says —
//! `DETCOLL_PLATFORM` (`cpu`, `nvidia` or `rocm`) when set, else NVIDIA when feature `cuda` is
//! built and a CUDA GPU is present, else ROCm when feature `rocm` is built and an AMD GPU is
//! present, else the CPU twin when feature `cpu` is built — and call that platform's
//! constructor (`cpu`, `nvidia`, `rocm`). They return an [`AnyCollective`], one variant
//! per backend built, because the backends' stream types differ: the calls are made on the
//! variant (`as_cpu`, `as_nvidia`, `as_rocm`).
//!
//! ```
//! # fn main() -> Result<(), collective_factory::Error> {
//! use collective_factory::{AnyCollective, Config, Platform, auto};
//!
//! let ranks = auto::thread_group(2, &Config::new().with_capacity(1 << 20))?;
//! std::thread::scope(|s| {
//!     for comm in &ranks {
//!         s.spawn(move || match comm {
//!             AnyCollective::Cpu(c) => {
//!                 use collective_factory::{Collective, Io};
//!                 let input = vec![c.rank() as f32 + 0.5; 1024];
//!                 let mut out = vec![0.0f32; 1024];
//!                 c.all_reduce(Io::host(&input, &mut out), &()).unwrap(); // r0 + r1
//!                 c.synchronize(&()).unwrap(); // read only after a successful synchronize
//!                 assert_eq!(out[0], 2.0);
//!             }
//!             // A GPU build on a GPU host: the same calls on the backend's own streams.
//!             other => assert_ne!(other.platform(), Platform::Cpu),
//!         });
//!     }
//! });
//! # Ok(()) }
//! ```
// A build with no backend feature has an uninhabited `AnyCollective`: nothing reads the arguments.
#![cfg_attr(not(any(feature = "cpu", feature = "cuda", feature = "rocm")), allow(unused))]
use crate::{Config, Facts, Platform};
use collective_core::bootstrap::Bootstrap;
use collective_core::{Capabilities, Collective, Error, Op, Route};
use std::sync::Arc;

#[cfg(feature = "cpu")]
use crate::CpuCollective;
#[cfg(feature = "cuda")]
use crate::NvidiaCollective;
#[cfg(feature = "rocm")]
use crate::RocmCollective;

/// One rank of a collective on whichever platform [`platform`] picked: one variant per backend
/// this build has (features `cpu`, `cuda`, `rocm`; more may be enabled by another crate of the
/// build, hence `non_exhaustive`). Every variant is a [`Collective`]; their streams differ.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyCollective {
    /// The CPU twin (host memory, stream `()`).
    #[cfg(feature = "cpu")]
    Cpu(CpuCollective),
    /// NVIDIA GPUs (cudarc buffers and streams, see [`crate::cuda_api`]).
    #[cfg(feature = "cuda")]
    Nvidia(NvidiaCollective),
    /// AMD GPUs (device memory and streams of [`crate::hip`]).
    #[cfg(feature = "rocm")]
    Rocm(RocmCollective),
}

/// `$e` evaluated on the variant's collective, bound to `$c`.
macro_rules! each {
    ($self:expr, $c:ident => $e:expr) => {
        match *$self {
            #[cfg(feature = "cpu")]
            AnyCollective::Cpu(ref $c) => $e,
            #[cfg(feature = "cuda")]
            AnyCollective::Nvidia(ref $c) => $e,
            #[cfg(feature = "rocm")]
            AnyCollective::Rocm(ref $c) => $e,
        }
    };
}

impl AnyCollective {
    /// The platform of the variant.
    pub fn platform(&self) -> Platform {
        match *self {
            #[cfg(feature = "cpu")]
            AnyCollective::Cpu(_) => Platform::Cpu,
            #[cfg(feature = "cuda")]
            AnyCollective::Nvidia(_) => Platform::Nvidia,
            #[cfg(feature = "rocm")]
            AnyCollective::Rocm(_) => Platform::Rocm,
        }
    }
    /// This rank, in `0..world_size()`.
    pub fn rank(&self) -> usize {
        each!(self, c => c.rank())
    }
    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        each!(self, c => c.world_size())
    }
    /// What the collective supports.
    pub fn capabilities(&self) -> Capabilities {
        each!(self, c => c.capabilities())
    }
    /// The route a call of `op` moving `bytes` per rank takes (the same on every rank).
    pub fn route(&self, op: Op, bytes: usize) -> Route {
        each!(self, c => c.route(op, bytes))
    }
    /// The route of a fused all_reduce + residual + RMSNorm's all_reduce of `bytes` per rank
    /// ([`Routed::fused_norm_route`](crate::Routed::fused_norm_route)).
    pub fn fused_norm_route(&self, bytes: usize) -> Route {
        each!(self, c => c.fused_norm_route(bytes))
    }
    /// The first failure any call recorded ([`Collective::check`]; errors are asynchronous:
    /// wait for a stream with the variant's [`Collective::synchronize`]).
    pub fn check(&self) -> Result<(), Error> {
        each!(self, c => c.check())
    }
    /// Collective close ([`Collective::close`]).
    pub fn close(&self) -> Result<(), Error> {
        each!(self, c => c.close())
    }
    /// A collective call this rank refused itself, counted ([`Collective::count_refused_call`]).
    pub fn count_refused_call(&self) -> Result<(), Error> {
        each!(self, c => c.count_refused_call())
    }
    /// Fails this handle for good because another collective of the caller's failed: later
    /// calls are `Poisoned` with `cause`, and peers waiting for this rank fail at once
    /// ([`Collective::abandon`]).
    pub fn abandon(&self, cause: &str) {
        each!(self, c => c.abandon(cause))
    }

    /// The CPU twin, if that is the platform.
    #[cfg(feature = "cpu")]
    pub fn as_cpu(&self) -> Option<&CpuCollective> {
        match self {
            AnyCollective::Cpu(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    /// The CPU twin, if that is the platform; else `self` back.
    #[cfg(feature = "cpu")]
    #[allow(clippy::result_large_err)] // `self` back, as `Box::downcast` does
    pub fn into_cpu(self) -> Result<CpuCollective, Self> {
        match self {
            AnyCollective::Cpu(c) => Ok(c),
            #[allow(unreachable_patterns)]
            other => Err(other),
        }
    }
    /// The NVIDIA collective, if that is the platform.
    #[cfg(feature = "cuda")]
    pub fn as_nvidia(&self) -> Option<&NvidiaCollective> {
        match self {
            AnyCollective::Nvidia(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    /// The NVIDIA collective, if that is the platform; else `self` back.
    #[cfg(feature = "cuda")]
    #[allow(clippy::result_large_err)] // `self` back, as `Box::downcast` does
    pub fn into_nvidia(self) -> Result<NvidiaCollective, Self> {
        match self {
            AnyCollective::Nvidia(c) => Ok(c),
            #[allow(unreachable_patterns)]
            other => Err(other),
        }
    }
    /// The ROCm collective, if that is the platform.
    #[cfg(feature = "rocm")]
    pub fn as_rocm(&self) -> Option<&RocmCollective> {
        match self {
            AnyCollective::Rocm(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    /// The ROCm collective, if that is the platform; else `self` back.
    #[cfg(feature = "rocm")]
    #[allow(clippy::result_large_err)] // `self` back, as `Box::downcast` does
    pub fn into_rocm(self) -> Result<RocmCollective, Self> {
        match self {
            AnyCollective::Rocm(c) => Ok(c),
            #[allow(unreachable_patterns)]
            other => Err(other),
        }
    }
}

/// The platform [`from_bootstrap`] and [`thread_group`] build here, decided by this process
/// alone: `DETCOLL_PLATFORM` (`cpu`, `nvidia` or `rocm`) when set, else NVIDIA when feature
/// `cuda` is built and a CUDA GPU is present, else ROCm when feature `rocm` is built and an AMD
/// GPU is present, else the CPU twin when feature `cpu` is built.
///
/// Errors ([`Error::InvalidConfig`]): `DETCOLL_PLATFORM` set to anything else (fail closed,
/// never a silent fallback), naming a platform whose feature this build lacks, or no platform
/// (no GPU found and no feature `cpu`).
pub fn platform() -> Result<Platform, Error> {
    let forced = Platform::from_env()?;
    let p = match forced {
        Some(p) => p,
        None => Platform::detect()?,
    };
    if built(p) {
        return Ok(p);
    }
    let detail = match forced {
        Some(p) => format!(
            "{}={} but this build of collective-factory lacks feature `{}`",
            crate::platform::PLATFORM_ENV,
            p.name(),
            feature(p)
        ),
        None => "no platform: no GPU this build drives is present, and feature `cpu` is not built".to_string(),
    };
    Err(Error::InvalidConfig { detail })
}

/// Whether this build has `p`'s backend.
fn built(p: Platform) -> bool {
    match p {
        Platform::Cpu => cfg!(feature = "cpu"),
        Platform::Nvidia => cfg!(feature = "cuda"),
        Platform::Rocm => cfg!(feature = "rocm"),
    }
}

/// The Cargo feature of `p`'s backend.
fn feature(p: Platform) -> &'static str {
    match p {
        Platform::Cpu => "cpu",
        Platform::Nvidia => "cuda",
        Platform::Rocm => "rocm",
    }
}

/// This rank of the collective of every rank of `boot`, on the platform [`platform`] picks (one
/// process per rank: torchrun, `detcoll-run`, your launcher). Collective: every rank calls it.
///
/// Every rank decides the platform locally, from its own environment and devices — the same
/// decision where the ranks share one environment and one kind of host. The constructor it
/// then calls agrees with every other rank first: ranks that decided differently (say one sees
/// no GPU) all fail with one [`Error::ConfigMismatch`] naming the platforms, and a rank whose
/// decision failed (a bad `DETCOLL_PLATFORM`, a platform not built) still takes part in that
/// agreement, so every rank fails at once with its reason ([`Error::InvalidConfig`]) instead of
/// waiting for it.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use collective_factory::bootstrap::TcpBootstrap;
/// use collective_factory::{Config, auto};
/// use std::sync::Arc;
/// // In each process started by torchrun or `detcoll-run --nproc 4 -- ...`:
/// let comm = auto::from_bootstrap(Arc::new(TcpBootstrap::from_env()?), &Config::new())?;
/// println!("rank {} of {} on {}", comm.rank(), comm.world_size(), comm.platform().name());
/// # Ok(()) }
/// ```
pub fn from_bootstrap(boot: Arc<dyn Bootstrap>, config: &Config) -> Result<AnyCollective, Error> {
    match platform() {
        #[cfg(feature = "cpu")]
        Ok(Platform::Cpu) => crate::cpu::from_bootstrap(boot, config).map(AnyCollective::Cpu),
        #[cfg(feature = "cuda")]
        Ok(Platform::Nvidia) => crate::nvidia::from_bootstrap(boot, config).map(AnyCollective::Nvidia),
        #[cfg(feature = "rocm")]
        Ok(Platform::Rocm) => crate::rocm::from_bootstrap(boot, config).map(AnyCollective::Rocm),
        #[allow(unreachable_patterns)]
        Ok(p) => unreachable!("platform() returned {} without its feature", p.name()),
        Err(e) => Err(fail_collectively(&*boot, config, e)),
    }
}

/// Reports `e` (this rank's failure to pick a platform) through the agreement every
/// constructor starts with, so that every rank returns it instead of waiting for this one.
fn fail_collectively(boot: &dyn Bootstrap, config: &Config, e: Error) -> Error {
    let facts = Facts {
        platform: Platform::from_env().ok().flatten().unwrap_or(Platform::Cpu).name().to_string(),
        host: collective_core::host_identity().unwrap_or_default(),
        ipc: false,
        transport: false,
        versions: Vec::new(),
        capacity: config.capacity(),
        routing: String::new(),
        device: String::new(),
        errors: vec![e.to_string()],
        missing: Vec::new(),
        nodes: false,
        transport_config: Vec::new(),
        staged: false,
    };
    match facts.agree(boot) {
        Err(agreed) => agreed,
        // Unreachable (a rank with errors fails the decision); keep the local error.
        Ok(_) => e,
    }
}

/// `world` ranks as threads of this process, on the platform [`platform`] picks (decided once,
/// for all of them): that platform's `thread_group`. Hand one handle to each thread; see the
/// [module example](self).
pub fn thread_group(world: usize, config: &Config) -> Result<Vec<AnyCollective>, Error> {
    match platform()? {
        #[cfg(feature = "cpu")]
        Platform::Cpu => Ok(crate::cpu::thread_group(world, config)?.into_iter().map(AnyCollective::Cpu).collect()),
        #[cfg(feature = "cuda")]
        Platform::Nvidia => {
            Ok(crate::nvidia::thread_group(world, config)?.into_iter().map(AnyCollective::Nvidia).collect())
        }
        #[cfg(feature = "rocm")]
        Platform::Rocm => Ok(crate::rocm::thread_group(world, config)?.into_iter().map(AnyCollective::Rocm).collect()),
        #[allow(unreachable_patterns)]
        p => unreachable!("platform() returned {} without its feature", p.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_matches_features() {
        assert_eq!(built(Platform::Cpu), cfg!(feature = "cpu"));
        assert_eq!(built(Platform::Nvidia), cfg!(feature = "cuda"));
        assert_eq!(built(Platform::Rocm), cfg!(feature = "rocm"));
        for p in [Platform::Cpu, Platform::Nvidia, Platform::Rocm] {
            assert_eq!(Platform::parse(feature(p).replace("cuda", "nvidia").as_str()), Some(p));
        }
    }
}
