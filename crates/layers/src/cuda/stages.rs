//! The stages of a forward and the hook called around each: [`StageEvents`] times them with
//! CUDA events, [`Lockstep`] keeps ranks that are threads sharing one context in call order.
use crate::Error;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, sys};
use std::sync::{Arc, Barrier};

/// One stage of a forward. The FFN runs `AllGather`, `Gemm1` (every leaf), `Activation`,
/// `Gemm2` (every leaf), `LeafFold`, `ReduceScatter`; the attention runs `AllGather` three
/// times (k, v, positions) and `Attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// An all_gather (FFN: the tokens; attention: k, v, positions).
    AllGather,
    /// The first GEMM (`x · W1`) of every leaf of the rank (the naive layer: of its shard).
    Gemm1,
    /// SiLU over the activations.
    Activation,
    /// The second GEMM (`act · W2`) of every leaf of the rank (the naive layer: of its shard).
    Gemm2,
    /// The balanced tree over the rank's leaf products.
    LeafFold,
    /// The reduce_scatter of the rank's partial sums.
    ReduceScatter,
    /// The attention kernel.
    Attention,
}

impl Stage {
    /// The stage's name: `"all_gather"`, `"gemm1"`, `"activation"`, `"gemm2"`, `"leaf_fold"`,
    /// `"reduce_scatter"`, `"attention"`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::AllGather => "all_gather",
            Stage::Gemm1 => "gemm1",
            Stage::Activation => "activation",
            Stage::Gemm2 => "gemm2",
            Stage::LeafFold => "leaf_fold",
            Stage::ReduceScatter => "reduce_scatter",
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

/// Keeps ranks that are threads sharing one CUDA context in call order: after every
/// `AllGather` and `ReduceScatter` is enqueued, waits on `barrier` (one party per rank), so
/// collective `k` of every rank is enqueued before collective `k + 1` of any (the rule of
/// `IpcCollective::group`). Only enqueues are ordered: nothing waits for the device.
#[derive(Debug, Clone, Copy)]
pub struct Lockstep<'a> {
    /// One party per rank of the group.
    pub barrier: &'a Barrier,
}

impl StageHook for Lockstep<'_> {
    fn after(&mut self, s: Stage, _stream: &Arc<CudaStream>) -> Result<(), Error> {
        if matches!(s, Stage::AllGather | Stage::ReduceScatter) {
            self.barrier.wait();
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
