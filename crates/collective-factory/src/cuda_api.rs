//! Typed entry points of the NVIDIA collective for cudarc buffers, and raw ones for engines on
//! another cudarc version (or none).
//!
//! Typed: the dtype comes from `T` (a mismatch cannot be written), no `unsafe`, and cudarc's
//! ordering is kept — each buffer's `device_ptr`/`device_ptr_mut` on the call's stream makes the
//! stream wait for the buffer's earlier writes, and the guards it returns record the buffer's
//! read/write events right after the collective is enqueued, so later cudarc work on these
//! buffers is ordered after it. Any `CudaSlice`, `CudaView` or `CudaViewMut` works (bf16/f16
//! buffers need cudarc's `f16` feature in your crate, as candle enables it).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use collective_factory::Collective;
//! use collective_factory::{Config, nvidia};
//! let ranks = nvidia::thread_group(2, &Config::new())?;
//! std::thread::scope(|s| {
//!     for comm in &ranks {
//!         s.spawn(move || {
//!             let stream = comm.context().new_stream().unwrap();
//!             let x = stream.clone_htod(&vec![1.5f32; 4096]).unwrap();
//!             let mut y = stream.alloc_zeros::<f32>(4096).unwrap();
//!             comm.all_reduce_into(&x, &mut y, &stream).unwrap(); // dtype from the buffers
//!             // Enqueued, not done: wait for the stream and learn whether the call succeeded,
//!             // then read.
//!             comm.synchronize(&stream).unwrap();
//!             let host = stream.clone_dtoh(&y).unwrap();
//!             assert_eq!(host[0].to_bits(), 3.0f32.to_bits());
//!         });
//!     }
//! });
//! # Ok(()) }
//! ```
//!
//! Raw entry points (`u64` device pointers and a raw `CUstream`): [`crate::raw_api`].
use crate::NvidiaCollective;
use collective_core::{Collective, Error, Io, MAX_LANES, Op, Plain, RawMut, RawRef, Reducible, RmsNorm};
use cuda_ipc::cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use std::sync::Arc;

impl NvidiaCollective {
    /// The CUDA context this rank runs in (the caller's, with [`crate::nvidia::from_context`]).
    pub fn context(&self) -> &Arc<CudaContext> {
        match (self.ipc(), self.transport(), self.nodes()) {
            (Some(i), _, _) => i.device().context(),
            (None, Some(t), _) => t.device().context(),
            (None, None, Some(n)) => n.local().device().context(),
            (None, None, None) => unreachable!("a composed collective has at least one backend"),
        }
    }

    fn typed<T: Plain>(
        &self,
        op: Op,
        input: Option<&dyn DevicePtr<T>>,
        output: &mut dyn DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        let out_len = output.len();
        // Guards first (they order the stream after earlier writes), dropped after the enqueue
        // (they record this call's read/write events).
        let in_guard = input.map(|i| (i.len(), i.device_ptr(stream)));
        let (out_ptr, out_guard) = output.device_ptr_mut(stream);
        // SAFETY: the views cover exactly the cudarc buffers, borrowed for this call (shared for
        // the input, exclusive for the output), which cudarc keeps alive and orders through the
        // guards.
        let io = unsafe {
            let output = RawMut::from_raw(out_ptr, out_len, T::DTYPE);
            match &in_guard {
                Some((len, (ptr, _))) => Io::OutOfPlace { input: RawRef::from_raw(*ptr, *len, T::DTYPE), output },
                None => Io::InPlace(output),
            }
        };
        let r = match op {
            Op::AllReduce => self.all_reduce(io, stream),
            Op::AllGather => self.all_gather(io, stream),
            _ => self.reduce_scatter(io, stream),
        };
        drop(out_guard);
        drop(in_guard);
        r
    }

    /// all_reduce of `input` into `output` (same length), in `T`'s own arithmetic.
    pub fn all_reduce_into<T: Reducible>(
        &self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.typed(Op::AllReduce, Some(input), output, stream)
    }
    /// all_reduce in place.
    pub fn all_reduce_in_place<T: Reducible>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.typed(Op::AllReduce, None, buf, stream)
    }
    /// all_gather of `input` into `output` (`world * input.len()`, rank-major).
    pub fn all_gather_into<T: Plain>(
        &self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.typed(Op::AllGather, Some(input), output, stream)
    }
    /// all_gather in place (this rank's shard already at `rank * len / world`).
    pub fn all_gather_in_place<T: Plain>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.typed(Op::AllGather, None, buf, stream)
    }
    /// reduce_scatter of `input` into `output` (`input.len() / world`: this rank's shard).
    pub fn reduce_scatter_into<T: Reducible>(
        &self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.typed(Op::ReduceScatter, Some(input), output, stream)
    }
    /// reduce_scatter in place (the result lands in shard `rank`).
    pub fn reduce_scatter_in_place<T: Reducible>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.typed(Op::ReduceScatter, None, buf, stream)
    }

    /// The fused all_reduce + residual + RMSNorm on cudarc buffers of `[rows, hidden]`
    /// elements: `y = tree(x)`, then the residual updated in place to `h = residual + y`, then
    /// `y = rmsnorm(h) * weight` (`weight`: `hidden` elements), in `T`'s own arithmetic and
    /// the fixed evaluation of `fixed_tree::rmsnorm` — bit-identical across batch sizes,
    /// routes and runs. A refused call writes nothing.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use collective_factory::Collective;
    /// use collective_factory::{Config, half::bf16, nvidia};
    /// let comm = nvidia::thread_group(1, &Config::new())?.remove(0);
    /// let stream = comm.context().new_stream()?;
    /// let (rows, hidden) = (4, 4096);
    /// let x = stream.clone_htod(&vec![bf16::from_f32(0.5); rows * hidden])?;
    /// let mut residual = stream.clone_htod(&vec![bf16::from_f32(1.0); rows * hidden])?;
    /// let weight = stream.clone_htod(&vec![bf16::ONE; hidden])?;
    /// let mut y = stream.alloc_zeros::<bf16>(rows * hidden)?;
    /// comm.all_reduce_residual_rmsnorm_into(&x, &mut y, &mut residual, &weight, hidden, 1e-6, &stream)?;
    /// comm.synchronize(&stream)?;
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)] // the tensors and the shape of the call, one for one
    pub fn all_reduce_residual_rmsnorm_into<T: Reducible>(
        &self,
        x: &impl DevicePtr<T>,
        y: &mut impl DevicePtrMut<T>,
        residual: &mut impl DevicePtrMut<T>,
        weight: &impl DevicePtr<T>,
        hidden: usize,
        eps: f32,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.fused_typed(Some(x), y, residual, weight, hidden, eps, stream)
    }

    /// The fused all_reduce + residual + RMSNorm in place, as vLLM's `fused_add_rms_norm`
    /// updates its tensors: `x` becomes `y = rmsnorm(h) * weight` and the residual becomes
    /// `h = residual + tree(x)` (see [`Self::all_reduce_residual_rmsnorm_into`]; the same bits).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use collective_factory::Collective;
    /// use collective_factory::{Config, half::bf16, nvidia};
    /// let comm = nvidia::thread_group(1, &Config::new())?.remove(0);
    /// let stream = comm.context().new_stream()?;
    /// let (rows, hidden) = (4, 4096);
    /// let mut x = stream.clone_htod(&vec![bf16::from_f32(0.5); rows * hidden])?;
    /// let mut residual = stream.clone_htod(&vec![bf16::from_f32(1.0); rows * hidden])?;
    /// let weight = stream.clone_htod(&vec![bf16::ONE; hidden])?;
    /// comm.all_reduce_residual_rmsnorm_in_place(&mut x, &mut residual, &weight, hidden, 1e-6, &stream)?;
    /// comm.synchronize(&stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_residual_rmsnorm_in_place<T: Reducible>(
        &self,
        x: &mut impl DevicePtrMut<T>,
        residual: &mut impl DevicePtrMut<T>,
        weight: &impl DevicePtr<T>,
        hidden: usize,
        eps: f32,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        self.fused_typed(None, x, residual, weight, hidden, eps, stream)
    }

    /// The typed fused call: `x` into `y`, or `y` in place when `x` is `None`; the residual
    /// updated in place.
    #[allow(clippy::too_many_arguments)] // the tensors and the shape of the call, one for one
    fn fused_typed<T: Reducible>(
        &self,
        x: Option<&dyn DevicePtr<T>>,
        y: &mut dyn DevicePtrMut<T>,
        residual: &mut dyn DevicePtrMut<T>,
        weight: &dyn DevicePtr<T>,
        hidden: usize,
        eps: f32,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        // Guards first (they order the stream after earlier writes), dropped after the enqueue
        // (they record this call's read/write events), as in `typed`.
        let (y_len, r_len, w_len) = (y.len(), residual.len(), weight.len());
        let x_guard = x.map(|x| (x.len(), x.device_ptr(stream)));
        let (w_ptr, w_guard) = weight.device_ptr(stream);
        let (y_ptr, y_guard) = y.device_ptr_mut(stream);
        let (r_ptr, r_guard) = residual.device_ptr_mut(stream);
        // SAFETY: the views cover exactly the cudarc buffers, borrowed for this call (shared
        // for `x` and the weight, exclusive for `y` and the residual), which cudarc keeps alive
        // and orders through the guards.
        let (io, norm) = unsafe {
            let y = RawMut::from_raw(y_ptr, y_len, T::DTYPE);
            let io = match &x_guard {
                Some((len, (ptr, _))) => Io::OutOfPlace { input: RawRef::from_raw(*ptr, *len, T::DTYPE), output: y },
                None => Io::InPlace(y),
            };
            let norm = RmsNorm {
                residual: Io::InPlace(RawMut::from_raw(r_ptr, r_len, T::DTYPE)),
                weight: RawRef::from_raw(w_ptr, w_len, T::DTYPE),
                hidden,
                eps,
            };
            (io, norm)
        };
        let r = self.all_reduce_residual_rmsnorm(io, norm, stream);
        drop((x_guard, w_guard, y_guard, r_guard));
        r
    }

    /// reduce_scatter_many: lane `i` reduce_scatters its input `lanes[i].0` into its output
    /// `lanes[i].1` (`lanes[i].0.len() / world` elements: this rank's shard), one tree per
    /// lane, in `T`'s own arithmetic, under one synchronisation; at most
    /// [`MAX_LANES`] lanes. Lanes may be of any cudarc buffer kind and length; every guard is
    /// taken before the call and dropped after it, so cudarc's ordering holds for every lane.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use collective_factory::Collective;
    /// use collective_factory::{Config, nvidia};
    /// let comm = nvidia::thread_group(1, &Config::new())?.remove(0);
    /// let stream = comm.context().new_stream()?;
    /// let (q, k) = (stream.clone_htod(&vec![1.0f32; 4096])?, stream.clone_htod(&vec![2.0f32; 1024])?);
    /// let (mut q_shard, mut k_shard) = (stream.alloc_zeros::<f32>(4096)?, stream.alloc_zeros::<f32>(1024)?);
    /// comm.reduce_scatter_many_into(&mut [(&q, &mut q_shard), (&k, &mut k_shard)], &stream)?;
    /// comm.synchronize(&stream)?;
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter_many_into<T: Reducible>(
        &self,
        lanes: &mut [(&dyn DevicePtr<T>, &mut dyn DevicePtrMut<T>)],
        stream: &CudaStream,
    ) -> Result<(), Error> {
        if lanes.len() > MAX_LANES {
            return Err(Error::TooManyLanes { lanes: lanes.len(), max: MAX_LANES });
        }
        // Guards first (they order the stream after earlier writes to every lane), dropped
        // after the enqueue (they record this call's read/write events), as in `typed`.
        let mut guards = Vec::with_capacity(lanes.len());
        let mut ios = Vec::with_capacity(lanes.len());
        for (input, output) in lanes.iter_mut() {
            let (in_len, out_len) = (input.len(), output.len());
            let (in_ptr, in_guard) = input.device_ptr(stream);
            let (out_ptr, out_guard) = output.device_ptr_mut(stream);
            // SAFETY: the views cover exactly the lane's cudarc buffers, borrowed for this call
            // (shared for the input, exclusive for the output), which cudarc keeps alive and
            // orders through the guards.
            ios.push(unsafe {
                Io::OutOfPlace {
                    input: RawRef::from_raw(in_ptr, in_len, T::DTYPE),
                    output: RawMut::from_raw(out_ptr, out_len, T::DTYPE),
                }
            });
            guards.push((in_guard, out_guard));
        }
        let r = self.reduce_scatter_many(&ios, stream);
        drop(ios);
        drop(guards);
        r
    }
}
