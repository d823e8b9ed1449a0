//! A `Bootstrap` whose exchange is a Python callable: the handles travel through the process
//! group the job already has (`torch.distributed.all_gather_object` on the caller's group), so
//! no second port and no second rendezvous.
use collective_factory::bootstrap::{Bootstrap, BootstrapError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Rank layout plus `gather(bytes) -> list[bytes]` (every rank's bytes in group-rank order).
#[derive(Debug)]
pub struct PyBootstrap {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub local_world: usize,
    pub gather: Py<PyAny>,
}

impl Bootstrap for PyBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_world_size(&self) -> usize {
        self.local_world
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        // Called from construction, which runs with the GIL released: take it back for the
        // exchange only.
        // `try_attach`: at interpreter shutdown there is no group to call (an error, not a panic).
        let got: Result<Vec<Vec<u8>>, String> = Python::try_attach(|py| {
            let out = self.gather.call1(py, (PyBytes::new(py, mine),)).map_err(|e| e.to_string())?;
            out.extract::<Vec<Vec<u8>>>(py).map_err(|e| format!("the gather callable must return a list of bytes: {e}"))
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".into()));
        let all = got.map_err(|e| BootstrapError::Protocol(format!("Python group all_gather failed: {e}")))?;
        if all.len() != self.world {
            return Err(BootstrapError::Protocol(format!(
                "Python group all_gather returned {} entries for a world of {}",
                all.len(),
                self.world
            )));
        }
        Ok(all)
    }
}
