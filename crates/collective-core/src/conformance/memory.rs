//! A trivial in-memory backend: every call all-gathers the inputs through a
//! [`LocalBootstrap`] and evaluates `fixed-tree` on the host.
//!
//! It exists to test the suite itself: [`Flaw`]s make it deliberately wrong, and the suite must
//! fail every flawed flavour (see this crate's `tests/conformance.rs`).
use super::data::reference_reduce;
use super::harness::{HostRank, TestBackend, run_owned};
use crate::bootstrap::{Bootstrap, LocalBootstrap};
use crate::{Capabilities, Collective, DType, Error, Io, Op, Route, validate, validate_many};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A deliberate defect, to prove the suite catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// Correct.
    None,
    /// Reduces left to right, `((r0+r1)+r2)+r3`, instead of the balanced tree.
    LeftFold,
    /// Accumulates f16/bf16 in f32 and rounds once.
    WideAccumulate,
    /// Rank `r` of a reduce_scatter receives shard `r + 1`.
    WrongShard,
    /// Writes one element past the end of the output.
    OverrunsOutput,
}

/// The in-memory collective of one rank.
#[derive(Debug)]
pub struct MemoryCollective {
    boot: Box<dyn Bootstrap>,
    capacity: usize,
    flaw: Flaw,
    closed: AtomicBool,
}

fn read_bytes(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: `addr..addr+len` is a validated host view the caller lends for this call.
    unsafe { core::slice::from_raw_parts(addr as *const u8, len).to_vec() }
}

fn write_bytes(addr: u64, data: &[u8]) {
    // SAFETY: `addr..addr+len` is a validated, uniquely borrowed host view (or, for
    // `Flaw::OverrunsOutput`, one element past it inside the suite's guard band).
    unsafe { core::ptr::copy(data.as_ptr(), addr as *mut u8, data.len()) }
}

impl MemoryCollective {
    /// One rank over `boot` (any bootstrap: threads, or processes over TCP — then it is a
    /// working host transport, which the factory's tests use as a test transport).
    pub fn new(boot: impl Bootstrap + 'static, capacity: usize, flaw: Flaw) -> Self {
        MemoryCollective { boot: Box::new(boot), capacity, flaw, closed: AtomicBool::new(false) }
    }

    fn reduce(&self, ranks: &[Vec<u8>], dtype: DType) -> Vec<u8> {
        match self.flaw {
            Flaw::LeftFold | Flaw::WideAccumulate if ranks.len() > 2 => {
                let n = ranks[0].len() / dtype.size();
                let mut out = Vec::with_capacity(ranks[0].len());
                for i in 0..n {
                    let vals: Vec<f64> = ranks.iter().map(|r| widen(r, dtype, i)).collect();
                    let v = if self.flaw == Flaw::LeftFold {
                        vals[1..].iter().fold(vals[0], |acc, &x| narrow(narrow(acc, dtype) + narrow(x, dtype), dtype))
                    } else {
                        narrow(vals.iter().sum::<f64>(), dtype)
                    };
                    out.extend_from_slice(&to_bytes(v, dtype));
                }
                out
            }
            _ => reference_reduce(ranks, dtype),
        }
    }

    fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        Ok(self.boot.all_gather_bytes(mine)?)
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) { Err(Error::Closed) } else { Ok(()) }
    }

    fn write_out(&self, dst: u64, data: &[u8], dtype: DType) {
        write_bytes(dst, data);
        if self.flaw == Flaw::OverrunsOutput && !data.is_empty() {
            write_bytes(dst + data.len() as u64, &vec![0; dtype.size()]);
        }
    }

    fn single(&self, op: Op, io: Io<'_>) -> Result<(), Error> {
        self.check_open()?;
        let (rank, world) = (self.boot.rank(), self.boot.world_size());
        let c = validate(op, &io, rank, world, self.capacity)?;
        let all = self.exchange(&read_bytes(c.src, c.bytes_in()))?;
        let out = match op {
            Op::AllGather => all.concat(),
            Op::AllReduce => self.reduce(&all, c.dtype),
            _ => {
                let full = self.reduce(&all, c.dtype);
                let shard = c.bytes_out();
                let q = if self.flaw == Flaw::WrongShard { (rank + 1) % world } else { rank };
                full[q * shard..(q + 1) * shard].to_vec()
            }
        };
        self.write_out(c.dst, &out, c.dtype);
        Ok(())
    }
}

fn widen(bytes: &[u8], dtype: DType, i: usize) -> f64 {
    let b = super::data::bits_at(bytes, dtype, i);
    match dtype {
        DType::F32 => f64::from(f32::from_bits(b)),
        DType::F16 => half::f16::from_bits(b as u16).to_f64(),
        _ => half::bf16::from_bits(b as u16).to_f64(),
    }
}

fn narrow(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f64::from(v as f32),
        DType::F16 => half::f16::from_f64(v).to_f64(),
        _ => half::bf16::from_f64(v).to_f64(),
    }
}

fn to_bytes(v: f64, dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => (v as f32).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
        _ => half::bf16::from_f64(v).to_le_bytes().to_vec(),
    }
}

impl Collective for MemoryCollective {
    type Stream = ();
    fn rank(&self) -> usize {
        self.boot.rank()
    }
    fn world_size(&self) -> usize {
        self.boot.world_size()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::strict(self.capacity, false)
    }
    fn route(&self, _op: Op, _bytes: usize) -> Route {
        if self.world_size() == 1 { Route::Local } else { Route::Transport }
    }
    fn host_memory(&self) -> bool {
        true
    }
    fn all_reduce(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.single(Op::AllReduce, io)
    }
    fn all_gather(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.single(Op::AllGather, io)
    }
    fn reduce_scatter(&self, io: Io<'_>, _: &()) -> Result<(), Error> {
        self.single(Op::ReduceScatter, io)
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], _: &()) -> Result<(), Error> {
        self.check_open()?;
        let (rank, world) = (self.boot.rank(), self.boot.world_size());
        let (calls, _sig) = validate_many(lanes, rank, world, self.capacity)?;
        // One exchange for every lane (one generation), one tree per lane.
        let mut mine = Vec::new();
        for l in &calls {
            mine.extend(read_bytes(l.call.src, l.call.bytes_in()));
        }
        let all = self.exchange(&mine)?;
        let mut outs = Vec::with_capacity(calls.len());
        for l in &calls {
            let size = l.call.dtype.size();
            let lane: Vec<Vec<u8>> = all
                .iter()
                .map(|r| r[l.staging_offset * size..l.staging_offset * size + l.call.bytes_in()].to_vec())
                .collect();
            let full = self.reduce(&lane, l.call.dtype);
            let shard = l.call.bytes_out();
            let q = if self.flaw == Flaw::WrongShard { (rank + 1) % world } else { rank };
            outs.push(full[q * shard..(q + 1) * shard].to_vec());
        }
        for (l, out) in calls.iter().zip(outs) {
            self.write_out(l.call.dst, &out, l.call.dtype);
        }
        Ok(())
    }
    fn check(&self) -> Result<(), Error> {
        self.check_open()
    }
    fn synchronize(&self, _: &()) -> Result<(), Error> {
        self.check_open()
    }
    fn close(&self) -> Result<(), Error> {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.boot.barrier()?;
        }
        Ok(())
    }
}

/// The suite's view of [`MemoryCollective`] worlds.
#[derive(Debug, Clone, Copy)]
pub struct MemoryBackend {
    pub flaw: Flaw,
}

impl TestBackend for MemoryBackend {
    type Rank = HostRank<MemoryCollective>;
    fn name(&self) -> String {
        format!("in-memory backend (flaw: {:?})", self.flaw)
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let ranks = LocalBootstrap::group_with_timeout(world, Duration::from_secs(5))
            .into_iter()
            .map(|boot| HostRank { comm: MemoryCollective::new(boot, capacity, self.flaw) })
            .collect();
        run_owned(ranks, case, |rank| rank.comm.close().map_err(|e| e.to_string()))
    }
}
