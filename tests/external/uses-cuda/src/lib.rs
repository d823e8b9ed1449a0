//! What a downstream crate calls to get the NVIDIA collective (compiled against the linking
//! mode the application picked: detcoll's dynamic loading, or candle's dynamic linking).
#![forbid(unsafe_code)]

use collective_factory::bootstrap::{Bootstrap, LocalBootstrap};
use collective_factory::{Collective, Config, Error, NvidiaCollective};
use std::sync::Arc;

/// One rank on its own (world 1), with 1 MiB of staging.
pub fn single_rank() -> Result<NvidiaCollective, Error> {
    let boot: Arc<dyn Bootstrap> = Arc::new(LocalBootstrap::group(1).remove(0));
    collective_factory::nvidia::from_bootstrap(boot, &Config::new().with_capacity(1 << 20))
}

/// An all_reduce of cudarc buffers through the typed entry point, as an engine writes it: the
/// dtype comes from the buffers, cudarc orders the stream, no `unsafe` anywhere. Returns the
/// first element of the result.
pub fn all_reduce_cudarc(comm: &NvidiaCollective, values: &[f32]) -> Result<f32, Box<dyn std::error::Error>> {
    let stream = comm.context().new_stream()?;
    let x = stream.clone_htod(values)?;
    let mut y = stream.alloc_zeros::<f32>(values.len())?;
    comm.all_reduce_into(&x, &mut y, &stream)?;
    comm.all_reduce_in_place(&mut y, &stream)?;
    comm.synchronize(&stream)?; // errors are asynchronous: read only after this
    Ok(stream.clone_dtoh(&y)?[0])
}

/// A decoder layer's exit on cudarc buffers, as an engine writes it: the fused all_reduce +
/// residual + RMSNorm through the typed entry point (the residual updated to `h` in place).
/// Returns `(h, y)`.
pub fn fused_norm_cudarc(
    comm: &NvidiaCollective,
    x: &[f32],
    residual: &[f32],
    weight: &[f32],
    eps: f32,
) -> Result<(Vec<f32>, Vec<f32>), Box<dyn std::error::Error>> {
    let stream = comm.context().new_stream()?;
    let x = stream.clone_htod(x)?;
    let mut h = stream.clone_htod(residual)?;
    let w = stream.clone_htod(weight)?;
    let mut y = stream.alloc_zeros::<f32>(residual.len())?;
    comm.all_reduce_residual_rmsnorm_into(&x, &mut y, &mut h, &w, weight.len(), eps, &stream)?;
    comm.synchronize(&stream)?;
    Ok((stream.clone_dtoh(&h)?, stream.clone_dtoh(&y)?))
}

#[cfg(feature = "candle")]
/// cudarc's own API is usable next to detcoll in the same build (candle's features).
pub fn cudarc_version() -> u32 {
    cudarc::driver::sys::CUDA_VERSION
}
