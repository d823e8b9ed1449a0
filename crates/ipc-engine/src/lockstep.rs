//! Ranks that are threads sharing one GPU launch every call together.
//!
//! Why: ranks that share a device inside one process share its context — its hardware queues,
//! its staging for pageable copies, and the driver calls that wait for the device (freeing
//! memory, growing or trimming a stream-ordered pool, loading a module). A collective kernel
//! spins until every peer's kernel of the same call has arrived. So a rank that, between two
//! calls, makes such a blocking driver call — or enqueues its next call — while a peer has not
//! yet launched the current one can leave that peer's launch queued behind (or its thread
//! blocked behind) its own spinning kernel, which waits for that very peer until the timeout.
//! Users meet this with the plainest code (`clone_htod`, `alloc_zeros`, the collective,
//! `clone_dtoh`, per thread), so the engine carries the rule, not the user.
//!
//! [`Member::step`] makes each launch one step of all members (a call is one launch, or one per
//! chunk above the staging capacity): no member makes launch `k` until every member has arrived
//! at it (finished everything it enqueued or called before it), and no member goes on from
//! launch `k` until every member has made it. Between the two barriers a member only launches,
//! so every member's work before launch `k`, every member's launch `k` and every member's work
//! after it reach the device in that order — also in a hardware queue that several ranks'
//! streams share, where a peer's launch `k` behind this rank's launch `k + 1` (which waits on
//! the stream for this rank's launch `k`, which waits for that peer) would never start. Every wait is bounded by the
//! peer timeout; a member that is late, fails or closes breaks the lockstep, and every member's
//! waiting or later call fails with a typed error instead of hanging.
//!
//! The cost is two in-process barriers per launch (atomics, spinning then yielding) on ranks that
//! share a GPU in one process; ranks in their own processes (MPS too) or on their own GPUs have
//! no lockstep. Calls that fail validation never reach the lockstep, so a call that is invalid
//! on every rank leaves it aligned.
use collective_core::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a lockstep's waits are called in [`Error::PeerTimeout`].
const ARRIVE: &str = "reach the same collective call (ranks sharing a GPU in one process launch each call together)";
const LAUNCH: &str = "launch the same collective call (ranks sharing a GPU in one process launch each call together)";

/// How long a member spins (yielding) for its peers before it sleeps between checks, and for
/// how long it then sleeps: waits of thread ranks on one GPU are microseconds when every rank
/// calls at once; longer waits are host work of a peer, where a spinning thread would only
/// take a core from it.
const PARK_AFTER: Duration = Duration::from_millis(1);
const PARK_STEP: Duration = Duration::from_micros(50);

/// One counter on its own cache line (members spin on their peers' counters).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Line(AtomicU64);

/// Why a lockstep no longer steps.
#[derive(Debug, Clone)]
enum Broken {
    /// The member of this rank closed its handle.
    Closed { rank: usize },
    /// A member's wait timed out or its launch failed.
    Failed { cause: String },
}

/// The shared state of the members sharing one device.
#[derive(Debug)]
pub(crate) struct Lockstep {
    /// The global rank of every member, in member order.
    ranks: Vec<usize>,
    /// Calls each member has arrived at (`k + 1` once it arrived at call `k`).
    arrived: Vec<Line>,
    /// Calls each member has launched.
    launched: Vec<Line>,
    broken_flag: AtomicBool,
    broken: Mutex<Option<Broken>>,
}

/// One rank's place in a [`Lockstep`]. The call counter is the handle's: the handle's call
/// lock serialises its calls, so `calls` is only touched under it.
#[derive(Debug)]
pub(crate) struct Member {
    shared: Arc<Lockstep>,
    index: usize,
    calls: AtomicU64,
}

impl Lockstep {
    /// One member per entry of `ranks` (the global ranks sharing one device), in that order.
    pub(crate) fn members(ranks: Vec<usize>) -> Vec<Member> {
        let n = ranks.len();
        let shared = Arc::new(Lockstep {
            ranks,
            arrived: (0..n).map(|_| Line::default()).collect(),
            launched: (0..n).map(|_| Line::default()).collect(),
            broken_flag: AtomicBool::new(false),
            broken: Mutex::new(None),
        });
        (0..n).map(|index| Member { shared: shared.clone(), index, calls: AtomicU64::new(0) }).collect()
    }

    fn break_with(&self, why: Broken) {
        if let Ok(mut b) = self.broken.lock() {
            b.get_or_insert(why);
        }
        self.broken_flag.store(true, Ordering::Release);
    }

    /// The error a member gets once the lockstep is broken.
    fn broken_error(&self, me: usize, what: &'static str) -> Error {
        let why = self.broken.lock().ok().and_then(|b| b.clone());
        match why {
            Some(Broken::Closed { rank }) if rank != me => Error::PeerClosed { peer: rank, what },
            Some(Broken::Closed { .. }) => Error::Closed,
            Some(Broken::Failed { cause }) => Error::Poisoned { cause },
            None => Error::Poisoned { cause: "the lockstep of ranks sharing this GPU is broken".into() },
        }
    }

    /// Waits until every member's `counters` entry reaches `target`, bounded by `bound`.
    fn wait_all(
        &self,
        me: usize,
        counters: &[Line],
        target: u64,
        bound: Duration,
        what: &'static str,
    ) -> Result<(), Error> {
        let start = Instant::now();
        let mut spins = 0u32;
        let first_late = || counters.iter().position(|c| c.0.load(Ordering::Acquire) < target);
        loop {
            // The counters first: a member that closes (or fails) right after every member
            // launched — its last call done, its handle closed — has not broken this step, and a
            // launched call must not report an error. A break seen with `Acquire` makes every
            // counter stored before it visible, so the second look decides.
            let Some(late) = first_late() else { return Ok(()) };
            if self.broken_flag.load(Ordering::Acquire) {
                return match first_late() {
                    None => Ok(()),
                    Some(_) => Err(self.broken_error(me, what)),
                };
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                let waited = start.elapsed();
                if waited > bound {
                    let peer = self.ranks[late];
                    let e = Error::PeerTimeout { peer, what, waited: bound };
                    self.break_with(Broken::Failed { cause: e.to_string() });
                    return Err(e);
                }
                // Spin while a peer is about to arrive (microseconds: the common case); a peer
                // busy with host work between calls is waited for without burning a core.
                if waited > PARK_AFTER {
                    std::thread::sleep(PARK_STEP);
                } else {
                    std::thread::yield_now();
                }
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Member {
    /// Runs `launch` (this rank's next launch: a call, or one chunk of it) as one step of the
    /// lockstep: after every member arrived at it, before any member goes on from it. A failure
    /// of `launch` breaks the lockstep (the peers' kernels of this launch would wait in vain).
    pub(crate) fn step<T>(&self, bound: Duration, launch: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
        let s = &*self.shared;
        let me = s.ranks[self.index];
        let k = self.calls.fetch_add(1, Ordering::AcqRel) + 1;
        s.arrived[self.index].0.store(k, Ordering::Release);
        s.wait_all(me, &s.arrived, k, bound, ARRIVE)?;
        let out = launch();
        if let Err(e) = &out {
            // Not counted as launched: the peers waiting for it see the break instead.
            s.break_with(Broken::Failed { cause: format!("rank {me} could not launch its call: {e}") });
            return out;
        }
        s.launched[self.index].0.store(k, Ordering::Release);
        s.wait_all(me, &s.launched, k, bound, LAUNCH)?;
        out
    }

    /// This rank closed its handle: peers waiting for it (now or at a later call) get
    /// [`Error::PeerClosed`] naming it instead of waiting for the timeout.
    pub(crate) fn close(&self) {
        self.shared.break_with(Broken::Closed { rank: self.shared.ranks[self.index] });
    }

    /// This rank's handle was abandoned (`Collective::abandon`): it makes no further call, so
    /// peers waiting for it (now or at a later call) get [`Error::Poisoned`] naming it and
    /// `cause` instead of waiting for the timeout.
    pub(crate) fn abandon(&self, cause: &str) {
        let me = self.shared.ranks[self.index];
        self.shared.break_with(Broken::Failed { cause: format!("rank {me} stopped taking part: {cause}") });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(5);

    #[test]
    fn no_member_launches_before_all_arrived_nor_returns_before_all_launched() {
        // Each member logs (call, phase) events; the log proves the step order.
        let members = Lockstep::members(vec![0, 1, 2, 3]);
        let log = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for m in &members {
                let log = &log;
                s.spawn(move || {
                    for k in 0..200u64 {
                        log.lock().unwrap().push((k, 0u8)); // arrived (before the step)
                        m.step(BOUND, || {
                            log.lock().unwrap().push((k, 1u8)); // launching
                            Ok(())
                        })
                        .unwrap();
                        log.lock().unwrap().push((k, 2u8)); // returned
                    }
                });
            }
        });
        let log = log.into_inner().unwrap();
        for k in 0..200u64 {
            let pos = |phase: u8| log.iter().enumerate().filter(move |(_, e)| **e == (k, phase)).map(|(i, _)| i);
            let last_arrival = pos(0).max().unwrap();
            let first_launch = pos(1).min().unwrap();
            let last_launch = pos(1).max().unwrap();
            let first_return = pos(2).min().unwrap();
            assert!(last_arrival < first_launch, "call {k}: a member launched before every member arrived");
            assert!(last_launch < first_return, "call {k}: a member returned before every member launched");
        }
    }

    #[test]
    fn a_member_that_never_arrives_times_out_naming_its_rank_and_breaks_the_lockstep() {
        let members = Lockstep::members(vec![4, 6]);
        let t = Instant::now();
        let e = members[0].step(Duration::from_millis(100), || Ok(())).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(100));
        assert!(matches!(e, Error::PeerTimeout { peer: 6, .. }), "{e:?}");
        // Broken: the late member's own call fails at once instead of waiting.
        let t = Instant::now();
        let e = members[1].step(BOUND, || Ok(())).unwrap_err();
        assert!(matches!(e, Error::Poisoned { .. }), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_closed_member_fails_its_peers_with_peer_closed_at_once() {
        let members = Lockstep::members(vec![0, 1]);
        members[1].close();
        let t = Instant::now();
        let e = members[0].step(BOUND, || Ok(())).unwrap_err();
        assert!(matches!(e, Error::PeerClosed { peer: 1, .. }), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn an_abandoned_member_fails_its_peers_at_once_naming_it() {
        let members = Lockstep::members(vec![0, 3]);
        members[1].abandon("its data-parallel group failed");
        let t = Instant::now();
        match members[0].step(BOUND, || Ok(())) {
            Err(Error::Poisoned { cause }) => {
                assert!(cause.contains("rank 3") && cause.contains("data-parallel"), "{cause}")
            }
            other => panic!("expected Poisoned naming rank 3, got {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_member_closing_after_every_member_launched_does_not_fail_the_step() {
        // Member 1 launched call 1, saw member 0's launch, returned and closed its handle while
        // member 0 was still in its wait after the launch (seen on one H200: the launched call
        // reported `PeerClosed`). Member 0's step must return `Ok`: its call was launched.
        let members = Lockstep::members(vec![0, 1]);
        let s = &*members[0].shared;
        for m in &members {
            m.calls.store(1, Ordering::Relaxed);
            s.arrived[m.index].0.store(1, Ordering::Release);
            s.launched[m.index].0.store(1, Ordering::Release);
        }
        members[1].close();
        s.wait_all(0, &s.launched, 1, BOUND, LAUNCH).expect("every member launched: the step is done");
        // The next call finds the peer closed.
        let e = members[0].step(BOUND, || Ok(())).unwrap_err();
        assert!(matches!(e, Error::PeerClosed { peer: 1, .. }), "{e:?}");
    }

    #[test]
    fn a_failed_launch_fails_the_peers_waiting_for_it() {
        let members = Lockstep::members(vec![0, 1]);
        std::thread::scope(|s| {
            let a = s.spawn(|| members[0].step(BOUND, || Err::<(), _>(Error::Closed)));
            let b = s.spawn(|| members[1].step(BOUND, || Ok(())));
            assert!(matches!(a.join().unwrap(), Err(Error::Closed)));
            let e = b.join().unwrap().unwrap_err();
            assert!(matches!(&e, Error::Poisoned { cause } if cause.contains("rank 0 could not launch")), "{e:?}");
        });
    }
}
