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
use fixed_tree::{Element, RmsNormShape};
use half::{bf16, f16};
use ipc_engine::RawStream;

impl NormDevice for HostDevice {
    unsafe fn residual_rmsnorm(&self, args: &NormArgs, _stream: RawStream) -> Result<(), Error> {
        let p = NormParams::pack(args)?;
        // SAFETY: forwarded from the caller (host addresses of the sizes `pack` checked,
        // aligned to the element); `pack` refused every overlap but the exact aliasing of an
        // output with `sum` or `residual`, which `rows` handles.
        unsafe {
            match args.dtype {
                DType::F32 => rows::<f32>(&p, args),
                DType::F16 => rows::<f16>(&p, args),
                DType::BF16 => rows::<bf16>(&p, args),
                dtype => Err(Error::UnsupportedDtype { op: collective_core::Op::AllReduce, dtype }),
            }
        }
    }
}

/// Every row of `p`, through the reference.
///
/// # Safety
/// As [`NormDevice::residual_rmsnorm`] for host memory, after [`NormParams::pack`] accepted
/// `args` with `T` its dtype.
unsafe fn rows<T: Element>(p: &NormParams, args: &NormArgs) -> Result<(), Error> {
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
        let (sum, residual) = (read(p.sum), read(p.residual));
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
