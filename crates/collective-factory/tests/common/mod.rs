//! Shared by the GPU tests of every platform: one rank of the factory's collective with its
//! device buffers, and the calls every rank makes (every op; f32, f16, bf16; odd, even and
//! above-256-KiB sizes; in place and not; reduce_scatter_many with 2 and 3 lanes), each checked
//! byte for byte against fixed-tree along with the route the collective reports; world 1
//! through the factory, and route equivalence (every route forced in turn, one process per
//! GPU). Generic over a [`Platform`]: [`nvidia::Nvidia`] (feature `cuda`) or [`rocm::Rocm`]
//! (feature `rocm`).
#![allow(dead_code)]
use ccl_transport::Device;
use collective_core::Timeouts;
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::conformance::data::{compare, finite_values, reference_reduce};
use collective_core::conformance::{CHILD_ENV, run_processes, skip};
use collective_core::{Collective, DType, Error, Io, Op, RawMut, RawRef, Route};
use collective_factory::{Routed, Routing, RoutingTable, Rule};
use std::borrow::Borrow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(feature = "cuda")]
pub mod nvidia;
#[cfg(feature = "rocm")]
pub mod rocm;

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

/// One GPU platform of the factory: how its collective is built, and its streams and device
/// buffers.
pub trait Platform: 'static {
    /// The IPC backend.
    type Ipc: collective_core::RouteSelect;
    /// The transport's device side, on the IPC backend's stream type.
    type Dev: Device<Stream = <Self::Ipc as Collective>::Stream>;
    /// A stream the tests own; borrows as the collective's stream.
    type Stream: Borrow<<Self::Ipc as Collective>::Stream>;
    /// A device buffer.
    type Mem;

    /// The routing table's platform name (`nvidia`, `rocm`).
    const NAME: &'static str;
    /// `CUDA` / `HIP`, in skip messages.
    const RUNTIME: &'static str;
    /// `NCCL` / `RCCL`, in skip messages.
    const LIBRARY: &'static str;

    /// How many devices this process sees, or why it cannot use one.
    fn devices() -> Result<usize, String>;
    /// What a rank process does before it touches the GPU (e.g. environment the library reads).
    fn prepare_process() {}
    /// The factory's collective for every rank of `boot`.
    fn build(boot: Arc<dyn Bootstrap>, config: Build) -> Result<Comm<Self>, Error>;
    /// Surfaces any failure an IPC kernel recorded.
    fn check_ipc(ipc: &Self::Ipc) -> Result<(), Error>;

    /// A new stream on GPU `ordinal`.
    fn stream(ordinal: usize) -> Result<Self::Stream, String>;
    /// A zeroed buffer of `bytes` bytes on `stream`'s GPU.
    fn alloc(stream: &Self::Stream, bytes: usize) -> Result<Self::Mem, String>;
    /// Writes `img` to the start of `mem` (the stream is idle).
    fn upload(stream: &Self::Stream, mem: &mut Self::Mem, img: &[u8]) -> Result<(), String>;
    /// The first `len` bytes of `mem` (the stream is idle).
    fn download(stream: &Self::Stream, mem: &Self::Mem, len: usize) -> Result<Vec<u8>, String>;
    /// Device address of `mem`.
    fn addr(stream: &Self::Stream, mem: &Self::Mem) -> u64;
    /// Waits for the work enqueued on `stream` so far.
    fn synchronize(stream: &Self::Stream) -> Result<(), String>;
}

/// What every rank passes to the platform's factory.
#[derive(Debug, Clone)]
pub struct Build {
    /// Staging bytes per rank.
    pub capacity: usize,
    /// Replaces the platform's table (default: `DETCOLL_ROUTING_TABLE`, else the built-in one).
    pub routing: Option<Routing>,
    /// Bounds on waits.
    pub timeouts: Option<Timeouts>,
}

impl Build {
    /// The factory configuration these values mean.
    pub fn config(&self) -> collective_factory::Config {
        let mut c = collective_factory::Config::new().with_capacity(self.capacity);
        if let Some(r) = &self.routing {
            c = c.with_routing(r.clone());
        }
        if let Some(t) = self.timeouts {
            c = c.with_timeouts(t);
        }
        c
    }
}

/// The factory's collective on platform `P`.
pub type Comm<P> = Routed<<P as Platform>::Ipc, collective_factory::GpuTransport<<P as Platform>::Dev>>;

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

/// One rank: the factory's collective, a stream on its GPU, and device buffers allocated up
/// front for the largest call (no allocation while peers may wait for this rank).
pub struct Rank<P: Platform> {
    pub comm: Comm<P>,
    pub stream: P::Stream,
    plan: Vec<Call>,
    input: P::Mem,
    output: P::Mem,
    /// Bound on waiting for the stream.
    bound: Duration,
}

impl<P: Platform> Rank<P> {
    /// `comm` built by the factory on GPU `ordinal` (the one it chose: `local_rank % count`).
    pub fn new(comm: Comm<P>, ordinal: usize, bound: Duration) -> Result<Self, String> {
        let stream = P::stream(ordinal).map_err(|e| format!("stream: {e}"))?;
        let plan = plan(comm.world_size());
        let (mut ins, mut outs) = (1, 1);
        for c in &plan {
            let (_, _, i, o) = c.layout(comm.world_size());
            (ins, outs) = (ins.max(i), outs.max(o));
        }
        let input = P::alloc(&stream, ins).map_err(|e| format!("alloc: {e}"))?;
        let output = P::alloc(&stream, outs).map_err(|e| format!("alloc: {e}"))?;
        Ok(Rank { comm, stream, plan, input, output, bound })
    }

    /// Waits for the stream, bounded when a transport is built (library kernels otherwise wait
    /// for an absent peer forever; IPC kernels time out on their own), and surfaces any failure
    /// an IPC kernel recorded.
    fn sync(&self) -> Result<(), String> {
        match self.comm.transport().and_then(|t| t.ccl()) {
            Some(t) => t.synchronize(self.stream.borrow(), self.bound).map_err(|e| format!("synchronize: {e}"))?,
            None => P::synchronize(&self.stream).map_err(|e| format!("synchronize: {e}"))?,
        }
        self.comm.ipc().map_or(Ok(()), P::check_ipc).map_err(|e| format!("recorded kernel failure: {e}"))
    }

    fn upload(&mut self, to_output: bool, img: &[u8]) -> Result<(), String> {
        self.sync()?;
        let buf = if to_output { &mut self.output } else { &mut self.input };
        P::upload(&self.stream, buf, img).map_err(|e| format!("upload: {e}"))
    }

    fn download(&self, from_output: bool, len: usize) -> Result<Vec<u8>, String> {
        self.sync()?;
        let buf = if from_output { &self.output } else { &self.input };
        P::download(&self.stream, buf, len).map_err(|e| format!("download: {e}"))
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
        let (ib, ob) = (P::addr(&self.stream, &self.input), P::addr(&self.stream, &self.output));
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
        let (c, s) = (&self.comm, self.stream.borrow());
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

/// World 1 through the factory with its default routing (the IPC backend's local route; no
/// transport is built for one rank): every call of [`plan`] bit-exact against fixed-tree.
/// Skips, saying why, without a GPU.
pub fn world1<P: Platform>() {
    if let Err(why) = P::devices() {
        return skip(&why);
    }
    let boot: Arc<dyn Bootstrap> = Arc::new(LocalBootstrap::group(1).remove(0));
    let config = Build { capacity: CAPACITY, routing: None, timeouts: None };
    let comm = P::build(boot, config).expect("factory");
    let mut rank = Rank::<P>::new(comm, 0, Duration::from_secs(60)).expect("rank");
    let ran = rank.run(&|_| Route::Local);
    let closed = rank.close();
    if let Err(e) = ran.and(closed) {
        panic!("{e}");
    }
}

/// Bounds every wait of a route-equivalence rank: peer flags and library calls, close.
const ROUTE_TIMEOUTS: Timeouts = Timeouts { peer: Duration::from_secs(60), close: Duration::from_secs(30) };
/// Bounds a route-equivalence rank's stream synchronisation.
const ROUTE_SYNC_BOUND: Duration = Duration::from_secs(120);

/// The world the route-equivalence tests run on `P` (the largest of 8, 4, 2 that the GPUs
/// allow: one GPU per rank), or why they cannot.
fn route_world<P: Platform>() -> Result<usize, String> {
    let n = P::devices()?;
    if n < 2 {
        return Err(format!(
            "{n} {} device: route equivalence needs 2+ GPUs ({} refuses two ranks on one GPU)",
            P::RUNTIME,
            P::LIBRARY
        ));
    }
    ccl_transport::load(Some(P::Dev::VENDOR)).map_err(|e| format!("{} is not loadable ({e})", P::LIBRARY))?;
    Ok([8, 4, 2].into_iter().find(|&w| w <= n).unwrap_or(2))
}

/// A table for platform `P` sending every call of `op` through `route_of(op)`.
fn forced<P: Platform>(name: &str, route_of: fn(Op) -> Route) -> Routing {
    let rule = |op: Op| Rule { op: op.name().into(), min_bytes: 0, max_bytes: None, route: route_of(op).name().into() };
    let table =
        RoutingTable { platform: P::NAME.into(), source: format!("test: {name}"), rules: Op::ALL.map(rule).into() };
    Routing::new(table).unwrap_or_else(|e| panic!("forced routing {name}: {e}"))
}

/// Runs the plan on every rank of a world of `P` built with the forced routing `route_of`, one
/// process per rank on GPU `local_rank % count`; `test` is the running test's name (the rank
/// processes re-run it).
pub fn check_routes<P: Platform>(test: &str, route_of: fn(Op) -> Route) {
    let child = std::env::var_os(CHILD_ENV).is_some();
    // Children take the world from the launcher (run_processes ignores it there) and must not
    // touch the GPU before `prepare_process`.
    let world = match child {
        true => 0,
        false => match route_world::<P>() {
            Ok(w) => w,
            Err(why) => return skip(&why),
        },
    };
    // One world on the GPUs at a time.
    static WORLDS: Mutex<()> = Mutex::new(());
    let _one = WORLDS.lock().unwrap_or_else(|p| p.into_inner());
    let routing = forced::<P>(test, route_of);
    let make = |boot: Box<dyn Bootstrap>| {
        P::prepare_process();
        let boot: Arc<dyn Bootstrap> = Arc::from(boot);
        let config = Build { capacity: CAPACITY, routing: Some(routing), timeouts: Some(ROUTE_TIMEOUTS) };
        let comm = P::build(boot.clone(), config).map_err(|e| format!("{}_collective: {e}", P::NAME))?;
        let ordinal = boot.local_rank() % P::devices()?;
        Rank::<P>::new(comm, ordinal, ROUTE_SYNC_BOUND)
    };
    let case = |rank: &mut Rank<P>| rank.run(&route_of);
    if let Err(e) = run_processes(world, test, make, &case, Rank::close) {
        panic!("{test} (world {world}):\n{e}");
    }
}

/// One `#[test]` per forced routing on platform `$platform`, at the test binary's root: every
/// op through IPC one-shot; the IPC LL push and bulk push routes; IPC reduce_scatter +
/// all_gather; the transport; the hybrid.
#[allow(unused_macros)]
macro_rules! route_tests {
    ($platform:ty) => {
        common::route_tests! {@tests $platform;
            every_op_through_ipc_one_shot_is_bit_exact: |_| collective_core::Route::IpcOneShot;
            every_op_through_ipc_push_ll_is_bit_exact: |_| collective_core::Route::IpcPushLl;
            every_op_through_ipc_push_is_bit_exact: |_| collective_core::Route::IpcPush;
            every_op_through_ipc_rs_ag_is_bit_exact: |_| collective_core::Route::IpcReduceScatterAllGather;
            every_op_through_the_transport_is_bit_exact: |_| collective_core::Route::Transport;
            // all_gather reduces nothing, so it cannot take the hybrid: it takes the transport
            // (the hybrid's second half); reduce_scatter takes the hybrid's IPC half.
            hybrid_ipc_rs_transport_ag_is_bit_exact: |op| match op {
                collective_core::Op::AllGather => collective_core::Route::Transport,
                _ => collective_core::Route::IpcReduceScatterTransportAllGather,
            };
        }
    };
    (@tests $platform:ty; $($name:ident: $route_of:expr;)*) => {$(
        #[test]
        fn $name() {
            common::check_routes::<$platform>(stringify!($name), $route_of)
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use route_tests;
