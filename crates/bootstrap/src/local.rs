//! In-process bootstrap: one [`LocalBootstrap`] per thread, sharing a Mutex + Condvar.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::deadline::{check_timeout, deadline, timeout_problem};
use crate::{Bootstrap, BootstrapError, DEFAULT_LOCAL_TIMEOUT};

const WHAT_EXCHANGE: &str = "join all_gather_bytes";
/// What a rank is told when the exchange it arrives at already failed because its peers timed
/// out waiting for it: the same culprit every rank reports, said so that the late rank does not
/// read its own rank as some peer's.
const WHAT_EXCHANGE_LATE: &str =
    "join all_gather_bytes before its peers gave up waiting (that rank is this one: it arrived after their timeout)";
/// How errors name the group's timeout.
const TIMEOUT_WHAT: &str = "the in-process bootstrap's timeout";

/// The first failure of a group; every rank waiting in (or arriving at) the failed exchange
/// reports it.
#[derive(Debug, Clone)]
enum Fault {
    Timeout { rank: usize, waited: Duration },
    Gone { rank: usize },
}

impl Fault {
    /// The error rank `me` reports for this failure: every rank names the same culprit; a
    /// timeout's culprit, arriving late, is told that the rank named is itself.
    fn to_error(&self, me: usize) -> BootstrapError {
        match *self {
            Fault::Timeout { rank, waited } => {
                let what = if rank == me { WHAT_EXCHANGE_LATE } else { WHAT_EXCHANGE };
                BootstrapError::PeerTimeout { rank, waited, what }
            }
            Fault::Gone { rank } => BootstrapError::PeerGone {
                rank,
                detail: "its LocalBootstrap was dropped before it joined the exchange (a collective over it \
                         releases it when it closes or fails)"
                    .into(),
            },
        }
    }
}

#[derive(Debug)]
struct State {
    /// Number of completed exchanges (the one in progress has this number).
    generation: u64,
    /// Contributions to the exchange in progress.
    slots: Vec<Option<Vec<u8>>>,
    arrived: usize,
    /// Result of exchange `generation - 1`, read by the ranks that were waiting for it. A new
    /// exchange cannot complete before all of them have read it (it needs their contribution).
    last_result: Arc<Vec<Vec<u8>>>,
    departed: Vec<bool>,
    fault: Option<Fault>,
}

#[derive(Debug)]
struct Shared {
    world: usize,
    timeout: Duration,
    /// Why `timeout` is unusable (zero, or above [`MAX_BOOTSTRAP_TIMEOUT`](crate::MAX_BOOTSTRAP_TIMEOUT)):
    /// every exchange then fails at once, on every rank alike, before anything is exchanged.
    invalid: Option<String>,
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent in a way that matters
        // more than the panic itself; keep going so the other ranks get errors, not panics.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug)]
struct Mine {
    /// Number of exchanges this rank completed.
    seq: u64,
    /// Set after this rank returned an error: later calls return `Closed`.
    failed: Option<String>,
}

/// In-process bootstrap: one per thread (rank), created together by [`LocalBootstrap::group`].
///
/// `local_rank`/`local_world_size` equal `rank`/`world_size`. Dropping one while others wait in
/// an exchange makes them fail with [`BootstrapError::PeerGone`] naming it; a rank that does not
/// arrive within the timeout makes them fail with [`BootstrapError::PeerTimeout`] naming the
/// lowest absent rank.
pub struct LocalBootstrap {
    rank: usize,
    shared: Arc<Shared>,
    mine: Mutex<Mine>,
}

impl fmt::Debug for LocalBootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBootstrap")
            .field("rank", &self.rank)
            .field("world_size", &self.shared.world)
            .field("timeout", &self.shared.timeout)
            .finish()
    }
}

impl LocalBootstrap {
    /// `world` bootstraps for `world` threads, rank `i` at index `i`, with the default
    /// per-exchange timeout [`DEFAULT_LOCAL_TIMEOUT`]. `world == 0` gives an empty vector.
    ///
    /// ```
    /// use detcoll_bootstrap::{Bootstrap, LocalBootstrap};
    /// let boots = LocalBootstrap::group(3);
    /// std::thread::scope(|s| for b in &boots { s.spawn(move || {
    ///     let all = b.all_gather_bytes(&[b.rank() as u8]).unwrap();
    ///     assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
    /// }); });
    /// ```
    pub fn group(world: usize) -> Vec<LocalBootstrap> {
        Self::group_with_timeout(world, DEFAULT_LOCAL_TIMEOUT)
    }

    /// Like [`LocalBootstrap::group`] with a per-exchange timeout (measured by each rank from
    /// its own arrival).
    ///
    /// The timeout must be more than zero and at most
    /// [`MAX_BOOTSTRAP_TIMEOUT`](crate::MAX_BOOTSTRAP_TIMEOUT) (one day); with any other value
    /// every exchange of every rank returns [`BootstrapError::InvalidConfig`] at once, before
    /// anything is exchanged. [`LocalBootstrap::try_group_with_timeout`] refuses it here instead.
    pub fn group_with_timeout(world: usize, timeout: Duration) -> Vec<LocalBootstrap> {
        let invalid = timeout_problem(TIMEOUT_WHAT, timeout);
        let shared = Arc::new(Shared {
            world,
            timeout,
            invalid,
            state: Mutex::new(State {
                generation: 0,
                slots: vec![None; world],
                arrived: 0,
                last_result: Arc::new(Vec::new()),
                departed: vec![false; world],
                fault: None,
            }),
            cv: Condvar::new(),
        });
        (0..world)
            .map(|rank| LocalBootstrap {
                rank,
                shared: Arc::clone(&shared),
                mine: Mutex::new(Mine { seq: 0, failed: None }),
            })
            .collect()
    }

    /// [`LocalBootstrap::group`] with `DETCOLL_BOOTSTRAP_TIMEOUT_MS` as the per-exchange
    /// timeout when it is set ([`env::timeout_from_env`](crate::env::timeout_from_env); a bad
    /// value is [`BootstrapError::BadEnv`]): the bound processes take from it too.
    pub fn group_from_env(world: usize) -> Result<Vec<LocalBootstrap>, BootstrapError> {
        let timeout = crate::env::timeout_from_env()?.unwrap_or(DEFAULT_LOCAL_TIMEOUT);
        Self::try_group_with_timeout(world, timeout)
    }

    /// [`LocalBootstrap::group_with_timeout`], refusing a timeout that is zero or above
    /// [`MAX_BOOTSTRAP_TIMEOUT`](crate::MAX_BOOTSTRAP_TIMEOUT) with
    /// [`BootstrapError::InvalidConfig`].
    pub fn try_group_with_timeout(world: usize, timeout: Duration) -> Result<Vec<LocalBootstrap>, BootstrapError> {
        check_timeout(TIMEOUT_WHAT, timeout)?;
        Ok(Self::group_with_timeout(world, timeout))
    }

    fn gather(&self, mine: &[u8], seq: u64) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let sh = &*self.shared;
        if let Some(detail) = &sh.invalid {
            return Err(BootstrapError::InvalidConfig { detail: detail.clone() });
        }
        let deadline = deadline(Instant::now(), sh.timeout);
        let mut st = sh.lock();
        if let Some(f) = &st.fault {
            return Err(f.to_error(self.rank));
        }
        if st.generation != seq {
            // Cannot happen: a rank cannot run ahead of an exchange it has not completed.
            return Err(BootstrapError::Protocol(format!(
                "rank {} is at exchange #{seq} but the group is at #{}",
                self.rank, st.generation
            )));
        }
        st.slots[self.rank] = Some(mine.to_vec());
        st.arrived += 1;
        if st.arrived == sh.world {
            let result: Vec<Vec<u8>> = st.slots.iter_mut().map(|s| s.take().unwrap_or_default()).collect();
            st.last_result = Arc::new(result.clone());
            st.arrived = 0;
            st.generation += 1;
            sh.cv.notify_all();
            return Ok(result);
        }
        loop {
            if st.generation > seq {
                return Ok(st.last_result.as_ref().clone());
            }
            if let Some(f) = &st.fault {
                return Err(f.to_error(self.rank));
            }
            if let Some(rank) = (0..sh.world).find(|&r| st.slots[r].is_none() && st.departed[r]) {
                let f = Fault::Gone { rank };
                let e = f.to_error(self.rank);
                st.fault = Some(f);
                sh.cv.notify_all();
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                let rank = (0..sh.world).find(|&r| st.slots[r].is_none()).unwrap_or(self.rank);
                let f = Fault::Timeout { rank, waited: sh.timeout };
                let e = f.to_error(self.rank);
                st.fault = Some(f);
                sh.cv.notify_all();
                return Err(e);
            }
            st = sh.cv.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Bootstrap for LocalBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.world
    }
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn local_world_size(&self) -> usize {
        self.shared.world
    }
    fn timeouts(&self) -> Option<(Duration, Duration)> {
        Some((self.shared.timeout, self.shared.timeout))
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let mut me = self.mine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reason) = &me.failed {
            return Err(BootstrapError::Closed { reason: reason.clone() });
        }
        match self.gather(mine, me.seq) {
            Ok(v) => {
                me.seq += 1;
                Ok(v)
            }
            Err(e) => {
                me.failed = Some(e.to_string());
                Err(e)
            }
        }
    }
}

impl Drop for LocalBootstrap {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.departed[self.rank] = true;
        self.shared.cv.notify_all();
    }
}
