//! Errors of the NCCL layers, and how they become [`collective_core::Error`].
use crate::sys::{LoadError, ncclResult_t};
use std::time::Duration;

impl From<LoadError> for NcclError {
    fn from(e: LoadError) -> Self {
        NcclError::LibraryMissing { library: e.library, detail: e.detail }
    }
}

/// Name used in [`collective_core::Error::Backend`].
pub const BACKEND: &str = "ccl-transport";

/// What the NCCL/RCCL layers (loading, calls, communicators) fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// No candidate library could be opened, or one lacks a required symbol.
    #[error("{library} could not be loaded: {detail}")]
    LibraryMissing { library: String, detail: String },
    /// A call returned an error code; `message` is `ncclGetErrorString` (and
    /// `ncclGetLastError` when the library has it).
    #[error("{call} failed with {code}: {message}")]
    Call { call: &'static str, code: ncclResult_t, message: String },
    /// A call stayed `ncclInProgress` (or a stream did not finish) past its bound; the
    /// communicator was aborted so nothing keeps waiting on it.
    #[error("{call} did not complete within {waited:?}; the NCCL communicator was aborted")]
    Timeout { call: &'static str, waited: Duration },
    /// The watchdog saw a call start on the device and not complete within its bound (a peer
    /// died, is stuck, or made another call); the communicator was aborted, which stops its
    /// kernels. `seq` counts this rank's calls that enqueued device work, from 1 (the same
    /// count on every rank, which all make the same calls).
    #[error(
        "{call} (transport call {seq} of this rank) started on the device but did not complete within {bound:?}: a peer died, is stuck, or made another call; the transport watchdog aborted the NCCL communicator"
    )]
    Watchdog { call: &'static str, seq: u64, bound: Duration },
    /// The communicator was aborted or destroyed earlier.
    #[error("the NCCL communicator is no longer usable: {0}")]
    Unusable(&'static str),
    /// An argument NCCL cannot represent (e.g. more ranks than a C `int`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl From<NcclError> for collective_core::Error {
    fn from(e: NcclError) -> Self {
        match e {
            NcclError::LibraryMissing { library, detail } => collective_core::Error::LibraryMissing { library, detail },
            NcclError::InvalidArgument(detail) => collective_core::Error::InvalidConfig { detail },
            call @ NcclError::Call { .. } => {
                let name = match &call {
                    NcclError::Call { call, .. } => (*call).to_string(),
                    _ => unreachable!(),
                };
                collective_core::Error::Vendor { backend: BACKEND, call: name, source: Box::new(call) }
            }
            other => collective_core::Error::Backend { backend: BACKEND, detail: other.to_string() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_keeps_the_nccl_error_as_source() {
        use std::error::Error as _;
        let e: collective_core::Error =
            NcclError::Call { call: "ncclAllGather", code: ncclResult_t::ncclUnhandledCudaError, message: "m".into() }
                .into();
        assert!(matches!(&e, collective_core::Error::Vendor { call, .. } if call == "ncclAllGather"), "{e:?}");
        let src = e.source().expect("a source").downcast_ref::<NcclError>().expect("the NCCL error");
        assert!(matches!(src, NcclError::Call { call: "ncclAllGather", .. }));
        assert!(e.poisons());
    }

    #[test]
    fn library_missing_maps_to_the_core_variant() {
        let e: collective_core::Error = NcclError::LibraryMissing { library: "x".into(), detail: "y".into() }.into();
        assert!(matches!(e, collective_core::Error::LibraryMissing { .. }));
        assert!(!e.poisons());
    }

    #[test]
    fn call_failures_and_timeouts_poison() {
        let call: collective_core::Error =
            NcclError::Call { call: "ncclAllGather", code: ncclResult_t::ncclRemoteError, message: "peer gone".into() }
                .into();
        assert!(call.poisons());
        assert!(call.to_string().contains("ncclRemoteError(6)"), "{call}");
        let t: collective_core::Error =
            NcclError::Timeout { call: "ncclGroupEnd", waited: Duration::from_secs(1) }.into();
        assert!(t.poisons());
    }
}
