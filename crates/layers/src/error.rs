//! One error type for the layers: a shape the layer cannot take, or what a collective, the
//! tree or the GPU (driver, cuBLAS, NVRTC) reported.
use std::fmt;

/// What a layer call can fail with. Shapes are checked before any collective call, so a shape
/// error on one rank is a shape error on every rank that was given the same shapes.
#[derive(Debug)]
pub enum Error {
    /// The sizes given do not fit together (the message says which).
    Shape(String),
    /// A collective call failed.
    Collective(collective_core::Error),
    /// The local fold of the fixed tree failed (a world size or length it does not take).
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
            Error::Collective(_) => f.write_str("a collective call failed"),
            Error::Tree(_) => f.write_str("the local fixed-tree fold failed"),
            Error::Lockstep(detail) => write!(f, "lockstep: {detail}"),
            Error::Cuda { call, .. } => write!(f, "GPU call `{call}` failed"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Shape(_) | Error::Lockstep(_) => None,
            Error::Collective(e) => Some(e),
            Error::Tree(e) => Some(e),
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

/// `a * b`, or a shape error naming `what` when it overflows.
pub(crate) fn product(what: &str, dims: &[usize]) -> Result<usize, Error> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Shape(format!("{what}: {dims:?} overflows usize")))
}
