//! The residual add + RMSNorm after an all_reduce on the host device: [`NormDevice`] for
//! [`HostDevice`] runs `fixed_tree`'s reference itself ([`fixed_tree::residual_rmsnorm`], one
//! row at a time), on the calling thread, to completion (a host stream is synchronous).
//!
//! The reference takes slices, and `h` or `y` may be exactly `sum` or `residual`: a `&mut`
//! slice over memory a `&` slice also covers would be undefined behaviour. So each row is read
//! into owned buffers first and the outputs are written back after the reference returned:
//! every borrow of the caller's memory is either shared and gone before any write, or a plain
//! copy out.
use crate::device::{BACKEND, HostDevice};
use collective_core::{DType, Error};
use detcoll_protocol::NormDevice;
use detcoll_protocol::norm::{NormArgs, NormParams};
use detcoll_protocol::params::CollectiveNormParams;
use fixed_tree::{Element, RmsNormShape};
use half::{bf16, f16};
use ipc_engine::RawStream;

impl NormDevice for HostDevice {
    unsafe fn residual_rmsnorm(&self, args: &NormArgs, _stream: RawStream) -> Result<(), Error> {
        let p = NormParams::pack(args)?;
        // SAFETY: forwarded from the caller (host addresses of the sizes `pack` checked,
        // aligned to the element); `pack` refused every overlap but the exact aliasing of an
        // output with `sum` or `residual`, which `rows` handles.
        unsafe { by_dtype(&p, args, None) }
    }
}

impl HostDevice {
    /// The norm of a fused launch that [reads the gathered sums](CollectiveNormParams::reads_gathered)
    /// (`dc_norm_rows_gathered`): the collective skipped its phase-2 copies, so each 16-byte
    /// vector of a row's sum is read where [`CollectiveNormParams::sum_at`] says, as the kernel
    /// does; `frame` is the call's frame offset.
    ///
    /// # Safety
    /// As [`NormDevice::residual_rmsnorm`], and the launch's segments address this rank's live
    /// group (the engine packed them) and its collective has completed.
    pub(crate) unsafe fn residual_rmsnorm_gathered(
        &self,
        fused: &CollectiveNormParams,
        args: &NormArgs,
        frame: u64,
    ) -> Result<(), Error> {
        let p = NormParams::pack(args)?;
        // SAFETY: as `residual_rmsnorm` for the views; every address `sum_at` gives is a
        // published reduced shard in a live frame or the caller's output (the caller).
        unsafe { by_dtype(&p, args, Some(&|o| fused.sum_at(frame, o))) }
    }
}

/// [`rows`] for the dtype of `args`.
///
/// # Safety
/// As [`rows`], without the dtype.
unsafe fn by_dtype(p: &NormParams, args: &NormArgs, sum_at: Option<&dyn Fn(u64) -> u64>) -> Result<(), Error> {
    // SAFETY: forwarded.
    unsafe {
        match args.dtype {
            DType::F32 => rows::<f32>(p, args, sum_at),
            DType::F16 => rows::<f16>(p, args, sum_at),
            DType::BF16 => rows::<bf16>(p, args, sum_at),
            dtype => Err(Error::UnsupportedDtype { op: collective_core::Op::AllReduce, dtype }),
        }
    }
}

/// Every row of `p`, through the reference; with `sum_at` (the gathered form, whose rows are
/// whole 16-byte vectors) the vector of the sum at byte `o` of `sum` is read at `sum_at(o)`.
///
/// # Safety
/// As [`NormDevice::residual_rmsnorm`] for host memory, after [`NormParams::pack`] accepted
/// `args` with `T` its dtype; `sum_at` gives readable addresses of the sum's vectors.
unsafe fn rows<T: Element>(p: &NormParams, args: &NormArgs, sum_at: Option<&dyn Fn(u64) -> u64>) -> Result<(), Error> {
    let hidden = args.hidden;
    if args.rows == 0 {
        return Ok(());
    }
    // SAFETY: `weight` holds `hidden` readable, aligned elements of `T` (the caller's contract,
    // alignment checked by `pack`) and overlaps neither output (`pack`), so nothing writes it
    // while this shared slice lives.
    let weight = unsafe { core::slice::from_raw_parts(p.weight as *const T, hidden) };
    let mut h = vec![weight[0]; hidden];
    let mut y = h.clone();
    let shape = RmsNormShape { rows: 1, hidden };
    for row in 0..args.rows {
        // Row offsets fit: `pack` checked that rows * hidden * size fits in 64 bits and that
        // every tensor ends inside the address space.
        let offset = (row * hidden * T::SIZE) as u64;
        let read = |base: u64| {
            // SAFETY: the row lies inside the tensor at `base` (readable, aligned: the caller's
            // contract and `pack`); the shared slice is copied and dropped before any write.
            unsafe { core::slice::from_raw_parts((base + offset) as *const T, hidden) }.to_vec()
        };
        let residual = read(p.residual);
        let sum = match sum_at {
            None => read(p.sum),
            Some(at) => {
                let mut sum = vec![weight[0]; hidden];
                let row_bytes = hidden * T::SIZE;
                for o in (0..row_bytes).step_by(16) {
                    let n = 16.min(row_bytes - o);
                    // SAFETY: `n` readable bytes of the sum at `at` (the caller's contract) into
                    // this function's own buffer.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            at(offset + o as u64) as *const u8,
                            (sum.as_mut_ptr() as *mut u8).add(o),
                            n,
                        )
                    };
                }
                sum
            }
        };
        // Steps 1-5 with one rank: step 1 (the tree of one input) is `sum` itself.
        fixed_tree::residual_rmsnorm(&[&sum], &residual, weight, p.eps, shape, &mut h, &mut y)
            .map_err(|e| Error::Backend { backend: BACKEND, detail: format!("residual_rmsnorm reference: {e}") })?;
        // SAFETY: `h` and `y` rows are writable, aligned and do not overlap each other or
        // `weight` (`pack`); no slice of the caller's memory is alive here but `weight`'s.
        unsafe {
            core::ptr::copy_nonoverlapping(h.as_ptr(), (p.h + offset) as *mut T, hidden);
            core::ptr::copy_nonoverlapping(y.as_ptr(), (p.y + offset) as *mut T, hidden);
        }
    }
    Ok(())
}
