//! The one CUDA call of this crate: waiting for a caller's raw stream (`synchronize(stream)`
//! on a `CUstream` handed in by torch/CuPy, which the factory's typed API cannot wrap).
use collective_factory::cudarc::driver::{result, sys};
use collective_factory::{Error, NvidiaCollective};

/// Blocks until `stream` (a `CUstream` of `comm`'s context; 0 the legacy default stream) has
/// executed everything enqueued on it.
pub fn synchronize(comm: &NvidiaCollective, stream: u64) -> Result<(), Error> {
    let vendor =
        |call: &str, e: result::DriverError| Error::Vendor { backend: "cuda", call: call.into(), source: Box::new(e) };
    comm.context().bind_to_thread().map_err(|e| vendor("cuCtxSetCurrent", e))?;
    // SAFETY: `stream` is a live stream of this context (the Python wrapper passes torch's or
    // the array interface's current stream of the collective's device), and the context is
    // current on this thread.
    unsafe { result::stream::synchronize(stream as usize as sys::CUstream) }
        .map_err(|e| vendor("cuStreamSynchronize", e))
}
