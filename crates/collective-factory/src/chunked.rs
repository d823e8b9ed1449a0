//! An all_reduce larger than a transport takes in one call, run as consecutive all_reduces of
//! element ranges: elementwise, so every element's tree, and its bits, are the whole call's.
//! The transport route and the IPC + transport hybrid run their large all_reduces through it,
//! so capacity bounds no all_reduce on any route (the IPC routes chunk inside the engine).
use collective_core::{Error, Io, RawMut, RawRef};

/// Elements of `io`: its input's (in place, its buffer's).
pub(crate) fn elements(io: &Io<'_>) -> usize {
    match io {
        Io::InPlace(b) => b.len(),
        Io::OutOfPlace { input, .. } => input.len(),
    }
}

/// Bytes of one element of `io`.
pub(crate) fn element_size(io: &Io<'_>) -> usize {
    match io {
        Io::InPlace(b) => b.dtype().size(),
        Io::OutOfPlace { input, .. } => input.dtype().size(),
    }
}

/// Runs `run` on `io` whole when it has at most `step` elements, else on its consecutive
/// element ranges of `step` elements (the last the rest), stopping at the first failure.
///
/// # Safety
/// `io` is a validated all_reduce (its input and output of equal length, in bounds), and
/// `step` is more than zero.
pub(crate) unsafe fn all_reduce_in_chunks(
    io: Io<'_>,
    step: usize,
    mut run: impl FnMut(Io<'_>) -> Result<(), Error>,
) -> Result<(), Error> {
    let n = elements(&io);
    if n <= step {
        return run(io);
    }
    let mut lo = 0;
    while lo < n {
        let len = step.min(n - lo);
        // SAFETY: elements `lo..lo + len` of the call's views (in bounds: the caller's
        // contract), which this call borrows for as long as `run` runs.
        run(unsafe { range(&io, lo, len) })?;
        lo += len;
    }
    Ok(())
}

/// Elements `lo..lo + len` of `io`'s views.
///
/// # Safety
/// The range lies inside every view of `io`.
unsafe fn range<'a>(io: &'a Io<'_>, lo: usize, len: usize) -> Io<'a> {
    let at = |addr: u64, size: usize| addr + (lo * size) as u64;
    match io {
        // SAFETY: inside the buffer (the caller's contract), which the call borrows uniquely.
        Io::InPlace(b) => Io::InPlace(unsafe { RawMut::from_raw(at(b.addr(), b.dtype().size()), len, b.dtype()) }),
        // SAFETY: inside the input and the output (the caller's contract), as the call
        // borrows them.
        Io::OutOfPlace { input, output } => unsafe {
            Io::OutOfPlace {
                input: RawRef::from_raw(at(input.addr(), input.dtype().size()), len, input.dtype()),
                output: RawMut::from_raw(at(output.addr(), output.dtype().size()), len, output.dtype()),
            }
        },
    }
}
