//! Sticky failure state and wait bounds.
use crate::Error;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Once a protocol step fails, the shared state is unknown: every later call must fail too.
#[derive(Debug, Default)]
pub struct Poison {
    poisoned: AtomicBool,
    cause: Mutex<Option<String>>,
}

impl Poison {
    /// `Ok` while healthy; the recorded cause otherwise. One relaxed load on the hot path.
    #[inline]
    pub fn check(&self) -> Result<(), Error> {
        if !self.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        let cause = self.cause.lock().map(|c| c.clone()).unwrap_or_default().unwrap_or_default();
        Err(Error::Poisoned { cause })
    }
    /// Records `err` as the cause (the first cause wins) when it poisons, and returns it.
    pub fn record(&self, err: Error) -> Error {
        if err.poisons() {
            if let Ok(mut c) = self.cause.lock() {
                c.get_or_insert_with(|| err.to_string());
            }
            self.poisoned.store(true, Ordering::Release);
        }
        err
    }
    /// Whether a failure was recorded.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }
}

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

impl Timeouts {
    /// Defaults, overridden by `DETCOLL_TIMEOUT_MS` (both bounds) when set to a number.
    pub fn from_env() -> Self {
        let mut t = Timeouts::default();
        if let Some(ms) = std::env::var("DETCOLL_TIMEOUT_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
            t.peer = Duration::from_millis(ms);
            t.close = Duration::from_millis(ms);
        }
        t
    }
}
