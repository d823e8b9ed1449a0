//! The watchdog on the host: a fake NCCL (Rust functions behind the binding's table) and a fake
//! device whose events complete, or never do, as a test says.
use super::SLOTS;
use crate::comm::{CommOptions, Communicator};
use crate::config::{TransportConfig, Watchdog};
use crate::device::{Device, RawStream};
use crate::loader::Vendor;
use crate::sys::{NcclFns, NcclLibrary, cudaStream_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t};
use crate::sys::{ncclResult_t, ncclUniqueId};
use crate::{NcclError, TransportCollective};
use collective_core::{Collective, DType, Error, Io, RawMut};
use core::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The fake GPU behind one rank: its stream, its NCCL kernels and its communicator state.
#[derive(Debug)]
struct Gpu {
    /// User work ahead of everything enqueued is still running: nothing completes.
    user_busy: AtomicBool,
    /// NCCL operations launched so far.
    launched: AtomicU64,
    /// Operations with an index at or above this never complete (`u64::MAX`: none hangs);
    /// `ncclCommAbort` stops them (resets it).
    hang_from: AtomicU64,
    /// `Device::record` calls.
    records: AtomicUsize,
    /// `ncclCommAbort` calls.
    aborts: AtomicUsize,
    /// What `ncclCommGetAsyncError` reports.
    async_error: AtomicI32,
}

impl Gpu {
    fn new() -> Arc<Gpu> {
        Arc::new(Gpu {
            user_busy: AtomicBool::new(false),
            launched: AtomicU64::new(0),
            hang_from: AtomicU64::new(u64::MAX),
            records: AtomicUsize::new(0),
            aborts: AtomicUsize::new(0),
            async_error: AtomicI32::new(0),
        })
    }
    /// Whether everything enqueued before a point where `launched` was `after` has completed.
    fn done_after(&self, after: u64) -> bool {
        !self.user_busy.load(Ordering::SeqCst) && after <= self.hang_from.load(Ordering::SeqCst)
    }
    /// The next NCCL operation (and every later one) never completes.
    fn hang_next(&self) {
        self.hang_from.store(self.launched.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

// The fake NCCL: the communicator handle is the `Gpu`'s address.

fn gpu<'a>(comm: ncclComm_t) -> &'a Gpu {
    // SAFETY: every communicator of these tests is `Arc::as_ptr` of a `Gpu` the test keeps
    // alive past the collective.
    unsafe { &*comm.cast::<Gpu>() }
}
fn launch(comm: ncclComm_t) -> ncclResult_t {
    gpu(comm).launched.fetch_add(1, Ordering::SeqCst);
    ncclResult_t::ncclSuccess
}
unsafe extern "C" fn get_version(v: *mut c_int) -> ncclResult_t {
    // SAFETY: out-pointer from the binding.
    unsafe { *v = 22800 };
    ncclResult_t::ncclSuccess
}
unsafe extern "C" fn unique_id(_: *mut ncclUniqueId) -> ncclResult_t {
    ncclResult_t::ncclInternalError
}
unsafe extern "C" fn init_rank(_: *mut ncclComm_t, _: c_int, _: ncclUniqueId, _: c_int) -> ncclResult_t {
    ncclResult_t::ncclInternalError
}
unsafe extern "C" fn init_rank_config(
    _: *mut ncclComm_t,
    _: c_int,
    _: ncclUniqueId,
    _: c_int,
    _: *mut ncclConfig_t,
) -> ncclResult_t {
    ncclResult_t::ncclInternalError
}
unsafe extern "C" fn success(_: ncclComm_t) -> ncclResult_t {
    ncclResult_t::ncclSuccess
}
unsafe extern "C" fn abort(comm: ncclComm_t) -> ncclResult_t {
    let g = gpu(comm);
    g.aborts.fetch_add(1, Ordering::SeqCst);
    g.hang_from.store(u64::MAX, Ordering::SeqCst);
    ncclResult_t::ncclSuccess
}
unsafe extern "C" fn async_error(comm: ncclComm_t, out: *mut ncclResult_t) -> ncclResult_t {
    // SAFETY: out-pointer from the binding.
    unsafe { *out = ncclResult_t(gpu(comm).async_error.load(Ordering::SeqCst)) };
    ncclResult_t::ncclSuccess
}
unsafe extern "C" fn error_string(_: ncclResult_t) -> *const c_char {
    c"fake NCCL error".as_ptr()
}
unsafe extern "C" fn nccl_all_gather(
    _: *const c_void,
    _: *mut c_void,
    _: usize,
    _: ncclDataType_t,
    comm: ncclComm_t,
    _: cudaStream_t,
) -> ncclResult_t {
    launch(comm)
}
unsafe extern "C" fn group() -> ncclResult_t {
    ncclResult_t::ncclSuccess
}
/// `ncclSend` (`P = *const c_void`) and `ncclRecv` (`P = *mut c_void`).
unsafe extern "C" fn point_to_point<P>(
    _: P,
    _: usize,
    _: ncclDataType_t,
    _: c_int,
    comm: ncclComm_t,
    _: cudaStream_t,
) -> ncclResult_t {
    launch(comm)
}
unsafe extern "C" fn reduce(
    _: *const c_void,
    _: *mut c_void,
    _: usize,
    _: ncclDataType_t,
    _: ncclRedOp_t,
    comm: ncclComm_t,
    _: cudaStream_t,
) -> ncclResult_t {
    launch(comm)
}

fn fake_nccl() -> Arc<NcclLibrary> {
    let fns = NcclFns {
        ncclGetVersion: get_version,
        ncclGetUniqueId: unique_id,
        ncclCommInitRank: init_rank,
        ncclCommInitRankConfig: init_rank_config,
        ncclCommDestroy: success,
        ncclCommAbort: abort,
        ncclCommGetAsyncError: async_error,
        ncclGetErrorString: error_string,
        ncclAllGather: nccl_all_gather,
        ncclGroupStart: group,
        ncclGroupEnd: group,
        ncclSend: point_to_point::<*const c_void>,
        ncclRecv: point_to_point::<*mut c_void>,
        ncclAllReduce: reduce,
        ncclReduceScatter: reduce,
        ncclGetLastError: None,
        ncclCommFinalize: Some(success),
    };
    Arc::new(NcclLibrary::from_fns(fns, "fake-nccl"))
}

/// The fake device: one stream (`()`), no memory (allocations are addresses), events that
/// complete once everything enqueued before their record has.
#[derive(Debug)]
struct FakeDevice(Arc<Gpu>);

/// `launched` at the last record.
#[derive(Debug, Default)]
struct FakeEvent(AtomicU64);

impl Device for FakeDevice {
    type Stream = ();
    type Allocation = u64;
    type Event = FakeEvent;
    const VENDOR: Vendor = Vendor::Nvidia;

    fn describe(&self) -> String {
        "fake".into()
    }
    fn raw_stream(&self, _: &()) -> Result<RawStream, Error> {
        Ok(RawStream(core::ptr::null_mut()))
    }
    fn bind(&self) -> Result<(), Error> {
        Ok(())
    }
    fn alloc(&self, _: usize) -> Result<u64, Error> {
        Ok(0x7e00_0000_0000)
    }
    fn address(&self, a: &u64) -> u64 {
        *a
    }
    fn leak(&self, _: u64) {}
    unsafe fn copy(&self, _: u64, _: u64, _: usize, _: RawStream) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn copy_to_host(&self, _: *mut u8, _: u64, _: usize, _: RawStream) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn copy_from_host(&self, _: u64, _: *const u8, _: usize, _: RawStream) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn tree(&self, _: &[u64], _: u64, _: usize, _: DType, _: RawStream) -> Result<(), Error> {
        Ok(())
    }
    fn event(&self) -> Result<FakeEvent, Error> {
        Ok(FakeEvent::default())
    }
    unsafe fn record(&self, e: &FakeEvent, _: RawStream) -> Result<(), Error> {
        self.0.records.fetch_add(1, Ordering::SeqCst);
        e.0.store(self.0.launched.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    }
    unsafe fn wait_event(&self, _: RawStream, _: &FakeEvent) -> Result<(), Error> {
        Ok(())
    }
    fn event_done(&self, e: &FakeEvent) -> Result<bool, Error> {
        Ok(self.0.done_after(e.0.load(Ordering::SeqCst)))
    }
    unsafe fn stream_done(&self, _: RawStream) -> Result<bool, Error> {
        Ok(self.0.done_after(self.0.launched.load(Ordering::SeqCst)))
    }
}

type Fake = TransportCollective<FakeDevice>;

/// Rank 0 of 2 over the fake NCCL (its peer is never asked: the fake moves nothing).
fn open(watchdog: Watchdog) -> (Arc<Gpu>, Fake) {
    let g = Gpu::new();
    let comm = Communicator::from_raw(fake_nccl(), Arc::as_ptr(&g).cast_mut().cast(), 0, 2, CommOptions::default());
    let config = TransportConfig::default().with_watchdog(watchdog);
    let c = TransportCollective::from_parts(FakeDevice(g.clone()), comm, &config).expect("fake collective");
    (g, c)
}

const BOUND: Duration = Duration::from_millis(40);
/// What the host may add to the bound here: a poll interval (2 ms at this bound) plus
/// scheduling noise of a loaded test host.
const SLACK: Duration = Duration::from_millis(100);

fn all_reduce(c: &Fake) -> Result<(), Error> {
    // SAFETY: a fake address, never dereferenced (the fake device moves nothing).
    let io = Io::InPlace(unsafe { RawMut::from_raw(0x7f00_0000_0000, 1024, DType::F32) });
    c.all_reduce(io, &())
}

fn all_gather(c: &Fake) -> Result<(), Error> {
    // SAFETY: as in `all_reduce`.
    let io = Io::InPlace(unsafe { RawMut::from_raw(0x7f00_0000_0000, 2048, DType::BF16) });
    c.all_gather(io, &())
}

/// Waits (at most `limit`) for `c` to be poisoned; the time it took.
fn poisoned_within(c: &Fake, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if c.poison.is_poisoned() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

fn tail(c: &Fake) -> (u64, u64) {
    let st = c.lock().expect("lock");
    let ring = st.tracking.ring().expect("watchdog on");
    (ring.head.load(Ordering::SeqCst), ring.tail.load(Ordering::SeqCst))
}

#[test]
fn a_started_call_that_never_ends_is_aborted_within_the_bound() {
    let (g, c) = open(Watchdog::After(BOUND));
    assert!(c.watchdog_running());
    all_reduce(&c).expect("healthy call");
    g.hang_next();
    all_reduce(&c).expect("enqueued: the hang is on the device");
    let took = poisoned_within(&c, BOUND + SLACK).expect("the watchdog trips");
    assert!(took >= BOUND, "tripped after {took:?}, before the bound");
    assert_eq!(g.aborts.load(Ordering::SeqCst), 1, "the communicator is aborted once");
    // The abort stopped the kernels: the caller's own stream wait returns.
    // SAFETY: the fake device's only stream.
    assert!(unsafe { c.device.stream_done(RawStream(core::ptr::null_mut())) }.expect("query"));
    match all_gather(&c) {
        Err(Error::Poisoned { cause }) => {
            assert!(cause.contains("all_reduce (transport call 2 of this rank)"), "{cause}");
            assert!(cause.contains("watchdog aborted"), "{cause}");
        }
        other => panic!("after the timeout: {other:?}"),
    }
    let deadline = Instant::now() + SLACK;
    while c.watchdog_running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!c.watchdog_running(), "the watchdog stops after tripping");
    c.close().expect("close after the abort");
}

#[test]
fn the_clock_starts_when_the_call_starts_on_the_device() {
    let (g, c) = open(Watchdog::After(BOUND));
    // Queued behind user work that runs much longer than the bound: not a timeout.
    g.user_busy.store(true, Ordering::SeqCst);
    g.hang_next();
    all_reduce(&c).expect("enqueued");
    assert_eq!(poisoned_within(&c, 4 * BOUND), None, "a call that has not started was timed out");
    assert_eq!(g.aborts.load(Ordering::SeqCst), 0);
    // It starts now, and hangs: timed out one bound later.
    let started = Instant::now();
    g.user_busy.store(false, Ordering::SeqCst);
    poisoned_within(&c, BOUND + SLACK).expect("the watchdog trips");
    assert!(started.elapsed() >= BOUND, "tripped {:?} after the start", started.elapsed());
}

#[test]
fn a_call_that_never_starts_is_not_timed_out() {
    let (g, c) = open(Watchdog::After(BOUND));
    g.user_busy.store(true, Ordering::SeqCst);
    all_reduce(&c).expect("enqueued");
    assert_eq!(poisoned_within(&c, 5 * BOUND), None);
    g.user_busy.store(false, Ordering::SeqCst);
    all_reduce(&c).expect("healthy after the user work");
    assert_eq!(poisoned_within(&c, 3 * BOUND), None);
    assert_eq!(g.aborts.load(Ordering::SeqCst), 0);
}

#[test]
fn healthy_calls_never_trip_it() {
    let (g, c) = open(Watchdog::After(BOUND));
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < 5 * BOUND {
        all_reduce(&c).expect("all_reduce");
        all_gather(&c).expect("all_gather");
        // SAFETY: as in `all_reduce`.
        let io = Io::InPlace(unsafe { RawMut::from_raw(0x7f00_0000_0000, 256, DType::F16) });
        c.native_reduce_scatter(io, &()).expect("native reduce_scatter");
        calls += 3;
        if calls % 30 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    std::thread::sleep(3 * BOUND);
    assert!(!c.poison.is_poisoned(), "{:?}", c.poison.check());
    assert!(c.watchdog_running());
    assert_eq!(g.aborts.load(Ordering::SeqCst), 0);
    let (head, tail) = tail(&c);
    assert_eq!(head, tail, "every finished call is retired");
    assert!(tail > 0);
}

#[test]
fn a_full_ring_skips_tracking_without_waiting() {
    let (g, c) = open(Watchdog::After(BOUND));
    g.user_busy.store(true, Ordering::SeqCst);
    let start = Instant::now();
    for _ in 0..SLOTS + 10 {
        all_gather(&c).expect("enqueued");
    }
    assert!(start.elapsed() < BOUND, "a full ring made calls wait ({:?})", start.elapsed());
    assert_eq!(tail(&c), (0, SLOTS as u64), "calls past a full ring are not tracked");
    assert_eq!(g.records.load(Ordering::SeqCst), 2 * SLOTS, "two records per tracked call");
    g.user_busy.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + SLACK;
    while tail(&c).0 < SLOTS as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(tail(&c), (SLOTS as u64, SLOTS as u64), "finished calls are retired");
    all_gather(&c).expect("tracked again");
    assert_eq!(tail(&c).1, SLOTS as u64 + 1);
    assert!(!c.poison.is_poisoned());
}

#[test]
fn an_async_error_poisons_promptly() {
    let (g, c) = open(Watchdog::After(Duration::from_secs(600)));
    all_gather(&c).expect("healthy");
    g.async_error.store(ncclResult_t::ncclRemoteError.0, Ordering::SeqCst);
    poisoned_within(&c, SLACK).expect("the watchdog polls the communicator");
    assert_eq!(g.aborts.load(Ordering::SeqCst), 1);
    let e = c.poll_async_error().expect_err("poisoned");
    assert!(e.to_string().contains("ncclRemoteError"), "{e}");
}

#[test]
fn close_and_drop_join_the_thread_promptly() {
    let long = Watchdog::After(Duration::from_secs(600));
    let (g, c) = open(long);
    all_reduce(&c).expect("healthy");
    assert_eq!(Arc::strong_count(&c.device), 2, "the thread holds the device");
    let start = Instant::now();
    c.close().expect("close");
    assert!(start.elapsed() < SLACK, "close took {:?}", start.elapsed());
    assert_eq!(Arc::strong_count(&c.device), 1, "the thread has exited");
    assert!(matches!(all_reduce(&c), Err(Error::Closed)));
    drop(c);

    let (g2, c) = open(long);
    all_reduce(&c).expect("healthy");
    let start = Instant::now();
    drop(c);
    assert!(start.elapsed() < SLACK, "drop took {:?}", start.elapsed());
    // Only this test's handle is left: the thread dropped its device (it has exited).
    assert_eq!(Arc::strong_count(&g2), 1);
    assert_eq!(Arc::strong_count(&g), 1);
}

#[test]
fn a_disabled_watchdog_spawns_nothing_and_records_nothing() {
    let (g, c) = open(Watchdog::Off);
    assert!(!c.watchdog_running());
    assert!(c.watchdog.lock().expect("lock").is_none());
    assert!(c.lock().expect("lock").tracking.ring().is_none());
    assert_eq!(Arc::strong_count(&c.device), 1);
    all_gather(&c).expect("all_gather");
    assert_eq!(g.records.load(Ordering::SeqCst), 0, "no event records without the watchdog");
    // With it on, the same call costs exactly two records.
    let (g, c) = open(Watchdog::After(BOUND));
    all_gather(&c).expect("all_gather");
    assert_eq!(g.records.load(Ordering::SeqCst), 2);
}

#[test]
fn the_timeout_names_the_call() {
    let e: Error = NcclError::Watchdog { call: "reduce_scatter_many", seq: 7, bound: BOUND }.into();
    assert!(e.poisons());
    let s = e.to_string();
    assert!(s.contains("reduce_scatter_many (transport call 7 of this rank)") && s.contains("40ms"), "{s}");
    for (call, name) in [
        (super::Call::Strict(collective_core::Op::AllGather), "all_gather"),
        (super::Call::Native(collective_core::Op::AllReduce), "native all_reduce (non-strict)"),
    ] {
        assert_eq!(super::Call::name(call.code()), name);
    }
}
