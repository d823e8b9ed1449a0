//! The raw entry point of the GPU collectives (NVIDIA and AMD): `u64` device pointers, an
//! element count, a [`DType`] and a raw stream (`CUstream` / `hipStream_t`) as a plain pointer —
//! for engines on another cudarc version, their own HIP binding, or C. The caller vouches for
//! the memory and orders the buffers itself (unsafe); the call is validated and routed exactly
//! as the safe ones (the same dispatch, [`crate::Routed`]).
use crate::Routed;
use crate::gpu_transport::GpuTransport;
use crate::scratch::CallStream;
use crate::via::Via;
use collective_core::{Collective, DType, Error, Io, IpcRoute, MAX_LANES, Op, RawMut, RawRef, Route, Signature};
use ipc_engine::{IpcCollective, IpcDevice, RawStream};
use std::ffi::c_void;

impl<D: IpcDevice> Routed<IpcCollective<D>, GpuTransport<D>> {
    /// `op` (all_reduce, all_gather or reduce_scatter) on raw device memory, enqueued on a raw
    /// stream (`CUstream` / `hipStream_t`; null: the default stream): `input` holds `count`
    /// elements of `dtype` (what this rank contributes), `output` what `op` writes (all_gather:
    /// `world * count`; reduce_scatter: `count / world`); `input == output` is the in-place
    /// form.
    ///
    /// # Safety
    /// Both ranges must be device memory of this rank's device, valid and otherwise untouched
    /// until `stream` has executed the call; `stream` must be a live stream of this device.
    pub unsafe fn enqueue_raw(
        &self,
        op: Op,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        stream: *mut c_void,
    ) -> Result<(), Error> {
        let world = self.world_size();
        let out_len = match op {
            Op::AllReduce => count,
            Op::AllGather => {
                count.checked_mul(world).ok_or(Error::SizeOverflow { op, argument: "input", len: count })?
            }
            Op::ReduceScatter => count / world,
            Op::ReduceScatterMany => {
                return Err(Error::InvalidConfig {
                    detail: "reduce_scatter_many takes lanes: use enqueue_many_raw".into(),
                });
            }
        };
        // SAFETY: the caller's contract; validation (in the backend) checks lengths, alignment
        // and overlap before any work.
        let io = unsafe {
            if input == output {
                let len = if op == Op::AllGather { out_len } else { count };
                Io::InPlace(RawMut::from_raw(output, len, dtype))
            } else {
                Io::OutOfPlace {
                    input: RawRef::from_raw(input, count, dtype),
                    output: RawMut::from_raw(output, out_len, dtype),
                }
            }
        };
        self.dispatch(op, io, &Raw(RawStream(stream)))
    }

    /// The fused all_reduce + residual + RMSNorm on raw device memory, enqueued on a raw
    /// stream (as [`Routed::enqueue_raw`]): `x` holds `count = rows * hidden` elements of
    /// `dtype`, `y` receives the norm (`y == x`: in place), `residual` is read and `h` written
    /// (`h == residual`: the residual updated in place), `weight` holds `hidden` elements.
    /// See [`Routed::all_reduce_residual_rmsnorm`].
    ///
    /// # Safety
    /// Every range must be device memory of this rank's device, valid and otherwise untouched
    /// until `stream` has executed the call; `stream` must be a live stream of this device.
    #[allow(clippy::too_many_arguments)] // the tensors and the shape of the call, one for one
    pub unsafe fn all_reduce_residual_rmsnorm_raw(
        &self,
        x: u64,
        y: u64,
        residual: u64,
        h: u64,
        weight: u64,
        count: usize,
        hidden: usize,
        eps: f32,
        dtype: DType,
        stream: *mut c_void,
    ) -> Result<(), Error>
    where
        D: detcoll_protocol::NormDevice,
    {
        // SAFETY: the caller's contract; validation checks lengths, alignment and overlap
        // before any work.
        let (x, residual, weight) = unsafe {
            let x = if x == y {
                Io::InPlace(RawMut::from_raw(y, count, dtype))
            } else {
                Io::OutOfPlace { input: RawRef::from_raw(x, count, dtype), output: RawMut::from_raw(y, count, dtype) }
            };
            let residual = if residual == h {
                Io::InPlace(RawMut::from_raw(h, count, dtype))
            } else {
                Io::OutOfPlace {
                    input: RawRef::from_raw(residual, count, dtype),
                    output: RawMut::from_raw(h, count, dtype),
                }
            };
            (x, residual, RawRef::from_raw(weight, hidden, dtype))
        };
        let norm = collective_core::RmsNorm { residual, weight, hidden, eps };
        self.fused_norm(x, norm, &Raw(RawStream(stream)))
    }

    /// `reduce_scatter_many` on raw device memory, enqueued on a raw stream (as
    /// [`Routed::enqueue_raw`]): lane `i` is `lanes[i] = (input, output, count)`, `count`
    /// elements of `dtype` in and `count / world` out (this rank's shard); `input == output` is
    /// that lane's in-place form (the shard lands at `rank`). One tree per lane, under one
    /// synchronisation; at most [`MAX_LANES`] lanes; routed by the lanes' total input bytes,
    /// as the safe call.
    ///
    /// # Safety
    /// As [`Routed::enqueue_raw`], for every lane.
    pub unsafe fn enqueue_many_raw(
        &self,
        lanes: &[(u64, u64, usize)],
        dtype: DType,
        stream: *mut c_void,
    ) -> Result<(), Error> {
        // Counted first, refused or made (`Routed::begin_call`).
        let (_call, seq) = self.begin_call()?;
        let split = Signature::call_split(seq, 0);
        if lanes.len() > MAX_LANES {
            return Err(Error::TooManyLanes { lanes: lanes.len(), max: MAX_LANES });
        }
        let world = self.world_size();
        let ios: Vec<Io<'_>> = lanes
            .iter()
            .map(|&(input, output, count)| {
                // SAFETY: the caller's contract; validation (in the backend) checks lengths,
                // alignment and overlap before any work.
                unsafe {
                    if input == output {
                        Io::InPlace(RawMut::from_raw(output, count, dtype))
                    } else {
                        Io::OutOfPlace {
                            input: RawRef::from_raw(input, count, dtype),
                            output: RawMut::from_raw(output, count / world, dtype),
                        }
                    }
                }
            })
            .collect();
        let bytes = lanes.iter().fold(0usize, |b, l| b.saturating_add(l.2.saturating_mul(dtype.size())));
        let stream = RawStream(stream);
        // As `Routed::reduce_scatter_many`: the table's route, the transport's or the IPC one.
        self.settle(match self.route(Op::ReduceScatterMany, bytes) {
            Route::Hierarchical => self.hierarchical_many(&ios, split, &Raw(stream)),
            Route::Transport => {
                let t = self.transport().ok_or(Error::InvalidConfig { detail: "no transport".into() })?;
                // SAFETY: the caller vouches for the memory and the stream.
                unsafe { t.enqueue_many(&ios, split, stream) }
            }
            route => {
                let on = self.ipc_route(route)?;
                // SAFETY: as above.
                unsafe { self.ipc_backend()?.enqueue_many_routed_as_part(&ios, Some(on), split, stream) }
            }
        })
    }
}

/// The raw path: a stream handed in by the caller.
struct Raw(RawStream);

impl<D: IpcDevice> Via<IpcCollective<D>, GpuTransport<D>> for Raw {
    fn ipc(&self, ipc: &IpcCollective<D>, op: Op, io: Io<'_>, route: IpcRoute, part: u32) -> Result<(), Error> {
        // SAFETY: `enqueue_raw`'s caller vouches for the memory and the stream.
        unsafe { ipc.enqueue_routed_as_part(op, io, Some(route), part, self.0) }
    }
    fn transport(&self, transport: &GpuTransport<D>, op: Op, io: Io<'_>, part: u32) -> Result<(), Error> {
        // SAFETY: as above.
        unsafe { transport.enqueue(op, io, part, self.0) }
    }
    fn ipc_many(&self, ipc: &IpcCollective<D>, lanes: &[Io<'_>], route: IpcRoute, part: u32) -> Result<(), Error> {
        // SAFETY: as above.
        unsafe { ipc.enqueue_many_routed_as_part(lanes, Some(route), part, self.0) }
    }
    fn stream(&self) -> CallStream<'_, D::Stream> {
        CallStream::Raw(self.0)
    }
}
