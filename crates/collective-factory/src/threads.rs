//! Joining the construction threads of a thread group (one per rank: every rank's agreement is
//! collective, so each runs on its own thread).
use collective_core::Error;
use std::thread::ScopedJoinHandle;

/// Every rank's result in rank order; a thread that panicked is an error for its rank.
pub(crate) fn join_ranks<T>(handles: Vec<ScopedJoinHandle<'_, Result<T, Error>>>) -> Result<Vec<T>, Error> {
    handles
        .into_iter()
        .map(|h| {
            h.join().unwrap_or_else(|_| {
                Err(Error::Backend {
                    backend: "collective-factory",
                    detail: "a rank's construction thread panicked".into(),
                })
            })
        })
        .collect()
}
