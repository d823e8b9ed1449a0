//! One rank's collective on the platform it was built for, and the raw calls the Python
//! wrapper makes on it: addresses, element counts and dtypes the wrapper read from the tensors,
//! checked here before any work so that a refused call writes nothing.
use collective_factory::{
    Collective, CpuCollective, DType, Error, Io, NvidiaCollective, Op, RawMut, RawRef, Route, lane_name,
};
use std::ffi::c_void;

/// A collective of either platform this extension drives.
#[derive(Debug)]
// One per communicator, built once and never moved on a call path: boxing buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    /// The CPU twin: host memory (numpy arrays, CPU tensors).
    Cpu(CpuCollective),
    /// NVIDIA GPUs: device memory, calls on the caller's `CUstream`.
    Nvidia(NvidiaCollective),
}

/// One side of a call: an address, its element count and dtype.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    pub addr: u64,
    pub count: usize,
    pub dtype: DType,
}

impl Backend {
    pub fn rank(&self) -> usize {
        match self {
            Backend::Cpu(c) => c.rank(),
            Backend::Nvidia(c) => c.rank(),
        }
    }
    pub fn world_size(&self) -> usize {
        match self {
            Backend::Cpu(c) => c.world_size(),
            Backend::Nvidia(c) => c.world_size(),
        }
    }
    pub fn capabilities(&self) -> collective_factory::Capabilities {
        match self {
            Backend::Cpu(c) => c.capabilities(),
            Backend::Nvidia(c) => c.capabilities(),
        }
    }
    pub fn route(&self, op: Op, bytes: usize) -> Route {
        match self {
            Backend::Cpu(c) => c.route(op, bytes),
            Backend::Nvidia(c) => c.route(op, bytes),
        }
    }
    pub fn fused_norm_route(&self, bytes: usize) -> Route {
        match self {
            Backend::Cpu(c) => c.fused_norm_route(bytes),
            Backend::Nvidia(c) => c.fused_norm_route(bytes),
        }
    }
    pub fn check(&self) -> Result<(), Error> {
        match self {
            Backend::Cpu(c) => c.check(),
            Backend::Nvidia(c) => c.check(),
        }
    }
    pub fn close(&self) -> Result<(), Error> {
        match self {
            Backend::Cpu(c) => c.close(),
            Backend::Nvidia(c) => c.close(),
        }
    }
    /// `Collective::abandon`: this rank stops for good; its peers' waits end at once.
    pub fn abandon(&self, cause: &str) {
        match self {
            Backend::Cpu(c) => c.abandon(cause),
            Backend::Nvidia(c) => c.abandon(cause),
        }
    }

    /// Counts a call this rank refused before it reached the collective (the wrapper's own
    /// checks, or the ones here), as the collective counts the calls it refuses itself
    /// (`Collective::count_refused_call`): peers that made the call then fail with
    /// `SignatureMismatch` instead of pairing their next call with this rank's next one.
    pub fn count_refused_call(&self) -> Result<(), Error> {
        match self {
            Backend::Cpu(c) => c.count_refused_call(),
            Backend::Nvidia(c) => c.count_refused_call(),
        }
    }

    /// The calls this rank began, made or refused (`Routed::calls_begun`).
    pub fn calls_begun(&self) -> Result<u32, Error> {
        match self {
            Backend::Cpu(c) => c.calls_begun(),
            Backend::Nvidia(c) => c.calls_begun(),
        }
    }

    /// `r`, counted as a refused call when it is an error (see [`Backend::count_refused_call`]).
    pub fn counted<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if r.is_err() {
            // A handle that cannot count (closed, forked, poisoned) fails its next call anyway.
            let _ = self.count_refused_call();
        }
        r
    }

    /// Waits for `stream` (a `CUstream`; 0 the legacy default stream; ignored on the CPU,
    /// whose calls are done when they return), then `check`.
    pub fn synchronize(&self, stream: u64) -> Result<(), Error> {
        match self {
            Backend::Cpu(c) => c.synchronize(&()),
            Backend::Nvidia(c) => {
                crate::cuda::synchronize(c, stream)?;
                c.check()
            }
        }
    }

    /// `op` from `input` into `output` (the same address: in place) on `stream`, after the
    /// checks the raw entry leaves to its caller: the two dtypes agree and `output` has
    /// exactly the elements `op` writes.
    ///
    /// # Safety
    /// `input` and `output` must describe live memory of this backend's address space (host
    /// for the CPU twin, this rank's device for NVIDIA) of at least their counts, untouched by
    /// anything else until the call has executed on `stream`, a live stream of the device.
    pub unsafe fn call(&self, op: Op, input: Buf, output: Buf, stream: u64) -> Result<(), Error> {
        self.counted(check_output(op, input, output, self.world_size()))?;
        let in_place = input.addr == output.addr;
        match self {
            Backend::Cpu(c) => {
                // SAFETY: the caller's contract (host memory of these sizes, not touched until
                // the call returns: the CPU twin runs the call to completion).
                let io = unsafe { io_of(input, output, in_place) };
                match op {
                    Op::AllReduce => c.all_reduce(io, &()),
                    Op::AllGather => c.all_gather(io, &()),
                    _ => c.reduce_scatter(io, &()),
                }
            }
            // SAFETY: the caller's contract; `enqueue_raw` validates lengths, alignment and
            // overlap before any work.
            Backend::Nvidia(c) => unsafe {
                c.enqueue_raw(op, input.addr, output.addr, input.count, input.dtype, stream as usize as *mut c_void)
            },
        }
    }

    /// `reduce_scatter_many` over `lanes` (`(input, output)` each; the same address: that
    /// lane in place), one tree per lane, on `stream`.
    ///
    /// # Safety
    /// As [`Backend::call`], for every lane.
    pub unsafe fn call_many(&self, lanes: &[(Buf, Buf)], stream: u64) -> Result<(), Error> {
        let world = self.world_size();
        let dtype = lanes.first().map(|l| l.0.dtype).unwrap_or(DType::F32);
        self.counted(check_lanes(lanes, dtype, world))?;
        match self {
            Backend::Cpu(c) => {
                let ios: Vec<Io<'_>> = lanes
                    .iter()
                    // SAFETY: the caller's contract, for every lane.
                    .map(|&(i, o)| unsafe { io_of(i, o, i.addr == o.addr) })
                    .collect();
                c.reduce_scatter_many(&ios, &())
            }
            Backend::Nvidia(c) => {
                let raw: Vec<(u64, u64, usize)> = lanes.iter().map(|(i, o)| (i.addr, o.addr, i.count)).collect();
                // SAFETY: the caller's contract; validated by the backend before any work.
                unsafe { c.enqueue_many_raw(&raw, dtype, stream as usize as *mut c_void) }
            }
        }
    }
}

/// Every lane has `dtype` and the output its op writes.
fn check_lanes(lanes: &[(Buf, Buf)], dtype: DType, world: usize) -> Result<(), Error> {
    for (i, &(input, output)) in lanes.iter().enumerate() {
        if input.dtype != dtype {
            return Err(Error::DtypeMismatch {
                op: Op::ReduceScatterMany,
                argument: lane_name(i),
                got: input.dtype,
                reference: lane_name(0),
                expected: dtype,
            });
        }
        check_output(Op::ReduceScatter, input, output, world)?;
    }
    Ok(())
}

/// The tensors of a fused all_reduce + residual + RMSNorm ([`Backend::all_reduce_residual_rmsnorm`]).
#[derive(Debug, Clone, Copy)]
pub struct NormBufs {
    /// This rank's contribution, `rows * hidden` elements.
    pub x: Buf,
    /// Receives `y` (the all_reduce's sum first); `x`'s address: in place.
    pub y: Buf,
    /// Read, then updated in place to `h = residual + sum`.
    pub residual: Buf,
    /// `hidden` elements.
    pub weight: Buf,
}

impl Backend {
    /// `y = tree(x)`, `residual = h = residual + y`, `y = rmsnorm(h) * weight` over rows of
    /// `hidden` elements, on `stream` (the collective's own typed checks follow; a refused call
    /// writes nothing). Checked here first, since the raw GPU entry takes one count and dtype:
    /// every tensor has `x`'s dtype, `y` and `residual` `x`'s elements, `weight` `hidden`.
    ///
    /// # Safety
    /// As [`Backend::call`], for every tensor of `t`.
    pub unsafe fn all_reduce_residual_rmsnorm(
        &self,
        t: NormBufs,
        hidden: usize,
        eps: f32,
        stream: u64,
    ) -> Result<(), Error> {
        let dtype = t.x.dtype;
        self.counted(check_norm_bufs(&t, hidden))?;
        match self {
            Backend::Cpu(c) => {
                // SAFETY: the caller's contract (host memory of these sizes, untouched until the
                // call returns: the CPU twin runs it to completion).
                let (x, norm) = unsafe {
                    let x = io_of(t.x, t.y, t.x.addr == t.y.addr);
                    let norm = collective_factory::RmsNorm {
                        residual: Io::InPlace(RawMut::from_raw(t.residual.addr, t.residual.count, dtype)),
                        weight: RawRef::from_raw(t.weight.addr, t.weight.count, dtype),
                        hidden,
                        eps,
                    };
                    (x, norm)
                };
                c.all_reduce_residual_rmsnorm(x, norm, &())
            }
            // SAFETY: the caller's contract; the entry validates lengths, alignment and
            // overlap before any work.
            Backend::Nvidia(c) => unsafe {
                c.all_reduce_residual_rmsnorm_raw(
                    t.x.addr,
                    t.y.addr,
                    t.residual.addr,
                    t.residual.addr,
                    t.weight.addr,
                    t.x.count,
                    hidden,
                    eps,
                    dtype,
                    stream as usize as *mut c_void,
                )
            },
        }
    }
}

/// Every tensor of `t` has `x`'s dtype, `y` and `residual` `x`'s elements, `weight` `hidden`.
fn check_norm_bufs(t: &NormBufs, hidden: usize) -> Result<(), Error> {
    let op = Op::AllReduce;
    let dtype = t.x.dtype;
    for (argument, b) in [("out", t.y), ("residual", t.residual), ("weight", t.weight)] {
        if b.dtype != dtype {
            return Err(Error::DtypeMismatch { op, argument, got: b.dtype, reference: "x", expected: dtype });
        }
    }
    for (argument, b, expected, why) in [
        ("out", t.y, t.x.count, "x's"),
        ("residual", t.residual, t.x.count, "x's"),
        ("weight", t.weight, hidden, "hidden, the last dimension of x"),
    ] {
        if b.count != expected {
            return Err(Error::LengthMismatch { op, argument, expected, got: b.count, why });
        }
    }
    Ok(())
}

/// The views of one call (in place: the output buffer only).
///
/// # Safety
/// As [`Backend::call`].
unsafe fn io_of<'a>(input: Buf, output: Buf, in_place: bool) -> Io<'a> {
    // SAFETY: the caller's contract.
    unsafe {
        if in_place {
            Io::InPlace(RawMut::from_raw(output.addr, output.count, output.dtype))
        } else {
            Io::OutOfPlace {
                input: RawRef::from_raw(input.addr, input.count, input.dtype),
                output: RawMut::from_raw(output.addr, output.count, output.dtype),
            }
        }
    }
}

/// The elements `op` writes for `input` (all_gather: `world * n`; reduce_scatter: `n / world`,
/// `n` a multiple of `world`), and that `output` has exactly those and `input`'s dtype. In
/// place, `input` describes this rank's contribution (all_gather: one shard; else the buffer).
pub fn check_output(op: Op, input: Buf, output: Buf, world: usize) -> Result<(), Error> {
    if output.dtype != input.dtype {
        return Err(Error::DtypeMismatch {
            op,
            argument: "out",
            got: output.dtype,
            reference: "input",
            expected: input.dtype,
        });
    }
    let in_place = input.addr == output.addr;
    let (expected, why) = match op {
        Op::AllGather => (
            input.count.checked_mul(world).ok_or(Error::SizeOverflow { op, argument: "input", len: input.count })?,
            "world_size times the input's",
        ),
        Op::ReduceScatter | Op::ReduceScatterMany if in_place => (input.count, "in place: the whole input"),
        Op::ReduceScatter | Op::ReduceScatterMany => {
            if world == 0 || !input.count.is_multiple_of(world) {
                return Err(Error::NotDivisible { op, argument: "input", len: input.count, world });
            }
            (input.count / world, "the input's divided by world_size")
        }
        Op::AllReduce => (input.count, "the input's"),
    };
    if output.count != expected {
        return Err(Error::LengthMismatch { op, argument: "out", expected, got: output.count, why });
    }
    Ok(())
}

/// The op named `name` (`all_reduce`, `all_gather`, `reduce_scatter`, `reduce_scatter_many`).
pub fn parse_op(name: &str) -> Result<Op, Error> {
    Op::parse(name).ok_or_else(|| Error::InvalidConfig { detail: format!("unknown operation {name:?}") })
}

/// The dtype named `name` (`f32`, `bf16`, `u8`, ... as `DType::name`).
pub fn parse_dtype(name: &str) -> Result<DType, Error> {
    DType::parse(name).ok_or_else(|| Error::InvalidConfig { detail: format!("unknown dtype {name:?}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(addr: u64, count: usize, dtype: DType) -> Buf {
        Buf { addr, count, dtype }
    }

    #[test]
    fn output_sizes_per_op() {
        let i = buf(64, 8, DType::BF16);
        assert!(check_output(Op::AllReduce, i, buf(128, 8, DType::BF16), 4).is_ok());
        assert!(check_output(Op::AllGather, i, buf(128, 32, DType::BF16), 4).is_ok());
        assert!(check_output(Op::ReduceScatter, i, buf(128, 2, DType::BF16), 4).is_ok());
        assert!(matches!(
            check_output(Op::AllGather, i, buf(128, 31, DType::BF16), 4),
            Err(Error::LengthMismatch { expected: 32, got: 31, .. })
        ));
        assert!(matches!(
            check_output(Op::ReduceScatter, buf(64, 6, DType::F32), buf(128, 1, DType::F32), 4),
            Err(Error::NotDivisible { len: 6, world: 4, .. })
        ));
        assert!(matches!(
            check_output(Op::AllReduce, i, buf(128, 8, DType::F16), 4),
            Err(Error::DtypeMismatch { got: DType::F16, expected: DType::BF16, .. })
        ));
        assert!(matches!(
            check_output(Op::AllGather, buf(64, usize::MAX, DType::U8), buf(0, 0, DType::U8), 2),
            Err(Error::SizeOverflow { .. })
        ));
    }

    #[test]
    fn names_parse() {
        assert_eq!(parse_op("reduce_scatter_many").unwrap(), Op::ReduceScatterMany);
        assert!(parse_op("broadcast").is_err());
        assert_eq!(parse_dtype("bf16").unwrap(), DType::BF16);
        assert!(parse_dtype("f8").is_err());
    }
}
