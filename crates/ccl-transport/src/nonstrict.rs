//! NON-STRICT native NCCL/RCCL reductions, for benchmark comparison only.
//!
//! `ncclAllReduce` and `ncclReduceScatter` compute a correct sum, but their floating-point
//! operand order depends on the algorithm, protocol, channel count, topology and library
//! version, so their bits drift between runs, machines and world sizes. They are **not
//! deterministic** and never used by [`crate::TransportCollective`]'s `Collective` methods.
//! They exist so the benchmark can report the native library's latency next to the strict
//! routes, in a column labelled non-strict.
use crate::collective::{State, TransportCollective};
use crate::device::{Device, RawStream};
use crate::sys::{ncclDataType_t, ncclRedOp_t};
use crate::watchdog::Call;
use collective_core::{DType, Error, Io, Op, validate};

/// The NCCL type of a reducible dtype.
fn nccl_dtype(op: Op, dtype: DType) -> Result<ncclDataType_t, Error> {
    match dtype {
        DType::F32 => Ok(ncclDataType_t::ncclFloat32),
        DType::F16 => Ok(ncclDataType_t::ncclFloat16),
        DType::BF16 => Ok(ncclDataType_t::ncclBfloat16),
        other => Err(Error::UnsupportedDtype { op, dtype: other }),
    }
}

impl<D: Device> TransportCollective<D> {
    /// **NOT deterministic**: native `ncclAllReduce` (sum). For benchmark comparison only;
    /// its bits depend on NCCL's algorithm choice and differ from the fixed tree.
    pub fn native_all_reduce(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        let raw = self.device.raw_stream(stream)?;
        // SAFETY: a live stream of this device; the views' validity is the contract of their
        // constructors.
        unsafe { self.native(Op::AllReduce, io, raw) }
    }

    /// **NOT deterministic**: native `ncclReduceScatter` (sum), NCCL in-place semantics. For
    /// benchmark comparison only.
    pub fn native_reduce_scatter(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        let raw = self.device.raw_stream(stream)?;
        // SAFETY: as in `native_all_reduce`.
        unsafe { self.native(Op::ReduceScatter, io, raw) }
    }

    /// # Safety
    /// As [`TransportCollective::enqueue`].
    unsafe fn native(&self, op: Op, io: Io<'_>, stream: RawStream) -> Result<(), Error> {
        self.check_open()?;
        let call = validate(op, &io, self.rank, self.world, usize::MAX)?;
        let dtype = nccl_dtype(op, call.dtype)?;
        let mut st = self.lock()?;
        if let Err(e) = st.comm.poll() {
            return Err(self.fail(&mut st, e.into()));
        }
        if call.count_out == 0 {
            return Ok(());
        }
        if let Err(e) = self.device.bind() {
            return Err(self.fail(&mut st, e));
        }
        let s = stream.0;
        let sum = ncclRedOp_t::ncclSum;
        let work = |st: &mut State<D>| {
            // SAFETY: validated views of this device; `stream` is live (caller).
            let r = unsafe {
                match op {
                    Op::AllReduce => st.comm.native_all_reduce(call.src, call.dst, call.count_in, dtype, sum, s),
                    _ => st.comm.native_reduce_scatter(call.src, call.dst, call.count_out, dtype, sum, s),
                }
            };
            r.map_err(Error::from)
        };
        // SAFETY: `stream` is live (caller).
        let r = unsafe { st.tracked(&self.device, stream, Call::Native(op), work) };
        r.map_err(|e| self.fail(&mut st, e))
    }
}
