//! The bounds on every wait for a peer: user vocabulary (a collective's configuration names
//! them), read by every backend and by the protocol.
use crate::Error;
use std::time::Duration;

/// Bounds on every wait of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// How long a rank waits for a peer's flag within one call.
    pub peer: Duration,
    /// How long close waits for every peer's acknowledgement.
    pub close: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { peer: Duration::from_secs(10), close: Duration::from_secs(10) }
    }
}

/// `DETCOLL_TIMEOUT_MS`: both protocol bounds ([`Timeouts::peer`], [`Timeouts::close`]).
pub const TIMEOUT_ENV: &str = "DETCOLL_TIMEOUT_MS";

/// The largest bound `DETCOLL_TIMEOUT_MS` accepts: one day. Longer bounds are indistinguishable
/// from a hang for every user, and the kernels carry the bound in nanoseconds.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
// The bootstrap's bound is the same day (its crate cannot name this one).
const _: () = assert!(MAX_TIMEOUT.as_nanos() == crate::bootstrap::MAX_BOOTSTRAP_TIMEOUT.as_nanos());

impl Timeouts {
    /// The defaults, overridden by `DETCOLL_TIMEOUT_MS` (both bounds) when it is set.
    ///
    /// A value that is not an integer in `1..=86_400_000` milliseconds is
    /// [`Error::InvalidConfig`] naming the variable: a typo must not silently become the default,
    /// and `0` would make every wait time out at once.
    pub fn from_env() -> Result<Self, Error> {
        Self::from_value(std::env::var_os(TIMEOUT_ENV).map(|v| v.to_string_lossy().into_owned()).as_deref())
    }

    /// [`Timeouts::from_env`] over an explicit value (`None` = unset). Pure: for tests.
    pub fn from_value(value: Option<&str>) -> Result<Self, Error> {
        let Some(raw) = value else { return Ok(Timeouts::default()) };
        let ms = crate::env::parse_u64_in(TIMEOUT_ENV, raw, 1, MAX_TIMEOUT.as_millis() as u64, "milliseconds")?;
        let d = Duration::from_millis(ms);
        Ok(Timeouts { peer: d, close: d })
    }

    /// Checks that both bounds are usable (non-zero, at most [`MAX_TIMEOUT`]).
    pub fn check(&self) -> Result<(), Error> {
        for (name, d) in [("peer", self.peer), ("close", self.close)] {
            if d.is_zero() || d > MAX_TIMEOUT {
                return Err(Error::InvalidConfig {
                    detail: format!("timeouts.{name} is {d:?}: expected more than 0 and at most {MAX_TIMEOUT:?}"),
                });
            }
        }
        Ok(())
    }

    /// The bounds as words every rank must agree on (nanoseconds, saturating).
    pub fn agreement_words(&self) -> [u64; 2] {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        [ns(self.peer), ns(self.close)]
    }

    /// `explicit` when the caller chose bounds, else [`Timeouts::from_env`]; checked.
    pub fn resolve(explicit: Option<Timeouts>) -> Result<Timeouts, Error> {
        let t = match explicit {
            Some(t) => t,
            None => Timeouts::from_env()?,
        };
        t.check()?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_values() {
        assert_eq!(Timeouts::from_value(None).unwrap(), Timeouts::default());
        let t = Timeouts::from_value(Some(" 250 ")).unwrap();
        assert_eq!((t.peer, t.close), (Duration::from_millis(250), Duration::from_millis(250)));
        for bad in ["abc", "0", "-1", "", "1.5", "86400001", "99999999999999999999999"] {
            match Timeouts::from_value(Some(bad)) {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(TIMEOUT_ENV), "{detail}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(Timeouts { peer: Duration::ZERO, close: Duration::from_secs(1) }.check().is_err());
        assert!(Timeouts::resolve(Some(Timeouts { peer: Duration::from_secs(1), close: Duration::ZERO })).is_err());
    }
}
