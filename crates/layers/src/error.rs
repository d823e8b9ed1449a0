//! One error type for the layers: a shape the layer cannot take, or what a collective, the
//! tree or the GPU (driver, cuBLAS, NVRTC) reported.
use std::fmt;

/// What a layer call can fail with. Shapes are checked before any collective call, so a shape
/// error on one rank is a shape error on every rank that was given the same shapes.
#[derive(Debug)]
pub enum Error {
    /// The sizes given do not fit together (the message says which).
    Shape(String),
    /// A collective call failed. Transparent: its message and `source()` are the collective's
    /// error's own, so printing this error shows which peer or argument failed.
    Collective(collective_core::Error),
    /// The local fold of the fixed tree failed (a world size or length it does not take).
    /// Transparent, as `Collective`.
    Tree(fixed_tree::Error),
    /// Ranks that are threads of one process did not meet (the GPU path's `Rendezvous`): a
    /// peer failed or did not arrive in time (the message says which).
    Lockstep(String),
    /// A GPU call failed (the GPU path, feature `cuda`): `call` names it, `source` is the
    /// vendor's error (cudarc's `DriverError`, `CublasError` or `CompileError`), or a
    /// `collective_core::Error::LibraryMissing` when libcublas or libnvrtc cannot be loaded.
    /// The variant exists without the feature too, so that matches do not depend on it.
    Cuda {
        /// The call or step that failed (`"cublasGemmEx"`, `"loading libcublas"`, ...).
        call: String,
        /// The vendor's error.
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shape(detail) => write!(f, "shape: {detail}"),
            Error::Collective(e) => fmt::Display::fmt(e, f),
            Error::Tree(e) => fmt::Display::fmt(e, f),
            Error::Lockstep(detail) => write!(f, "lockstep: {detail}"),
            Error::Cuda { call, .. } => write!(f, "GPU call `{call}` failed"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Shape(_) | Error::Lockstep(_) => None,
            Error::Collective(e) => std::error::Error::source(e),
            Error::Tree(e) => std::error::Error::source(e),
            Error::Cuda { source, .. } => Some(&**source),
        }
    }
}

impl From<collective_core::Error> for Error {
    fn from(e: collective_core::Error) -> Self {
        Error::Collective(e)
    }
}

impl From<fixed_tree::Error> for Error {
    fn from(e: fixed_tree::Error) -> Self {
        Error::Tree(e)
    }
}

impl Error {
    /// An [`Error::Cuda`] for step `call` with the vendor's error `source`.
    pub fn cuda(call: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Cuda { call: call.into(), source: Box::new(source) }
    }
}

/// `Err(Error::Shape(..))` unless `ok`.
pub(crate) fn require(ok: bool, detail: impl FnOnce() -> String) -> Result<(), Error> {
    if ok { Ok(()) } else { Err(Error::Shape(detail())) }
}

/// `work()`, the part of a layer call before its next `calls` collective calls; when it fails
/// (a shape the layer refuses, a GEMM's error), those calls are counted as refused on `comm`
/// (`Collective::count_refused_call`): this rank will not make them, so peers that do fail
/// with `SignatureMismatch` instead of pairing them with this rank's next calls.
pub(crate) fn before_calls<C, R>(comm: &C, calls: usize, work: impl FnOnce() -> Result<R, Error>) -> Result<R, Error>
where
    C: collective_core::Collective + ?Sized,
{
    let r = work();
    if r.is_err() {
        for _ in 0..calls {
            // A handle that cannot count (closed, poisoned) fails its next call anyway.
            let _ = comm.count_refused_call();
        }
    }
    r
}

/// `a * b`, or a shape error naming `what` when it overflows.
pub(crate) fn product(what: &str, dims: &[usize]) -> Result<usize, Error> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Shape(format!("{what}: {dims:?} overflows usize")))
}

#[cfg(test)]
mod tests {
    use super::Error;
    use std::error::Error as _;

    #[test]
    fn a_collective_error_shows_through_with_its_own_message_and_source() {
        let inner = collective_core::Error::PeerClosed { peer: 3, what: "complete a call that needs it" };
        let message = inner.to_string();
        let e = Error::from(inner);
        assert_eq!(e.to_string(), message);
        assert!(e.to_string().contains("rank 3"), "{e}");
        assert!(e.source().is_none());
        let boot = collective_core::bootstrap::BootstrapError::PeerGone { rank: 1, detail: "closed".into() };
        let e = Error::from(collective_core::Error::Bootstrap(boot));
        assert!(e.to_string().contains("rank 1 is gone"), "{e}");
        // A vendor's error stays reachable as the source, as the collective's error has it.
        let vendor = std::io::Error::other("driver said no");
        let e = Error::from(collective_core::Error::Vendor {
            backend: "cuda",
            call: "cuMemAlloc".into(),
            source: Box::new(vendor),
        });
        assert!(e.source().is_some_and(|s| s.to_string() == "driver said no"), "{:?}", e.source());
    }
}
