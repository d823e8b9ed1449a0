//! Bounds of the bootstrap's timeouts, and deadlines computed without overflow.
//!
//! Every bootstrap timeout (TCP connect and exchange, in-process exchange, `split`'s) is at most
//! [`MAX_BOOTSTRAP_TIMEOUT`], like the protocol's bounds (`collective_core::MAX_TIMEOUT`):
//! a longer bound is indistinguishable from a hang, and `Instant::now() + Duration::MAX`
//! panics ("overflow when adding duration to instant"). Deadlines are computed with
//! [`deadline`], which never panics.

use std::time::{Duration, Instant};

use crate::BootstrapError;

/// The longest bootstrap timeout accepted: one day (= `collective_core::MAX_TIMEOUT`, which
/// checks that they are equal).
pub const MAX_BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Whether `timeout` is a usable bootstrap bound: more than zero and at most
/// [`MAX_BOOTSTRAP_TIMEOUT`]; otherwise [`BootstrapError::InvalidConfig`] naming `what` (e.g.
/// "split exchange_timeout").
pub(crate) fn check_timeout(what: &str, timeout: Duration) -> Result<(), BootstrapError> {
    match timeout_problem(what, timeout) {
        Some(detail) => Err(BootstrapError::InvalidConfig { detail }),
        None => Ok(()),
    }
}

/// What is wrong with `timeout` as a bootstrap bound (see [`check_timeout`]), if anything.
pub(crate) fn timeout_problem(what: &str, timeout: Duration) -> Option<String> {
    (timeout.is_zero() || timeout > MAX_BOOTSTRAP_TIMEOUT)
        .then(|| format!("{what} is {timeout:?}: expected more than 0 and at most {MAX_BOOTSTRAP_TIMEOUT:?}"))
}

/// `start + timeout`, without panicking: `timeout` is first capped at [`MAX_BOOTSTRAP_TIMEOUT`]
/// (a checked timeout is never changed by the cap). Should even that not be representable,
/// the deadline is `start`: the wait ends at once (fail closed), it never becomes unbounded.
pub(crate) fn deadline(start: Instant, timeout: Duration) -> Instant {
    start.checked_add(timeout.min(MAX_BOOTSTRAP_TIMEOUT)).unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_bounded_and_deadlines_never_overflow() {
        assert!(check_timeout("t", Duration::from_millis(1)).is_ok());
        assert!(check_timeout("t", MAX_BOOTSTRAP_TIMEOUT).is_ok());
        for bad in [Duration::ZERO, MAX_BOOTSTRAP_TIMEOUT + Duration::from_nanos(1), Duration::MAX] {
            match check_timeout("split exchange_timeout", bad) {
                Err(BootstrapError::InvalidConfig { detail }) => {
                    assert!(detail.contains("split exchange_timeout") && detail.contains("86400s"), "{detail}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let now = Instant::now();
        assert_eq!(deadline(now, Duration::from_secs(3)), now + Duration::from_secs(3));
        assert_eq!(deadline(now, Duration::MAX), now + MAX_BOOTSTRAP_TIMEOUT);
    }
}
