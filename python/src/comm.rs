//! `Communicator`: one rank's collective as a Python object, and the constructors the wrapper
//! calls (`thread_group`, `from_env`, `from_group`). Every call into the factory releases the
//! GIL: peers that are threads of this process, and the Python callback of a group bootstrap,
//! need it while this rank waits.
use crate::backend::{Backend, Buf, NormBufs, parse_dtype, parse_op};
use crate::callback::PyBootstrap;
use crate::errors::to_py;
use collective_factory::bootstrap::{Bootstrap, TcpBootstrap};
use collective_factory::{Config, DeviceSelect, Error, cpu, nvidia};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One rank of a deterministic collective (built by `detcoll.create_deterministic_collective`
/// or `detcoll.thread_group`; the wrapper `detcoll.Collective` takes tensors).
#[pyclass(module = "detcoll._detcoll", frozen)]
#[derive(Debug)]
pub struct Communicator {
    /// `None` only while dropping.
    inner: Option<Backend>,
    /// Set by `close`: the queries that answer without the backend (`route`, `capabilities`)
    /// then raise `Closed` as every call does.
    closed: AtomicBool,
    /// The process that built it: in a forked child those queries raise `ForkedHandle`, as
    /// every call does there.
    owner: u32,
}

/// Which backend a constructor builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Platform {
    Cpu,
    Nvidia,
}

fn platform(name: &str) -> Result<Platform, Error> {
    match name {
        "cpu" => Ok(Platform::Cpu),
        "nvidia" | "cuda" => Ok(Platform::Nvidia),
        other => Err(Error::InvalidConfig { detail: format!("platform {other:?}: expected \"cpu\" or \"cuda\"") }),
    }
}

fn config(capacity: Option<usize>, device: Option<usize>) -> Config {
    let mut c = Config::new();
    if let Some(bytes) = capacity {
        c = c.with_capacity(bytes);
    }
    if let Some(d) = device {
        c = c.with_device(DeviceSelect::Ordinal(d));
    }
    c
}

fn build(boot: Arc<dyn Bootstrap>, p: Platform, config: &Config) -> Result<Communicator, Error> {
    let inner = match p {
        Platform::Cpu => Backend::Cpu(cpu::from_bootstrap(boot, config)?),
        Platform::Nvidia => Backend::Nvidia(nvidia::from_bootstrap(boot, config)?),
    };
    Ok(Communicator::new(inner))
}

fn buf(addr: u64, count: usize, dtype: &str) -> Result<Buf, Error> {
    Ok(Buf { addr, count, dtype: parse_dtype(dtype)? })
}

impl Communicator {
    fn new(inner: Backend) -> Self {
        Communicator { inner: Some(inner), closed: AtomicBool::new(false), owner: std::process::id() }
    }

    fn backend(&self) -> PyResult<&Backend> {
        self.inner.as_ref().ok_or_else(|| to_py(Error::Closed))
    }

    /// The backend for a query that does not call it: `ForkedHandle` in a forked child,
    /// `Closed` after `close`, as the calls report.
    fn live(&self) -> PyResult<&Backend> {
        let pid = std::process::id();
        if pid != self.owner {
            return Err(to_py(Error::ForkedHandle { owner: self.owner, pid }));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(to_py(Error::Closed));
        }
        self.backend()
    }
}

#[pymethods]
impl Communicator {
    /// This rank, in `0..world_size`.
    #[getter]
    fn rank(&self) -> PyResult<usize> {
        Ok(self.backend()?.rank())
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> PyResult<usize> {
        Ok(self.backend()?.world_size())
    }

    /// `"cpu"` (the CPU twin: host memory) or `"cuda"` (device memory, CUDA streams).
    #[getter]
    fn platform(&self) -> PyResult<&'static str> {
        Ok(match self.backend()? {
            Backend::Cpu(_) => "cpu",
            Backend::Nvidia(_) => "cuda",
        })
    }

    /// The honest capabilities (`supports_async_overlap` and
    /// `supports_compute_communication_fusion` are false: no such mode exists yet).
    fn capabilities<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.live()?.capabilities();
        let d = PyDict::new(py);
        d.set_item("strict_fixed_order", c.strict_fixed_order)?;
        d.set_item("supports_async_overlap", c.supports_async_overlap)?;
        d.set_item("supports_compute_communication_fusion", c.supports_compute_communication_fusion)?;
        d.set_item("supports_graph_capture", c.supports_graph_capture)?;
        d.set_item("capacity_bytes", c.capacity_bytes)?;
        d.set_item("max_call_bytes", c.max_call_bytes)?;
        Ok(d)
    }

    /// The route a call of `op` moving `nbytes` per rank takes (the same on every rank);
    /// `all_reduce_residual_rmsnorm`: the fused call's all_reduce.
    fn route(&self, op: &str, nbytes: usize) -> PyResult<&'static str> {
        if op == collective_factory::FUSED_NORM_OP {
            return Ok(self.live()?.fused_norm_route(nbytes).name());
        }
        let op = parse_op(op).map_err(to_py)?;
        Ok(self.live()?.route(op, nbytes).name())
    }

    /// The first failure any call recorded (never blocks).
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        let b = self.backend()?;
        py.detach(|| b.check()).map_err(to_py)
    }

    /// Waits for `stream` (a `CUstream`; ignored on the CPU), then `check`.
    #[pyo3(signature = (stream=0))]
    fn synchronize(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        let b = self.backend()?;
        py.detach(|| b.synchronize(stream)).map_err(to_py)
    }

    /// Collective close (every rank calls it); later calls raise `detcoll.Closed`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let b = self.backend()?;
        let closed = py.detach(|| b.close()).map_err(to_py);
        if std::process::id() == self.owner {
            self.closed.store(true, Ordering::Release);
        }
        closed
    }

    /// Stops this rank for good, as `ncclCommAbort` does (no peer needs to call it): later
    /// calls raise `detcoll.Poisoned` with `reason`, and a peer waiting for this rank raises
    /// `detcoll.PeerFailed` at once instead of waiting for its timeout. `close` still frees
    /// the handle afterwards.
    #[pyo3(signature = (reason="aborted by the caller"))]
    fn abort(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        let b = self.backend()?;
        let reason = reason.to_string();
        py.detach(|| b.abandon(&reason));
        Ok(())
    }

    /// Counts a call the wrapper refused before making it (its own checks of the tensors), as
    /// a call the collective refuses counts: peers that made the call then fail with
    /// `SignatureMismatch` instead of pairing their next call with this rank's next one.
    fn count_refused_call(&self, py: Python<'_>) -> PyResult<()> {
        let b = self.backend()?;
        py.detach(|| b.count_refused_call()).map_err(to_py)
    }

    /// The calls this rank began, made or refused: equal on ranks that made and refused the
    /// same calls (their next call's number, less one). A diagnostic for tools and tests.
    #[getter]
    fn calls_begun(&self, py: Python<'_>) -> PyResult<u32> {
        let b = self.backend()?;
        py.detach(|| b.calls_begun()).map_err(to_py)
    }

    /// Raw call: `op` from `count` elements of `dtype` at `in_addr` into `out_count` at
    /// `out_addr` (equal addresses: in place), on `stream`. The wrapper passes addresses of
    /// live, contiguous tensors it keeps referenced for the call.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        op: &str,
        in_addr: u64,
        in_count: usize,
        in_dtype: &str,
        out_addr: u64,
        out_count: usize,
        out_dtype: &str,
        stream: u64,
    ) -> PyResult<()> {
        let b = self.backend()?;
        let parsed =
            (|| Ok((parse_op(op)?, buf(in_addr, in_count, in_dtype)?, buf(out_addr, out_count, out_dtype)?)))();
        // Without the GIL from here: counting a refusal takes the call lock, which a call of
        // another thread may hold while it waits on a bootstrap that calls back into Python.
        py.detach(|| {
            let (op, input, output) = b.counted(parsed)?;
            // SAFETY: the wrapper (detcoll/_tensor.py) takes the addresses and sizes from live,
            // contiguous tensors of this backend's device that stay referenced for the call
            // (and, on CUDA, are ordered on `stream` by the caller as any CUDA library call).
            unsafe { b.call(op, input, output, stream) }
        })
        .map_err(to_py)
    }

    /// Raw `reduce_scatter_many`: `lanes` of `(in_addr, in_count, in_dtype, out_addr,
    /// out_count, out_dtype)`.
    fn call_many(
        &self,
        py: Python<'_>,
        lanes: Vec<(u64, usize, String, u64, usize, String)>,
        stream: u64,
    ) -> PyResult<()> {
        let b = self.backend()?;
        let lanes = lanes
            .iter()
            .map(|(ia, ic, id, oa, oc, od)| Ok((buf(*ia, *ic, id)?, buf(*oa, *oc, od)?)))
            .collect::<Result<Vec<_>, Error>>();
        py.detach(|| {
            let lanes = b.counted(lanes)?;
            // SAFETY: as `call`, for every lane.
            unsafe { b.call_many(&lanes, stream) }
        })
        .map_err(to_py)
    }

    /// Raw fused all_reduce + residual + RMSNorm: `x`, `out`, `residual`, `weight` as
    /// `(addr, count, dtype)` (`out` at `x`'s address: in place; `residual` updated in place),
    /// rows of `hidden` elements, `eps`, on `stream`.
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_residual_rmsnorm(
        &self,
        py: Python<'_>,
        x: (u64, usize, String),
        out: (u64, usize, String),
        residual: (u64, usize, String),
        weight: (u64, usize, String),
        hidden: usize,
        eps: f64,
        stream: u64,
    ) -> PyResult<()> {
        let b = self.backend()?;
        // `eps` is an f32: a finite Python float beyond its range would round to infinity and
        // be refused as "inf", a value the caller never passed.
        if eps.is_finite() && eps.abs() > f64::from(f32::MAX) {
            let _ = py.detach(|| b.count_refused_call());
            return Err(to_py(Error::InvalidArgument {
                op: collective_factory::Op::AllReduce,
                argument: "eps",
                detail: format!(
                    "is {eps:e}, beyond the f32 range the norm computes in; expected a finite value, 0 or more"
                ),
            }));
        }
        let eps = eps as f32;
        let t = |v: &(u64, usize, String)| buf(v.0, v.1, &v.2);
        let bufs = (|| Ok(NormBufs { x: t(&x)?, y: t(&out)?, residual: t(&residual)?, weight: t(&weight)? }))();
        py.detach(|| {
            let bufs = b.counted(bufs)?;
            // SAFETY: as `call`, for the four tensors (the wrapper keeps them referenced).
            unsafe { b.all_reduce_residual_rmsnorm(bufs, hidden, eps, stream) }
        })
        .map_err(to_py)
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            Some(b) => format!("Communicator(rank={}, world_size={})", b.rank(), b.world_size()),
            None => "Communicator(dropped)".into(),
        }
    }
}

impl Drop for Communicator {
    /// Drop closes collectively (bounded): without the GIL, so peers that are threads of this
    /// process can close too. At interpreter shutdown (no attaching) it drops as it stands.
    fn drop(&mut self) {
        let mut inner = self.inner.take();
        let _ = Python::try_attach(|py| {
            let b = inner.take();
            py.detach(move || drop(b))
        });
        drop(inner);
    }
}

/// `world` ranks as threads of this process (`platform` `"cpu"`: host memory; `"cuda"`: rank
/// `r` on GPU `r % count`). Hand each communicator to its own thread.
#[pyfunction]
#[pyo3(signature = (world, capacity=None, platform="cpu"))]
fn thread_group(py: Python<'_>, world: usize, capacity: Option<usize>, platform: &str) -> PyResult<Vec<Communicator>> {
    let p = self::platform(platform).map_err(to_py)?;
    let config = config(capacity, None);
    let built: Result<Vec<Backend>, Error> = py.detach(|| match p {
        Platform::Cpu => Ok(cpu::thread_group(world, &config)?.into_iter().map(Backend::Cpu).collect()),
        Platform::Nvidia => Ok(nvidia::thread_group(world, &config)?.into_iter().map(Backend::Nvidia).collect()),
    });
    Ok(built.map_err(to_py)?.into_iter().map(Communicator::new).collect())
}

/// This rank, from torchrun's environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, the job token): the TCP rendezvous of the
/// Rust crates. Collective: every rank calls it.
#[pyfunction]
#[pyo3(signature = (capacity=None, platform="cpu", device=None))]
fn from_env(py: Python<'_>, capacity: Option<usize>, platform: &str, device: Option<usize>) -> PyResult<Communicator> {
    let p = self::platform(platform).map_err(to_py)?;
    let config = config(capacity, device);
    py.detach(|| {
        let boot: Arc<dyn Bootstrap> = Arc::new(TcpBootstrap::from_env()?);
        build(boot, p, &config)
    })
    .map_err(to_py)
}

/// This rank of a group whose exchange is `gather(bytes) -> list[bytes]` (every member's
/// bytes in group-rank order; e.g. `torch.distributed.all_gather_object` on the group).
/// Collective: every member calls it.
#[pyfunction]
#[pyo3(signature = (rank, world, local_rank, local_world, gather, capacity=None, platform="cpu", device=None))]
#[allow(clippy::too_many_arguments)]
fn from_group(
    py: Python<'_>,
    rank: usize,
    world: usize,
    local_rank: usize,
    local_world: usize,
    gather: Py<PyAny>,
    capacity: Option<usize>,
    platform: &str,
    device: Option<usize>,
) -> PyResult<Communicator> {
    let p = self::platform(platform).map_err(to_py)?;
    if world == 0 || rank >= world || local_world == 0 || local_world > world || local_rank >= local_world {
        return Err(to_py(Error::InvalidConfig {
            detail: format!("group layout rank {rank} of {world}, local rank {local_rank} of {local_world}"),
        }));
    }
    let config = config(capacity, device);
    let boot: Arc<dyn Bootstrap> = Arc::new(PyBootstrap { rank, world, local_rank, local_world, gather });
    py.detach(|| build(boot, p, &config)).map_err(to_py)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Communicator>()?;
    m.add_function(wrap_pyfunction!(thread_group, m)?)?;
    m.add_function(wrap_pyfunction!(from_env, m)?)?;
    m.add_function(wrap_pyfunction!(from_group, m)?)?;
    Ok(())
}
