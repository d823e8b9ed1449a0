//! Which host a rank runs on: the bootstrap's host identity, with collective-core's error type.
use crate::Error;
use crate::bootstrap::BootstrapError;

/// `hostname/boot-id`: equal for two processes exactly when they run on the same booted host
/// ([`bootstrap::host_identity`](crate::bootstrap::host_identity), which `DETCOLL_HOST_ID`
/// overrides). An empty or non-UTF-8 `DETCOLL_HOST_ID`, or one with a control character, is
/// [`Error::InvalidConfig`] naming it.
pub fn host_identity() -> Result<String, Error> {
    crate::bootstrap::host_identity().map_err(|e| match e {
        BootstrapError::InvalidConfig { detail } => Error::InvalidConfig { detail },
        other => Error::from(other),
    })
}
