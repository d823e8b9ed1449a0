//! The Python exceptions: one class per variant of the Rust `Error`, under a common
//! `detcoll.DetcollError`, so callers catch what they can handle (`detcoll.InvalidArgument`:
//! bad input, nothing was written; `detcoll.PeerError`: a peer timed out, died, failed or
//! closed; ...). Every exception has `peer`: the rank it blames, or `None`.
use collective_factory::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::{PyErr, create_exception};

create_exception!(detcoll, DetcollError, PyRuntimeError, "Every detcoll failure (the Rust `Error`).");
create_exception!(
    detcoll,
    InvalidArgument,
    DetcollError,
    "A call's arguments were refused before any work: nothing was written."
);
create_exception!(detcoll, UnsupportedWorldSize, InvalidArgument, "A world size the backend does not run.");
create_exception!(detcoll, UnsupportedDtype, InvalidArgument, "A reduction of a dtype other than f32, f16, bf16.");
create_exception!(detcoll, DtypeMismatch, InvalidArgument, "Input and output dtypes differ.");
create_exception!(detcoll, LengthMismatch, InvalidArgument, "An output of the wrong number of elements.");
create_exception!(
    detcoll,
    NotDivisible,
    InvalidArgument,
    "A reduce_scatter input that does not split into world shards."
);
create_exception!(detcoll, Misaligned, InvalidArgument, "An address not aligned to its element size.");
create_exception!(detcoll, SizeOverflow, InvalidArgument, "A size beyond the address space.");
create_exception!(detcoll, Overlap, InvalidArgument, "Input and output overlap (use the in-place form).");
create_exception!(detcoll, LanesOverlap, InvalidArgument, "Two reduce_scatter_many lanes share memory.");
create_exception!(detcoll, CapacityExceeded, InvalidArgument, "A call larger than the route can stage.");
create_exception!(detcoll, TooManyLanes, InvalidArgument, "More reduce_scatter_many lanes than supported.");
create_exception!(detcoll, NotContiguous, InvalidArgument, "A tensor that is not contiguous in memory.");
create_exception!(detcoll, WrongDevice, InvalidArgument, "A tensor on another device than the collective's.");
create_exception!(detcoll, Closed, DetcollError, "The collective is closed.");
create_exception!(detcoll, CloseFailed, DetcollError, "An earlier close of the collective failed.");
create_exception!(detcoll, ForkedHandle, DetcollError, "A collective used in a forked child of its creator.");
create_exception!(detcoll, Poisoned, DetcollError, "The collective is poisoned by an earlier failure.");
create_exception!(
    detcoll,
    PeerError,
    DetcollError,
    "A peer rank did not take part: it timed out, died, failed or closed (`peer` names it). The \
     collective is poisoned: build a new one."
);
create_exception!(detcoll, PeerTimeout, PeerError, "A peer did not arrive in time.");
create_exception!(detcoll, PeerDied, PeerError, "A peer process is gone.");
create_exception!(
    detcoll,
    PeerFailed,
    PeerError,
    "A peer is alive but stopped after a failure of its own (its own error names the cause)."
);
create_exception!(detcoll, PeerClosed, PeerError, "A peer closed the collective.");
create_exception!(detcoll, OutOfMemory, DetcollError, "Memory the collective needs could not be reserved.");
create_exception!(detcoll, SignatureMismatch, DetcollError, "Ranks made different calls.");
create_exception!(detcoll, ConfigMismatch, DetcollError, "Ranks disagree on the configuration.");
create_exception!(detcoll, InvalidConfig, DetcollError, "A configuration that cannot work.");
create_exception!(detcoll, LibraryMissing, DetcollError, "A GPU library could not be loaded.");
create_exception!(detcoll, BackendError, DetcollError, "A backend failure (a GPU runtime call, NVRTC, NCCL).");
create_exception!(detcoll, BootstrapError, DetcollError, "The rank rendezvous failed.");

/// The Python exception of `e`, its message the Rust error's; an error that blames a rank
/// carries it as the exception's `peer` attribute (so callers need not parse the message).
pub fn to_py(e: Error) -> PyErr {
    let peer = e.culprit();
    let err = exception(e);
    if let Some(peer) = peer {
        Python::attach(|py| {
            let _ = err.value(py).setattr("peer", peer);
        });
    }
    err
}

/// The exception class of `e` with its message.
fn exception(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::UnsupportedWorldSize { .. } => UnsupportedWorldSize::new_err(msg),
        Error::UnsupportedDtype { .. } => UnsupportedDtype::new_err(msg),
        Error::DtypeMismatch { .. } => DtypeMismatch::new_err(msg),
        Error::LengthMismatch { .. } => LengthMismatch::new_err(msg),
        Error::NotDivisible { .. } => NotDivisible::new_err(msg),
        Error::Misaligned { .. } => Misaligned::new_err(msg),
        Error::SizeOverflow { .. } => SizeOverflow::new_err(msg),
        // Two arguments sharing memory they must not: the fused norm's (`ArgumentsOverlap`
        // names them) or an out-of-place input and output.
        Error::Overlap { .. } | Error::ArgumentsOverlap { .. } => Overlap::new_err(msg),
        Error::LanesOverlap { .. } => LanesOverlap::new_err(msg),
        Error::CapacityExceeded { .. } => CapacityExceeded::new_err(msg),
        Error::TooManyLanes { .. } => TooManyLanes::new_err(msg),
        // An argument outside its range (the fused norm's eps and hidden).
        Error::InvalidArgument { .. } => InvalidArgument::new_err(msg),
        // A host slice given to a GPU collective (Rust's `Io::host`; Python passes its arrays
        // by address, so this comes from Rust callers only).
        Error::HostMemory { .. } => InvalidArgument::new_err(msg),
        Error::Closed => Closed::new_err(msg),
        Error::CloseFailed { .. } => CloseFailed::new_err(msg),
        Error::ForkedHandle { .. } => ForkedHandle::new_err(msg),
        Error::Poisoned { .. } => Poisoned::new_err(msg),
        Error::PeerTimeout { .. } => PeerTimeout::new_err(msg),
        Error::PeerDied { .. } => PeerDied::new_err(msg),
        Error::PeerFailed { .. } => PeerFailed::new_err(msg),
        Error::PeerClosed { .. } => PeerClosed::new_err(msg),
        Error::OutOfMemory { .. } => OutOfMemory::new_err(msg),
        Error::SignatureMismatch { .. } => SignatureMismatch::new_err(msg),
        Error::ConfigMismatch { .. } => ConfigMismatch::new_err(msg),
        Error::InvalidConfig { .. } => InvalidConfig::new_err(msg),
        Error::LibraryMissing { .. } => LibraryMissing::new_err(msg),
        Error::Backend { .. } | Error::Vendor { .. } => BackendError::new_err(msg),
        Error::Bootstrap(_) => BootstrapError::new_err(msg),
        // `Error` is non_exhaustive: a variant added later is still a DetcollError.
        _ => DetcollError::new_err(msg),
    }
}

/// Adds every exception class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    macro_rules! add {
        ($($t:ident),*) => { $( m.add(stringify!($t), py.get_type::<$t>())?; )* };
    }
    // Every exception has `peer`: the rank it blames, `None` where it blames none.
    py.get_type::<DetcollError>().setattr("peer", py.None())?;
    add!(
        DetcollError,
        InvalidArgument,
        UnsupportedWorldSize,
        UnsupportedDtype,
        DtypeMismatch,
        LengthMismatch,
        NotDivisible,
        Misaligned,
        SizeOverflow,
        Overlap,
        LanesOverlap,
        CapacityExceeded,
        TooManyLanes,
        NotContiguous,
        WrongDevice,
        Closed,
        CloseFailed,
        ForkedHandle,
        Poisoned,
        PeerError,
        PeerTimeout,
        PeerDied,
        PeerFailed,
        PeerClosed,
        OutOfMemory,
        SignatureMismatch,
        ConfigMismatch,
        InvalidConfig,
        LibraryMissing,
        BackendError,
        BootstrapError
    );
    Ok(())
}
