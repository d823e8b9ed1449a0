//! `detcoll._detcoll`: the extension module under the pure-Python package `detcoll`. It holds
//! one rank's collective and makes raw calls on addresses the Python wrapper reads from the
//! tensors (DLPack, `__cuda_array_interface__`, `__array_interface__`); the wrapper owns the
//! tensor handling, this module the checks that need the Rust types and every call into the
//! factory, each with the GIL released.
use pyo3::prelude::*;

mod backend;
mod callback;
mod comm;
mod cuda;
mod errors;

#[pymodule]
fn _detcoll(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    comm::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
