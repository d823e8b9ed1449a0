//! Shared by the NVIDIA GPU tests: one rank of the factory's collective with its device
//! buffers, and the calls every rank makes (every op; f32, f16, bf16; odd, even and
//! above-256-KiB sizes; in place and not; reduce_scatter_many with 2 and 3 lanes), each checked
//! byte for byte against fixed-tree along with the route the collective reports.
#![allow(dead_code)]
use collective_core::conformance::data::{compare, finite_values, reference_reduce};
use collective_core::{Collective, DType, Io, Op, RawMut, RawRef, Route};
use collective_factory::NvidiaCollective;
use cuda_ipc::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use std::time::Duration;

/// Staging bytes per rank: the largest call (reduce_scatter_many, f32, world 8) is about 2 MiB.
pub const CAPACITY: usize = 4 << 20;
/// Bytes of guard pattern before and after every output (keeps outputs 256-byte aligned).
const GUARD: usize = 256;
const GUARD_BYTE: u8 = 0xA5;
const JUNK_BYTE: u8 = 0x5A;
/// All_reduce / all_gather element counts: odd (tiny, and 4 KiB-ish), divisible by 8 (the hybrid
/// splits them), and above 256 KiB in every dtype.
const SIZES: [usize; 4] = [7, 4099, 8192, 196_608];
/// Reduce_scatter shard element counts (the input is `world` shards): one, odd, odd above 256 KiB.
const SHARDS: [usize; 3] = [1, 513, 65_537];
/// Reduce_scatter_many lanes, in shard element counts.
const LANES: [&[usize]; 2] = [&[513, 1, 65_537], &[1024, 7]];

/// How many CUDA devices this process sees, or why it cannot use one.
pub fn cuda_devices() -> Result<usize, String> {
    if !cuda_ipc::driver::driver_present() {
        return Err("no CUDA driver (libcuda is not loadable)".into());
    }
    match cuda_ipc::driver::device_count() {
        Ok(0) => Err("no CUDA device (the driver reports 0)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("no CUDA device ({e})")),
    }
}

/// One call: `lanes` holds each lane's per-rank input element count (one lane unless the op is
/// reduce_scatter_many).
#[derive(Debug, Clone)]
pub struct Call {
    pub op: Op,
    pub dtype: DType,
    pub lanes: Vec<usize>,
    pub in_place: bool,
}

/// The calls every rank of a `world` makes, in order.
pub fn plan(world: usize) -> Vec<Call> {
    let mut calls = Vec::new();
    for dtype in DType::REDUCIBLE {
        for in_place in [false, true] {
            for op in [Op::AllReduce, Op::AllGather] {
                calls.extend(SIZES.iter().map(|&n| Call { op, dtype, lanes: vec![n], in_place }));
            }
            let rs = SHARDS.iter().map(|&s| Call { op: Op::ReduceScatter, dtype, lanes: vec![s * world], in_place });
            calls.extend(rs);
        }
        for lanes in LANES {
            let lanes = lanes.iter().map(|s| s * world).collect();
            calls.push(Call { op: Op::ReduceScatterMany, dtype, lanes, in_place: false });
        }
    }
    calls
}

fn align(bytes: usize) -> usize {
    bytes.div_ceil(GUARD) * GUARD
}

impl Call {
    /// Per-rank input bytes, as routing sees them.
    pub fn bytes(&self) -> usize {
        self.lanes.iter().sum::<usize>() * self.dtype.size()
    }

    /// Elements of one lane's output for an input of `n`.
    fn out_len(&self, n: usize, world: usize) -> usize {
        match self.op {
            Op::AllReduce => n,
            Op::AllGather => n * world,
            Op::ReduceScatter | Op::ReduceScatterMany => n / world,
        }
    }

    /// Byte offsets of every lane's input in the input buffer, of every lane's output (or of
    /// the in-place buffer) in the output buffer, and the two buffers' lengths.
    fn layout(&self, world: usize) -> (Vec<usize>, Vec<usize>, usize, usize) {
        let size = self.dtype.size();
        let (mut ins, mut outs, mut in_end, mut out_end) = (Vec::new(), Vec::new(), 0, 0);
        for &n in &self.lanes {
            ins.push(in_end);
            in_end = align(in_end + n * size);
            let buf = if self.in_place { n.max(self.out_len(n, world)) } else { self.out_len(n, world) };
            outs.push(out_end + GUARD);
            out_end = align(out_end + GUARD + buf * size);
        }
        (ins, outs, if self.in_place { 0 } else { in_end }, out_end + GUARD)
    }

    fn label(&self, rank: usize) -> String {
        let place = if self.in_place { "in place" } else { "out of place" };
        format!("rank {rank}: {} {} lanes {:?} ({place})", self.op.name(), self.dtype, self.lanes)
    }
}

/// Rank `rank`'s input of lane `lane` of call `index` (every rank can rebuild every input).
fn input(call: &Call, index: usize, lane: usize, rank: usize) -> Vec<u8> {
    let seed = (index as u64) << 32 ^ (lane as u64) << 16 ^ rank as u64 ^ 0xFAC7_0000_0000_0000;
    finite_values(call.dtype, call.lanes[lane], seed)
}

/// Device address of a cudarc buffer.
fn addr(buf: &CudaSlice<u8>, stream: &Arc<CudaStream>) -> u64 {
    let (p, _record) = buf.device_ptr(stream);
    p
}

/// One rank: the factory's collective, a stream on its GPU, and device buffers allocated up
/// front for the largest call (no allocation while peers may wait for this rank).
pub struct Rank {
    pub comm: NvidiaCollective,
    pub stream: Arc<CudaStream>,
    plan: Vec<Call>,
    input: CudaSlice<u8>,
    output: CudaSlice<u8>,
    /// Bound on waiting for the stream.
    bound: Duration,
}

impl Rank {
    /// `comm` built by the factory on GPU `ordinal` (the one it chose: `local_rank % count`).
    pub fn new(comm: NvidiaCollective, ordinal: usize, bound: Duration) -> Result<Rank, String> {
        let ctx = cuda_ipc::driver::open_device(ordinal).map_err(|e| e.to_string())?;
        let stream = ctx.new_stream().map_err(|e| format!("stream: {e}"))?;
        let plan = plan(comm.world_size());
        let (mut ins, mut outs) = (1, 1);
        for c in &plan {
            let (_, _, i, o) = c.layout(comm.world_size());
            (ins, outs) = (ins.max(i), outs.max(o));
        }
        let input = stream.alloc_zeros::<u8>(ins).map_err(|e| format!("alloc: {e}"))?;
        let output = stream.alloc_zeros::<u8>(outs).map_err(|e| format!("alloc: {e}"))?;
        Ok(Rank { comm, stream, plan, input, output, bound })
    }

    /// Waits for the stream, bounded when a transport is built (NCCL kernels otherwise wait
    /// for an absent peer forever; IPC kernels time out on their own), and surfaces any failure
    /// an IPC kernel recorded.
    fn sync(&self) -> Result<(), String> {
        match self.comm.transport() {
            Some(t) => t.synchronize(&self.stream, self.bound).map_err(|e| format!("synchronize: {e}"))?,
            None => self.stream.synchronize().map_err(|e| format!("synchronize: {e}"))?,
        }
        self.comm.ipc().map_or(Ok(()), |i| i.check()).map_err(|e| format!("recorded kernel failure: {e}"))
    }

    fn upload(&mut self, to_output: bool, img: &[u8]) -> Result<(), String> {
        self.sync()?;
        let buf = if to_output { &mut self.output } else { &mut self.input };
        self.stream.memcpy_htod(img, &mut buf.slice_mut(..img.len())).map_err(|e| format!("upload: {e}"))
    }

    fn download(&self, from_output: bool, len: usize) -> Result<Vec<u8>, String> {
        self.sync()?;
        let buf = if from_output { &self.output } else { &self.input };
        self.stream.clone_dtoh(&buf.slice(..len)).map_err(|e| format!("download: {e}"))
    }

    /// Makes every call of the plan, checking the route against `expect(op)` and every output
    /// byte against fixed-tree. Wrong bytes or routes are collected and the calls go on (peers
    /// are not left waiting); a collective error ends the run at once (this rank's process
    /// exits and the launcher stops the others; a peer already waiting fails within its
    /// timeouts).
    pub fn run(&mut self, expect: &dyn Fn(Op) -> Route) -> Result<(), String> {
        let mut failures = Vec::new();
        for (index, call) in self.plan.clone().iter().enumerate() {
            let label = call.label(self.comm.rank());
            let route = self.comm.route(call.op, call.bytes());
            if route != expect(call.op) {
                failures.push(format!("{label}: routed to {}, expected {}", route.name(), expect(call.op).name()));
            }
            match self.call(call, index) {
                Ok(Ok(())) => {}
                Ok(Err(wrong)) => failures.push(format!("{label}: {wrong}")),
                Err(fatal) => {
                    failures.push(format!("{label}: {fatal}"));
                    break;
                }
            }
        }
        failures.truncate(12);
        if failures.is_empty() { Ok(()) } else { Err(failures.join("\n")) }
    }

    /// One call: `Err` when the collective (or the stream) failed, `Ok(Err)` for a wrong result.
    fn call(&mut self, call: &Call, index: usize) -> Result<Result<(), String>, String> {
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        let (d, size) = (call.dtype, call.dtype.size());
        let (in_offs, out_offs, in_len, out_len) = call.layout(world);
        let mut in_img = vec![JUNK_BYTE; in_len];
        let mut out_img = vec![GUARD_BYTE; out_len];
        // Where each lane's result lands in the output image, and what it must be.
        let mut results = Vec::new();
        for (lane, &n) in call.lanes.iter().enumerate() {
            let all: Vec<Vec<u8>> = (0..world).map(|q| input(call, index, lane, q)).collect();
            let (mine, base, shard) = (&all[rank], out_offs[lane], n / world * size);
            let (want, at) = match call.op {
                Op::AllReduce => (reference_reduce(&all, d), base),
                Op::AllGather => (all.concat(), base),
                _ => {
                    let shards: Vec<Vec<u8>> = all.iter().map(|a| a[rank * shard..][..shard].to_vec()).collect();
                    // In place, the result is this rank's shard of the buffer.
                    (reference_reduce(&shards, d), if call.in_place { base + rank * shard } else { base })
                }
            };
            match (call.in_place, call.op) {
                (false, _) => in_img[in_offs[lane]..][..mine.len()].copy_from_slice(mine),
                (true, Op::AllGather) => {
                    out_img[base..][..want.len()].fill(JUNK_BYTE);
                    out_img[base + rank * mine.len()..][..mine.len()].copy_from_slice(mine);
                }
                (true, _) => out_img[base..][..mine.len()].copy_from_slice(mine),
            }
            results.push((at, want));
        }
        if !call.in_place {
            self.upload(false, &in_img)?;
        }
        self.upload(true, &out_img)?;
        let (ib, ob) = (addr(&self.input, &self.stream), addr(&self.output, &self.stream));
        let ios: Vec<Io<'_>> = call
            .lanes
            .iter()
            .zip(in_offs.iter().zip(&out_offs))
            .map(|(&n, (&i, &o))| {
                let m = call.out_len(n, world);
                // SAFETY: every view lies inside `self.input` / `self.output` (see `layout`),
                // which outlive the call and are read back only after the stream is synchronised.
                unsafe {
                    match call.in_place {
                        true => Io::InPlace(RawMut::from_raw(ob + o as u64, n.max(m), d)),
                        false => Io::OutOfPlace {
                            input: RawRef::from_raw(ib + i as u64, n, d),
                            output: RawMut::from_raw(ob + o as u64, m, d),
                        },
                    }
                }
            })
            .collect();
        let (c, s) = (&self.comm, &*self.stream);
        let done = match call.op {
            Op::ReduceScatterMany => c.reduce_scatter_many(&ios, s),
            op => {
                let io = ios.into_iter().next().ok_or("no lane")?;
                match op {
                    Op::AllReduce => c.all_reduce(io, s),
                    Op::AllGather => c.all_gather(io, s),
                    _ => c.reduce_scatter(io, s),
                }
            }
        };
        done.map_err(|e| format!("collective error: {e}"))?;
        let got = self.download(true, out_len)?;
        let mut want_img = out_img;
        if call.in_place && !matches!(call.op, Op::AllReduce | Op::AllGather) {
            // The other shards of an in-place reduce_scatter buffer are unspecified.
            let (o, n) = (out_offs[0], call.lanes[0] * size);
            want_img[o..o + n].copy_from_slice(&got[o..o + n]);
        }
        for (at, want) in &results {
            want_img[*at..][..want.len()].copy_from_slice(want);
        }
        if got != want_img {
            for (at, want) in &results {
                let got = &got[*at..][..want.len()];
                if got != want.as_slice() {
                    let why = compare(got, want, d).err().unwrap_or_else(|| "NaN payloads differ".into());
                    return Ok(Err(format!("bits differ from fixed-tree: {why}")));
                }
            }
            return Ok(Err("wrote outside its output (a guard byte changed)".into()));
        }
        if !call.in_place && self.download(false, in_len)? != in_img {
            return Ok(Err("modified its input".into()));
        }
        Ok(Ok(()))
    }

    /// Waits for the stream (bounded) and closes the collective.
    pub fn close(self) -> Result<(), String> {
        let synced = self.sync();
        let closed = self.comm.close().map_err(|e| format!("close: {e}"));
        synced.and(closed)
    }
}
