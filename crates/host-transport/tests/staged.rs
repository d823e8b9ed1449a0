//! `StagedTransport` on the host device (`shm_ipc::HostDevice`: host memory, a synchronous
//! "stream"), ranks as threads over `LocalBootstrap`: every op in and out of place, f32/bf16/f16,
//! bit for bit `fixed-tree`'s; refused calls write nothing and touch no device; a captured
//! stream is refused; a peer that drops its handle gives the others a typed error; a
//! `reduce_scatter_many` of any lane count is signed with its part (the front door's call
//! number), so ranks one refused call apart fail with `SignatureMismatch` instead of pairing.
use collective_core::bootstrap::{BootstrapError, LocalBootstrap};
use collective_core::{Collective, DType, Error, Io, Op, Plain, RawMut, RawRef, Signature};
use detcoll_host_transport::StagedTransport;
use detcoll_protocol::{Device, RawStream, Vendor};
use fixed_tree::Element;
use half::{bf16, f16};
use shm_ipc::{HostAllocation, HostDevice};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Every exchange's bound: the tests never wait for it unless something is broken (a dropped
/// peer is seen at once).
const TIMEOUT: Duration = Duration::from_secs(20);

/// The host device, counting the host copies it is asked for and able to claim its stream is
/// being captured.
#[derive(Debug, Default)]
struct Host {
    inner: Arc<HostDeviceCell>,
}

#[derive(Debug)]
struct HostDeviceCell {
    dev: HostDevice,
    copies: AtomicUsize,
    capturing: AtomicBool,
}

impl Default for HostDeviceCell {
    fn default() -> Self {
        HostDeviceCell { dev: HostDevice::threads(), copies: AtomicUsize::new(0), capturing: AtomicBool::new(false) }
    }
}

impl Host {
    fn copies(&self) -> usize {
        self.inner.copies.load(Ordering::SeqCst)
    }
}

impl Device for Host {
    type Stream = ();
    type Allocation = HostAllocation;
    type Event = ();
    const VENDOR: Vendor = Vendor::Host;

    fn describe(&self) -> String {
        self.inner.dev.describe()
    }
    fn raw_stream(&self, s: &()) -> Result<RawStream, Error> {
        self.inner.dev.raw_stream(s)
    }
    fn bind(&self) -> Result<(), Error> {
        self.inner.dev.bind()
    }
    fn alloc(&self, bytes: usize) -> Result<HostAllocation, Error> {
        self.inner.dev.alloc(bytes)
    }
    fn address(&self, a: &HostAllocation) -> u64 {
        self.inner.dev.address(a)
    }
    fn leak(&self, a: HostAllocation) {
        self.inner.dev.leak(a)
    }
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, s: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.dev.copy(dst, src, bytes, s) }
    }
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, bytes: usize, s: RawStream) -> Result<(), Error> {
        self.inner.copies.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.dev.copy_to_host(dst, src, bytes, s) }
    }
    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, bytes: usize, s: RawStream) -> Result<(), Error> {
        self.inner.copies.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.dev.copy_from_host(dst, src, bytes, s) }
    }
    unsafe fn tree(&self, inputs: &[u64], out: u64, count: usize, dtype: DType, s: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.dev.tree(inputs, out, count, dtype, s) }
    }
    fn event(&self) -> Result<(), Error> {
        self.inner.dev.event()
    }
    unsafe fn record(&self, e: &(), s: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.dev.record(e, s) }
    }
    unsafe fn wait_event(&self, s: RawStream, e: &()) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.dev.wait_event(s, e) }
    }
    fn event_done(&self, e: &()) -> Result<bool, Error> {
        self.inner.dev.event_done(e)
    }
    unsafe fn stream_done(&self, s: RawStream) -> Result<bool, Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.dev.stream_done(s) }
    }
    unsafe fn is_capturing(&self, _: RawStream) -> Result<bool, Error> {
        Ok(self.inner.capturing.load(Ordering::SeqCst))
    }
}

type Staged = StagedTransport<Host>;

/// Runs `body(rank, transport)` on every rank of a world of `world` threads.
fn ranks<R: Send>(world: usize, body: impl Fn(usize, Staged) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let body = &body;
        let hs: Vec<_> = LocalBootstrap::group_with_timeout(world, TIMEOUT)
            .into_iter()
            .enumerate()
            .map(|(rank, b)| {
                s.spawn(move || {
                    let t = StagedTransport::new(Host::default(), Arc::new(b)).expect("staged transport");
                    assert_eq!((t.rank(), t.world_size()), (rank, world));
                    body(rank, t)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

/// The element types the tests reduce.
trait Val: Element + Plain + Default {
    fn of(x: f32) -> Self;
}
impl Val for f32 {
    fn of(x: f32) -> Self {
        x
    }
}
impl Val for bf16 {
    fn of(x: f32) -> Self {
        bf16::from_f32(x)
    }
}
impl Val for f16 {
    fn of(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// Rank `rank`'s `n` values of stream `seed`: mixed signs and magnitudes, so the order of the
/// adds shows in the bits.
fn data<T: Val>(seed: u64, rank: usize, n: usize) -> Vec<T> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (rank as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let m = (x % 20_000) as f32 / 1000.0 - 10.0;
            let e = [1.0, 1e-3, 1e3, 0.37][(x >> 40) as usize % 4];
            T::of(m * e)
        })
        .collect()
}

fn bits<T: Val>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits_u32()).collect()
}

/// What the world's inputs of stream `seed` are, every rank's.
fn all<T: Val>(seed: u64, world: usize, n: usize) -> Vec<Vec<T>> {
    (0..world).map(|q| data(seed, q, n)).collect()
}

fn views<T>(v: &[Vec<T>]) -> Vec<&[T]> {
    v.iter().map(Vec::as_slice).collect()
}

/// Every op, in and out of place, on this rank; what differs from `fixed-tree`, by name.
fn every_op<T: Val>(rank: usize, world: usize, t: &Staged) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut expect = |what: &str, got: &[T], want: &[T]| {
        if bits(got) != bits(want) {
            wrong.push(format!("{} {what} (world {world}, rank {rank})", T::NAME));
        }
    };
    // Odd shard lengths: byte lengths that are not multiples of 8 for the 2-byte types.
    for k in [0usize, 1, 37] {
        let n = k * world;
        let seed = (k * 10 + world) as u64;
        let ins = all::<T>(seed, world, n);
        let mut tree = vec![T::default(); n];
        fixed_tree::reduce(&views(&ins), &mut tree).unwrap();
        let shard = |v: &[T]| v[rank * k..(rank + 1) * k].to_vec();

        // all_reduce.
        let mut out = vec![T::of(7.0); n];
        t.all_reduce(Io::host(&ins[rank], &mut out), &()).expect("all_reduce");
        expect("all_reduce", &out, &tree);
        let mut buf = ins[rank].clone();
        t.all_reduce(Io::host_in_place(&mut buf), &()).expect("all_reduce in place");
        expect("all_reduce in place", &buf, &tree);

        // reduce_scatter.
        let mut want = vec![T::default(); k];
        fixed_tree::reduce_scatter(&views(&ins), rank, &mut want).unwrap();
        let mut out = vec![T::of(7.0); k];
        t.reduce_scatter(Io::host(&ins[rank], &mut out), &()).expect("reduce_scatter");
        expect("reduce_scatter", &out, &want);
        let mut buf = ins[rank].clone();
        t.reduce_scatter(Io::host_in_place(&mut buf), &()).expect("reduce_scatter in place");
        expect("reduce_scatter in place (shard)", &shard(&buf), &want);
        // Only the shard is written back: the rest of the buffer is the caller's input still.
        let mut rest = buf.clone();
        rest[rank * k..(rank + 1) * k].copy_from_slice(&shard(&ins[rank]));
        expect("reduce_scatter in place (rest)", &rest, &ins[rank]);

        // all_gather of every rank's shard of its input.
        let chunks: Vec<Vec<T>> = ins.iter().map(|v| v[..k].to_vec()).collect();
        let mut gathered = vec![T::default(); n];
        fixed_tree::all_gather(&views(&chunks), &mut gathered).unwrap();
        let mut out = vec![T::of(7.0); n];
        t.all_gather(Io::host(&chunks[rank], &mut out), &()).expect("all_gather");
        expect("all_gather", &out, &gathered);
        let mut buf = vec![T::of(-3.0); n];
        buf[rank * k..(rank + 1) * k].copy_from_slice(&chunks[rank]);
        t.all_gather(Io::host_in_place(&mut buf), &()).expect("all_gather in place");
        expect("all_gather in place", &buf, &gathered);

        // reduce_scatter_many: three lanes of different lengths, the middle one in place, in
        // one host call; and one lane through `call` (a reduce_scatter_many of one lane).
        let lens = [n, 2 * n + world, world];
        let lane_ins: Vec<Vec<Vec<T>>> =
            lens.iter().enumerate().map(|(l, &m)| all::<T>(seed * 7 + l as u64, world, m)).collect();
        let lane_views: Vec<Vec<&[T]>> = lane_ins.iter().map(|v| views(v)).collect();
        let lane_refs: Vec<&[&[T]]> = lane_views.iter().map(Vec::as_slice).collect();
        let mut wants: Vec<Vec<T>> = lens.iter().map(|m| vec![T::default(); m / world]).collect();
        let mut want_refs: Vec<&mut [T]> = wants.iter_mut().map(Vec::as_mut_slice).collect();
        fixed_tree::reduce_scatter_many(&lane_refs, rank, &mut want_refs).unwrap();
        let mut o0 = vec![T::of(7.0); lens[0] / world];
        let mut b1 = lane_ins[1][rank].clone();
        let mut o2 = vec![T::of(7.0); lens[2] / world];
        let lanes =
            [Io::host(&lane_ins[0][rank], &mut o0), Io::host_in_place(&mut b1), Io::host(&lane_ins[2][rank], &mut o2)];
        t.reduce_scatter_many(&lanes, &()).expect("reduce_scatter_many");
        let m1 = lens[1] / world;
        expect("reduce_scatter_many lane 0", &o0, &wants[0]);
        expect("reduce_scatter_many lane 1 (in place)", &b1[rank * m1..(rank + 1) * m1], &wants[1]);
        expect("reduce_scatter_many lane 2", &o2, &wants[2]);
        let mut o = vec![T::of(7.0); lens[0] / world];
        t.call(Op::ReduceScatterMany, Io::host(&lane_ins[0][rank], &mut o), &()).expect("one lane");
        expect("reduce_scatter_many of one lane", &o, &wants[0]);
    }
    wrong
}

#[test]
fn every_op_gives_fixed_tree_bits_in_and_out_of_place() {
    for world in [1usize, 2, 3, 5, 8] {
        let wrong: Vec<String> = ranks(world, |rank, t| {
            let mut w = every_op::<f32>(rank, world, &t);
            w.extend(every_op::<bf16>(rank, world, &t));
            w.extend(every_op::<f16>(rank, world, &t));
            t.synchronize(&()).expect("synchronize");
            assert!(t.device().copies() > 0, "the calls went through the device's host copies");
            t.close().expect("close");
            w
        })
        .into_iter()
        .flatten()
        .collect();
        assert!(wrong.is_empty(), "world {world}: {wrong:#?}");
    }
}

#[test]
fn refused_calls_write_nothing_and_touch_no_device() {
    ranks(2, |rank, t| {
        let input = data::<f32>(1, rank, 8);
        // all_reduce into an output of the wrong length.
        let mut out = vec![5.0f32; 7];
        let r = t.all_reduce(Io::host(&input, &mut out), &());
        assert!(matches!(r, Err(Error::LengthMismatch { argument: "output", .. })), "{r:?}");
        assert_eq!(out, [5.0; 7]);
        // reduce_scatter_many whose second lane does not divide: no lane written.
        let mut o0 = vec![5.0f32; 4];
        let mut o1 = vec![5.0f32; 2];
        let odd = data::<f32>(2, rank, 5);
        let r = t.reduce_scatter_many(&[Io::host(&input, &mut o0), Io::host(&odd, &mut o1)], &());
        assert!(matches!(r, Err(Error::NotDivisible { .. })), "{r:?}");
        assert_eq!((o0.as_slice(), o1.as_slice()), ([5.0; 4].as_slice(), [5.0; 2].as_slice()));
        // A dtype the op cannot reduce.
        let bytes = [1u8; 8];
        let mut ob = [5u8; 8];
        let r = t.all_reduce(Io::host(&bytes, &mut ob), &());
        assert!(matches!(r, Err(Error::UnsupportedDtype { .. })), "{r:?}");
        assert_eq!(ob, [5u8; 8]);
        assert_eq!(t.device().copies(), 0, "a refused call must not touch the device");
        // A refusal does not poison: the next call works.
        t.check().expect("not poisoned");
        let mut out = vec![0.0f32; 8];
        t.all_reduce(Io::host(&input, &mut out), &()).expect("all_reduce after refusals");
    });
}

#[test]
fn a_captured_stream_is_refused_before_any_copy() {
    ranks(2, |rank, t| {
        t.device().inner.capturing.store(true, Ordering::SeqCst);
        let input = data::<f32>(3, rank, 8);
        let mut out = vec![5.0f32; 8];
        let r = t.all_reduce(Io::host(&input, &mut out), &());
        match &r {
            Err(Error::InvalidConfig { detail }) => assert!(detail.contains("captured"), "{detail}"),
            other => panic!("{other:?}"),
        }
        let r = t.reduce_scatter_many(&[Io::host(&input, &mut out[..4])], &());
        assert!(matches!(r, Err(Error::InvalidConfig { .. })), "{r:?}");
        assert_eq!((out, t.device().copies()), (vec![5.0; 8], 0));
        assert!(!t.capabilities().supports_graph_capture);
        // Uncaptured again: the calls run (the refusal did not poison, and no rank exchanged).
        t.device().inner.capturing.store(false, Ordering::SeqCst);
        let mut out = vec![0.0f32; 8];
        t.all_reduce(Io::host(&input, &mut out), &()).expect("all_reduce after the capture");
    });
}

#[test]
fn a_peer_that_drops_its_handle_gives_the_others_a_typed_error() {
    ranks(3, |rank, t| {
        let input = data::<f32>(4, rank, 12);
        let mut out = vec![0.0f32; 12];
        t.all_reduce(Io::host(&input, &mut out), &()).expect("first all_reduce");
        if rank == 2 {
            drop(t);
            return;
        }
        let mut out = vec![5.0f32; 12];
        let r = t.all_reduce(Io::host(&input, &mut out), &());
        assert!(matches!(r, Err(Error::Bootstrap(BootstrapError::PeerGone { rank: 2, .. }))), "rank {rank}: {r:?}");
        // The failed host call left the device output untouched.
        assert_eq!(out, vec![5.0; 12]);
        // Poisoned from now on, typed, without waiting.
        assert!(matches!(t.check(), Err(Error::Poisoned { .. })), "{:?}", t.check());
        let r = t.all_gather(Io::host(&input[..4], &mut out), &());
        assert!(matches!(r, Err(Error::Poisoned { .. })), "{r:?}");
        assert!(matches!(t.synchronize(&()), Err(Error::Poisoned { .. })));
    });
}

#[test]
fn calls_after_close_are_refused() {
    ranks(2, |rank, t| {
        t.close().expect("close");
        t.close().expect("close twice");
        let input = data::<f32>(5, rank, 4);
        let mut out = vec![5.0f32; 4];
        assert!(matches!(t.all_reduce(Io::host(&input, &mut out), &()), Err(Error::Closed)));
        assert!(matches!(t.check(), Err(Error::Closed)));
        assert_eq!((out, t.device().copies()), (vec![5.0; 4], 0));
    });
}

#[test]
fn raw_views_of_the_raw_entry_points_are_staged_alike() {
    ranks(2, |rank, t| {
        let input = data::<f32>(6, rank, 6);
        let mut out = vec![0.0f32; 6];
        let ins = all::<f32>(6, 2, 6);
        let mut want = vec![0.0f32; 6];
        fixed_tree::reduce(&views(&ins), &mut want).unwrap();
        // SAFETY: `input` and `out` outlive the calls, which return with the output landed.
        unsafe {
            let io = Io::OutOfPlace {
                input: RawRef::from_raw(input.as_ptr() as u64, 6, DType::F32),
                output: RawMut::from_raw(out.as_mut_ptr() as u64, 6, DType::F32),
            };
            t.enqueue(Op::AllReduce, io, RawStream(core::ptr::null_mut())).expect("enqueue");
        }
        assert_eq!(bits(&out), bits(&want));
        let mut shard = vec![0.0f32; 3];
        // SAFETY: as above.
        unsafe {
            let io = Io::OutOfPlace {
                input: RawRef::from_raw(input.as_ptr() as u64, 6, DType::F32),
                output: RawMut::from_raw(shard.as_mut_ptr() as u64, 3, DType::F32),
            };
            t.enqueue_many(&[io], RawStream(core::ptr::null_mut())).expect("enqueue_many");
        }
        assert_eq!(bits(&shard), bits(&want[rank * 3..rank * 3 + 3]));
    });
}

/// How a test makes a `reduce_scatter_many` signed with a part.
#[derive(Clone, Copy, Debug)]
enum Entry {
    /// `Collective::reduce_scatter_many_as_part` (what `Routed` calls on the transport route).
    Safe,
    /// `StagedTransport::enqueue_many_as_part` (what the raw entry points reach through
    /// `GpuTransport::enqueue_many`).
    Raw,
    /// `Collective::call_as_part` with `Op::ReduceScatterMany` (one lane only).
    CallAsPart,
}

/// What one rank's signed `reduce_scatter_many` gave: its result, every lane's caller buffer
/// (bits) before and after the call, and what `fixed-tree` says the buffers hold after a
/// successful call.
struct Signed {
    result: Result<(), Error>,
    before: Vec<Vec<u32>>,
    after: Vec<Vec<u32>>,
    want: Vec<Vec<u32>>,
}

/// One `reduce_scatter_many` of `lanes` lanes on this rank of a world of 2, signed with
/// `part`, through `entry`. Lanes of different lengths; the odd ones in place (only the shard
/// is written), the even ones out of place into outputs of a sentinel value.
fn signed_many(rank: usize, t: &Staged, lanes: usize, part: u32, entry: Entry) -> Signed {
    const WORLD: usize = 2;
    let lens: Vec<usize> = (0..lanes).map(|l| WORLD * (3 + 2 * l)).collect();
    let ins: Vec<Vec<Vec<f32>>> = lens.iter().enumerate().map(|(l, &n)| all::<f32>(40 + l as u64, WORLD, n)).collect();
    let mut bufs: Vec<Vec<f32>> = lens
        .iter()
        .enumerate()
        .map(|(l, &n)| if l % 2 == 1 { ins[l][rank].clone() } else { vec![7.0; n / WORLD] })
        .collect();
    let want: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(l, &n)| {
            let k = n / WORLD;
            let mut shard = vec![0.0f32; k];
            fixed_tree::reduce_scatter(&views(&ins[l]), rank, &mut shard).unwrap();
            if l % 2 == 1 {
                let mut whole = ins[l][rank].clone();
                whole[rank * k..(rank + 1) * k].copy_from_slice(&shard);
                bits(&whole)
            } else {
                bits(&shard)
            }
        })
        .collect();
    let before: Vec<Vec<u32>> = bufs.iter().map(|b| bits(b)).collect();
    let ios: Vec<Io<'_>> = bufs
        .iter_mut()
        .enumerate()
        .map(|(l, b)| if l % 2 == 1 { Io::host_in_place(b) } else { Io::host(&ins[l][rank], b) })
        .collect();
    let result = match entry {
        Entry::Safe => t.reduce_scatter_many_as_part(&ios, part, &()),
        // SAFETY: the host device's memory is host memory; the views borrow `ins` and `bufs`,
        // which outlive the call, and it returns with the outputs landed.
        Entry::Raw => unsafe { t.enqueue_many_as_part(&ios, part, RawStream(core::ptr::null_mut())) },
        Entry::CallAsPart => match <[Io<'_>; 1]>::try_from(ios) {
            Ok([io]) => t.call_as_part(Op::ReduceScatterMany, io, part, &()),
            Err(ios) => panic!("call_as_part takes one lane, not {}", ios.len()),
        },
    };
    Signed { result, before, after: bufs.iter().map(|b| bits(b)).collect(), want }
}

/// The ways every lane count is made: the safe and raw `reduce_scatter_many`, and a lone
/// lane through `call_as_part` too.
fn entries(lanes: usize) -> &'static [Entry] {
    if lanes == 1 { &[Entry::Safe, Entry::Raw, Entry::CallAsPart] } else { &[Entry::Safe, Entry::Raw] }
}

/// Ranks one refused call apart: the front door numbered the call rank 0 refused alone, so
/// rank 0 signs its next call with number 2 while rank 1 signs the same shape of call with
/// number 1 (`Signature::call_split`). Every lane count — none, one, several — must fail on
/// both ranks with `SignatureMismatch` naming the other, write nothing and poison; before,
/// a `reduce_scatter_many` of no lane or of several dropped the part and returned `Ok`,
/// pairing the two calls.
#[test]
fn reduce_scatter_many_of_ranks_one_call_apart_fails_with_signature_mismatch() {
    let parts = [Signature::call_split(2, 0), Signature::call_split(1, 0)];
    let mut wrong = Vec::new();
    for lanes in [0usize, 1, 2, 3] {
        for &entry in entries(lanes) {
            wrong.extend(ranks(2, |rank, t| {
                let s = signed_many(rank, &t, lanes, parts[rank], entry);
                let case = format!("{lanes} lanes, {entry:?}, rank {rank}");
                let mut wrong = Vec::new();
                match &s.result {
                    Err(Error::SignatureMismatch { peer, ours, theirs })
                        if *peer == 1 - rank && ours.split != theirs.split => {}
                    other => wrong.push(format!("{case}: expected SignatureMismatch from the peer, got {other:?}")),
                }
                if s.after != s.before {
                    wrong.push(format!("{case}: a mismatched call wrote an output"));
                }
                if !matches!(t.check(), Err(Error::Poisoned { .. })) {
                    wrong.push(format!("{case}: not poisoned: {:?}", t.check()));
                }
                wrong
            }));
        }
    }
    let wrong: Vec<String> = wrong.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The same calls with equal parts pair: `Ok`, every lane bit for bit `fixed-tree`'s.
#[test]
fn reduce_scatter_many_with_equal_parts_gives_fixed_tree_bits() {
    let part = Signature::call_split(1, 0);
    let mut wrong = Vec::new();
    for lanes in [0usize, 1, 2, 3] {
        for &entry in entries(lanes) {
            wrong.extend(ranks(2, |rank, t| {
                let s = signed_many(rank, &t, lanes, part, entry);
                let case = format!("{lanes} lanes, {entry:?}, rank {rank}");
                match (&s.result, t.check()) {
                    (Ok(()), Ok(())) if s.after == s.want => None,
                    (Ok(()), Ok(())) => Some(format!("{case}: not fixed-tree's bits")),
                    (r, c) => Some(format!("{case}: {r:?}, check {c:?}")),
                }
            }));
        }
    }
    let wrong: Vec<String> = wrong.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}
