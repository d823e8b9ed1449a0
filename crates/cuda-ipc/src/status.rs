//! Turning the error record a kernel wrote into a typed [`Error`]: the decoder is
//! backend-neutral and lives in [`collective_core::protocol::status`].
use crate::driver::BACKEND;
use crate::memory::RECORD_WORDS;
use collective_core::Error;
use std::time::Duration;

/// The typed error for a nonzero record. `timeout` is the configured per-wait bound.
pub(crate) fn decode(w: &[u64; RECORD_WORDS], timeout: Duration) -> Error {
    collective_core::protocol::status::decode(w, timeout, BACKEND)
}
