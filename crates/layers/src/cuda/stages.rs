//! The stages of a forward and the hook called around each: [`StageEvents`] times them with
//! CUDA events, [`Lockstep`] keeps ranks that are threads sharing one context in call order.
use crate::Error;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, sys};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One stage of a forward. The FFN runs `AllGather`, `Gemm1` (every leaf), `Activation`,
/// `Gemm2` (every leaf), `LeafFold`, `ReduceScatter`; the attention runs `AllGather` three
/// times (k, v, positions) and `Attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// An all_gather (FFN: the tokens; attention: k, v, positions).
    AllGather,
    /// The first GEMM (`x · W1`) of every leaf of the rank (the naive layer: of its shard); the
    /// gated FFN's up GEMM (`x · W3`) of each leaf too.
    Gemm1,
    /// SiLU over the activations (the gated FFN: SiLU of the gate times up).
    Activation,
    /// The second GEMM (`act · W2`) of every leaf of the rank (the naive layer: of its shard).
    Gemm2,
    /// The balanced tree over the rank's leaf products.
    LeafFold,
    /// The reduce_scatter of the rank's partial sums.
    ReduceScatter,
    /// The all_reduce of the rank's partial sums fused with the residual add and the next
    /// RMSNorm (the decoder tail, `CudaFfnShard::forward_residual_rmsnorm`).
    AllReduceNorm,
    /// The attention kernel.
    Attention,
}

impl Stage {
    /// The stage's name: `"all_gather"`, `"gemm1"`, `"activation"`, `"gemm2"`, `"leaf_fold"`,
    /// `"reduce_scatter"`, `"all_reduce_residual_rmsnorm"`, `"attention"`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::AllGather => "all_gather",
            Stage::Gemm1 => "gemm1",
            Stage::Activation => "activation",
            Stage::Gemm2 => "gemm2",
            Stage::LeafFold => "leaf_fold",
            Stage::ReduceScatter => "reduce_scatter",
            Stage::AllReduceNorm => "all_reduce_residual_rmsnorm",
            Stage::Attention => "attention",
        }
    }
}

/// Called on the host around every stage of a forward, with the stream the stage is enqueued
/// on: `before` just before its first enqueue, `after` just after its last. An error stops the
/// forward and is returned by it.
pub trait StageHook {
    /// Before stage `_s` is enqueued on `_stream`.
    fn before(&mut self, _s: Stage, _stream: &Arc<CudaStream>) -> Result<(), Error> {
        Ok(())
    }
    /// After stage `_s` was enqueued on `_stream`.
    fn after(&mut self, _s: Stage, _stream: &Arc<CudaStream>) -> Result<(), Error> {
        Ok(())
    }
}

/// No hook.
impl StageHook for () {}

/// A borrowed hook (so that a pair can combine hooks the caller keeps, e.g.
/// `&mut (&mut lockstep, &mut events)`).
impl<H: StageHook + ?Sized> StageHook for &mut H {
    fn before(&mut self, s: Stage, stream: &Arc<CudaStream>) -> Result<(), Error> {
        (**self).before(s, stream)
    }
    fn after(&mut self, s: Stage, stream: &Arc<CudaStream>) -> Result<(), Error> {
        (**self).after(s, stream)
    }
}

/// Both hooks, `A` first (in `before` and in `after`).
impl<A: StageHook, B: StageHook> StageHook for (A, B) {
    fn before(&mut self, s: Stage, stream: &Arc<CudaStream>) -> Result<(), Error> {
        self.0.before(s, stream)?;
        self.1.before(s, stream)
    }
    fn after(&mut self, s: Stage, stream: &Arc<CudaStream>) -> Result<(), Error> {
        self.0.after(s, stream)?;
        self.1.after(s, stream)
    }
}

/// A barrier of the ranks of one process that cannot hang: [`Rendezvous::wait`] fails after
/// the timeout, and at once for every party after one of them failed ([`Rendezvous::poison`],
/// or a wait that timed out). A rank whose collective failed (a peer timed out, a shape it
/// was not given) would otherwise leave its peers waiting for it forever.
#[derive(Debug)]
pub struct Rendezvous {
    parties: usize,
    timeout: Duration,
    state: Mutex<RendezvousState>,
    met: Condvar,
}

#[derive(Debug, Default)]
struct RendezvousState {
    arrived: usize,
    generation: u64,
    failed: Option<String>,
}

impl Rendezvous {
    /// A rendezvous of `parties` threads; a wait gives up after `timeout`.
    pub fn new(parties: usize, timeout: Duration) -> Self {
        Rendezvous { parties, timeout, state: Mutex::default(), met: Condvar::new() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RendezvousState> {
        // A party that panicked holding the lock left consistent counters (every update is
        // one assignment); the others go on and see `failed` if it poisoned the rendezvous.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every party has called `wait` (the same number of times), or fails: the
    /// rendezvous was poisoned, or the others did not come within the timeout (which poisons
    /// it for everyone).
    pub fn wait(&self) -> Result<(), Error> {
        let mut s = self.state();
        if let Some(why) = &s.failed {
            return Err(Error::Lockstep(why.clone()));
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.parties {
            s.arrived = 0;
            s.generation += 1;
            self.met.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        while s.generation == generation && s.failed.is_none() {
            let now = Instant::now();
            if now >= deadline {
                let why = format!(
                    "{} of {} ranks did not reach the rendezvous within {:?}",
                    self.parties - s.arrived,
                    self.parties,
                    self.timeout
                );
                s.failed = Some(why.clone());
                self.met.notify_all();
                return Err(Error::Lockstep(why));
            }
            s = self.met.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        match &s.failed {
            Some(why) if s.generation == generation => Err(Error::Lockstep(why.clone())),
            _ => Ok(()),
        }
    }

    /// Marks the rendezvous failed (`why`): every party waiting now or later gets an error.
    /// A rank calls it when it gives up, so that its peers do not wait for it.
    pub fn poison(&self, why: &str) {
        let mut s = self.state();
        if s.failed.is_none() {
            s.failed = Some(why.to_owned());
        }
        self.met.notify_all();
    }
}

/// Keeps ranks that are threads sharing one CUDA context in call order: after every
/// collective stage (`AllGather`, `ReduceScatter`, `AllReduceNorm`) is enqueued, waits on
/// `barrier` (one party per rank), so collective `k` of every rank is enqueued before
/// collective `k + 1` of any (the rule of `IpcCollective::group`). Only enqueues are ordered:
/// nothing waits for the device. A rank that fails should [`Rendezvous::poison`] it, so that its
/// peers fail instead of waiting.
#[derive(Debug, Clone, Copy)]
pub struct Lockstep<'a> {
    /// One party per rank of the group.
    pub barrier: &'a Rendezvous,
}

impl StageHook for Lockstep<'_> {
    fn after(&mut self, s: Stage, _stream: &Arc<CudaStream>) -> Result<(), Error> {
        if matches!(s, Stage::AllGather | Stage::ReduceScatter | Stage::AllReduceNorm) {
            self.barrier.wait()?;
        }
        Ok(())
    }
}

/// Records a pair of CUDA events around every stage invocation, to time the stages on the
/// device. The events are created up front ([`StageEvents::new`]), so recording allocates
/// nothing and works inside graph capture and while peers have collectives in flight.
#[derive(Debug)]
pub struct StageEvents {
    events: Vec<(CudaEvent, CudaEvent)>,
    records: Vec<Stage>,
    open: Option<Stage>,
}

impl StageEvents {
    /// Room for `capacity` stage invocations (an FFN forward has 6, an attention forward 4):
    /// `2 × capacity` timing events of `ctx`. A further invocation is an error until
    /// [`StageEvents::reset`].
    pub fn new(ctx: &Arc<CudaContext>, capacity: usize) -> Result<Self, Error> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let events = (0..capacity)
            .map(|_| Ok((ctx.new_event(flags)?, ctx.new_event(flags)?)))
            .collect::<Result<Vec<_>, cudarc::driver::DriverError>>()
            .map_err(super::driver("cuEventCreate"))?;
        Ok(StageEvents { events, records: Vec::with_capacity(capacity), open: None })
    }

    /// Forgets every record (the events are reused).
    pub fn reset(&mut self) {
        self.records.clear();
        self.open = None;
    }

    /// The stage invocations recorded since the last reset, in order.
    pub fn records(&self) -> &[Stage] {
        &self.records
    }

    /// Waits for the recorded events and sums the milliseconds of each stage over its
    /// invocations, in the order stages were first seen.
    pub fn totals_ms(&self) -> Result<Vec<(Stage, f64)>, Error> {
        let mut totals: Vec<(Stage, f64)> = Vec::new();
        for (s, (start, end)) in self.records.iter().zip(&self.events) {
            let ms = f64::from(start.elapsed_ms(end).map_err(super::driver("cuEventElapsedTime"))?);
            match totals.iter_mut().find(|(t, _)| t == s) {
                Some((_, sum)) => *sum += ms,
                None => totals.push((*s, ms)),
            }
        }
        Ok(totals)
    }
}

impl StageHook for StageEvents {
    fn before(&mut self, s: Stage, stream: &Arc<CudaStream>) -> Result<(), Error> {
        let i = self.records.len();
        let Some((start, _)) = self.events.get(i) else {
            return Err(Error::Shape(format!("StageEvents: more than its capacity of {i} stage invocations")));
        };
        start.record(stream).map_err(super::driver("cuEventRecord"))?;
        self.open = Some(s);
        Ok(())
    }

    fn after(&mut self, s: Stage, stream: &Arc<CudaStream>) -> Result<(), Error> {
        if self.open != Some(s) {
            return Err(Error::Shape(format!("StageEvents: `after({})` without its `before`", s.name())));
        }
        let i = self.records.len();
        self.events[i].1.record(stream).map_err(super::driver("cuEventRecord"))?;
        self.records.push(s);
        self.open = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parties_meet_again_and_again() {
        let r = Rendezvous::new(4, Duration::from_secs(10));
        let met: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4).map(|_| s.spawn(|| (0..100).filter(|_| r.wait().is_ok()).count())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(met, [100; 4]);
    }

    #[test]
    fn a_missing_party_is_an_error_within_the_timeout_for_everyone_then_at_once() {
        let r = Rendezvous::new(3, Duration::from_millis(200));
        let t = Instant::now();
        let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2).map(|_| s.spawn(|| r.wait())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        for res in results {
            assert!(matches!(&res, Err(Error::Lockstep(why)) if why.contains("did not reach")), "{res:?}");
        }
        // Poisoned for good: the late party fails at once too.
        let t = Instant::now();
        assert!(matches!(r.wait(), Err(Error::Lockstep(_))));
        assert!(t.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn a_poisoned_rendezvous_releases_its_waiters_at_once() {
        let r = Rendezvous::new(2, Duration::from_secs(30));
        let t = Instant::now();
        let res = std::thread::scope(|s| {
            let waiter = s.spawn(|| r.wait());
            std::thread::sleep(Duration::from_millis(50));
            r.poison("rank 1 failed");
            waiter.join().unwrap()
        });
        assert!(matches!(&res, Err(Error::Lockstep(why)) if why == "rank 1 failed"), "{res:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
