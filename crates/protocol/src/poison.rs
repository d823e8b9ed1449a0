//! Sticky failure state.
use collective_core::Error;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Records `cause` whatever it is (the first cause wins): a failure found outside this
    /// backend, which a composite route reports to it (`Collective::abandon`).
    pub fn set(&self, cause: &str) {
        if let Ok(mut c) = self.cause.lock() {
            c.get_or_insert_with(|| cause.to_string());
        }
        self.poisoned.store(true, Ordering::Release);
    }
    /// Whether a failure was recorded.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }
}
