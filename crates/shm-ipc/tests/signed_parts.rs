//! `Collective::reduce_scatter_many_as_part` and `Collective::call_as_part` on the IPC backends,
//! ranks as threads on the CPU twin: the trait's own entries (not the factory's
//! `RouteSelect` path) sign the call with its part, on `ShmCollective` and on the engine it
//! wraps (`IpcCollective<HostDevice>`, the generic type `CudaIpcCollective` and
//! `HipIpcCollective` name). Ranks one call apart (`Signature::call_split` of different call
//! numbers) fail with `SignatureMismatch` at once, writing nothing; equal parts give
//! `fixed-tree`'s bits. Before, the engine and the wrapper took the trait's default
//! `reduce_scatter_many_as_part`, which dropped the part: the two calls paired and returned
//! `Ok` with one another's data.
use collective_core::{Collective, Error, Io, Op, Route, RouteTable, Signature, SizeRoutes, Timeouts};
use shm_ipc::{ShmCollective, ShmConfig};
use std::time::{Duration, Instant};

const WORLD: usize = 2;
/// Staging per frame: the large lanes below take several chunks of it.
const CAP: usize = 4096;
/// LL push payload per rank: the small lanes fit it, the large ones do not.
const LL: usize = 1024;
/// Every wait's bound. A mismatch is seen at the first exchange, long before it: a call that
/// took this long waited for a peer that made another call.
const BOUND: Duration = Duration::from_secs(3);

/// LL push up to `LL` bytes per rank, one-shot above (chunked above `CAP`).
fn config() -> ShmConfig {
    ShmConfig::new(CAP)
        .with_ll_capacity(LL)
        .with_routes(RouteTable::by_size(SizeRoutes { ll_up_to: Some(LL), ..SizeRoutes::default() }))
        .with_timeouts(Timeouts { peer: BOUND, close: Duration::from_millis(300) })
}

/// Runs `f(rank handle, rank)` on every rank, one thread each; results in rank order.
fn on_all<T: Send>(comms: &[ShmCollective], f: impl Fn(&ShmCollective, usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(c, r))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Rank `r`'s input of lane `l`: `n` values of different magnitudes (the order of additions
/// shows in the bits), distinct per rank, lane and index.
fn input(r: usize, l: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + r * 131 + l * 17) % 1000) as f32 * 0.013 * 10f32.powi((i % 7) as i32 - 3) - 3.1).collect()
}

/// Which handle a case calls the trait method on.
#[derive(Clone, Copy, Debug)]
enum Handle {
    /// `ShmCollective`, the CPU twin's wrapper.
    Shm,
    /// `IpcCollective<HostDevice>` (`ShmCollective::engine`): the engine the CUDA and HIP
    /// backends are, on the host device.
    Engine,
}

/// Which trait entry makes the signed `reduce_scatter_many`.
#[derive(Clone, Copy, Debug)]
enum Entry {
    /// `Collective::reduce_scatter_many_as_part`.
    ManyAsPart,
    /// `Collective::call_as_part` with `Op::ReduceScatterMany` (one lane only).
    CallAsPart,
}

/// Lane sizes: `Small` fits the LL slots (the LL push route), `Large` runs one-shot in several
/// chunks of the staging.
#[derive(Clone, Copy, Debug)]
enum Size {
    Small,
    Large,
}

/// What one rank's signed call gave: its result, every lane's caller buffer (bits) before and
/// after, what `fixed-tree` says they hold after a successful call, and how long it took.
struct Signed {
    result: Result<(), Error>,
    before: Vec<Vec<u32>>,
    after: Vec<Vec<u32>>,
    want: Vec<Vec<u32>>,
    took: Duration,
}

/// One `reduce_scatter_many` of `lanes` lanes on this rank through `entry` of `c`, signed with
/// `part`. Lanes of different lengths; the odd ones in place (only the shard is written), the
/// even ones out of place into outputs of a sentinel value.
fn signed_many<C: Collective<Stream = ()> + ?Sized>(
    c: &C,
    rank: usize,
    lanes: usize,
    size: Size,
    part: u32,
    entry: Entry,
) -> Signed {
    let base = match size {
        Size::Small => 3,
        Size::Large => 700,
    };
    let lens: Vec<usize> = (0..lanes).map(|l| WORLD * (base + 2 * l)).collect();
    let ins: Vec<Vec<Vec<f32>>> =
        lens.iter().enumerate().map(|(l, &n)| (0..WORLD).map(|r| input(r, l, n)).collect()).collect();
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
            let views: Vec<&[f32]> = ins[l].iter().map(Vec::as_slice).collect();
            fixed_tree::reduce_scatter(&views, rank, &mut shard).expect("reference");
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
    // The route each size is meant to take (no lane: 0 bytes, LL push), and a large call
    // above the staging (chunked).
    let bytes = lens.iter().sum::<usize>() * size_of::<f32>();
    let want_route = match size {
        Size::Large if lanes > 0 => Route::IpcOneShot,
        _ => Route::IpcPushLl,
    };
    assert_eq!(c.route(Op::ReduceScatterMany, bytes), want_route, "{lanes} {size:?} lanes take the route meant");
    assert!(want_route == Route::IpcPushLl || bytes > CAP, "{lanes} {size:?} lanes: {bytes} bytes are not chunked");
    let start = Instant::now();
    let result = match entry {
        Entry::ManyAsPart => c.reduce_scatter_many_as_part(&ios, part, &()),
        Entry::CallAsPart => match <[Io<'_>; 1]>::try_from(ios) {
            Ok([io]) => c.call_as_part(Op::ReduceScatterMany, io, part, &()),
            Err(ios) => panic!("call_as_part takes one lane, not {}", ios.len()),
        },
    };
    let took = start.elapsed();
    Signed { result, before, after: bufs.iter().map(|b| bits(b)).collect(), want, took }
}

/// Every case: handle, entry, lane count (none too: an empty call is a call of the group) and
/// size. A lone lane through `call_as_part` too.
fn cases() -> Vec<(Handle, Entry, usize, Size)> {
    let mut v = Vec::new();
    for handle in [Handle::Shm, Handle::Engine] {
        for size in [Size::Small, Size::Large] {
            for lanes in [0usize, 1, 2, 3] {
                v.push((handle, Entry::ManyAsPart, lanes, size));
            }
            v.push((handle, Entry::CallAsPart, 1, size));
        }
    }
    v
}

/// `signed_many` on `c` as `handle` names it.
fn run(c: &ShmCollective, handle: Handle, rank: usize, lanes: usize, size: Size, part: u32, entry: Entry) -> Signed {
    match handle {
        Handle::Shm => signed_many(c, rank, lanes, size, part, entry),
        Handle::Engine => signed_many(c.engine(), rank, lanes, size, part, entry),
    }
}

/// Ranks one call apart: rank 0 signs its call with the front door's number 2, rank 1 the
/// same shape of call with number 1. Both must fail at once with `SignatureMismatch` naming
/// the other, write nothing, and poison the handle.
#[test]
fn trait_calls_of_ranks_one_call_apart_fail_with_signature_mismatch() {
    let parts = [Signature::call_split(2, 0), Signature::call_split(1, 0)];
    let mut wrong = Vec::new();
    for (handle, entry, lanes, size) in cases() {
        let comms = ShmCollective::group(WORLD, config()).expect("group");
        wrong.extend(on_all(&comms, |c, rank| {
            let s = run(c, handle, rank, lanes, size, parts[rank], entry);
            let case = format!("{handle:?} {entry:?}, {lanes} {size:?} lanes, rank {rank}");
            let mut wrong = Vec::new();
            match &s.result {
                Err(Error::SignatureMismatch { peer, ours, theirs })
                    if *peer == 1 - rank && ours.split != theirs.split => {}
                other => wrong.push(format!("{case}: expected SignatureMismatch from the peer, got {other:?}")),
            }
            if s.took >= BOUND {
                wrong.push(format!("{case}: took {:?}, not under the {BOUND:?} bound", s.took));
            }
            if s.after != s.before {
                wrong.push(format!("{case}: a mismatched call wrote an output"));
            }
            if !matches!(c.check(), Err(Error::Poisoned { .. })) {
                wrong.push(format!("{case}: not poisoned: {:?}", c.check()));
            }
            wrong
        }));
    }
    let wrong: Vec<String> = wrong.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The same calls with equal parts pair: `Ok`, every lane bit for bit `fixed-tree`'s; and a
/// part of 0 is the unsigned call (`reduce_scatter_many`), which pairs with it.
#[test]
fn trait_calls_with_equal_parts_give_fixed_tree_bits() {
    let mut wrong = Vec::new();
    for part in [Signature::call_split(1, 0), 0] {
        for (handle, entry, lanes, size) in cases() {
            let comms = ShmCollective::group(WORLD, config()).expect("group");
            wrong.extend(on_all(&comms, |c, rank| {
                let s = run(c, handle, rank, lanes, size, part, entry);
                let case = format!("{handle:?} {entry:?}, {lanes} {size:?} lanes, part {part:#x}, rank {rank}");
                match (&s.result, c.check()) {
                    (Ok(()), Ok(())) if s.after == s.want => None,
                    (Ok(()), Ok(())) => Some(format!("{case}: not fixed-tree's bits")),
                    (r, k) => Some(format!("{case}: {r:?}, check {k:?}")),
                }
            }));
        }
    }
    let wrong: Vec<String> = wrong.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Part 0 is the plain call: one rank's `reduce_scatter_many_as_part(.., 0, ..)` pairs with
/// its peer's `reduce_scatter_many`, and both get `fixed-tree`'s bits.
#[test]
fn part_zero_pairs_with_the_unsigned_call() {
    for handle in [Handle::Shm, Handle::Engine] {
        let comms = ShmCollective::group(WORLD, config()).expect("group");
        let got = on_all(&comms, |c, rank| {
            let n = WORLD * 5;
            let ins: Vec<Vec<f32>> = (0..WORLD).map(|r| input(r, 0, n)).collect();
            let mut out = vec![7.0f32; n / WORLD];
            let lanes = [Io::host(&ins[rank], &mut out)];
            let result = match (handle, rank) {
                (Handle::Shm, 0) => c.reduce_scatter_many_as_part(&lanes, 0, &()),
                (Handle::Shm, _) => c.reduce_scatter_many(&lanes, &()),
                (Handle::Engine, 0) => c.engine().reduce_scatter_many_as_part(&lanes, 0, &()),
                (Handle::Engine, _) => Collective::reduce_scatter_many(c.engine(), &lanes, &()),
            };
            let views: Vec<&[f32]> = ins.iter().map(Vec::as_slice).collect();
            let mut want = vec![0.0f32; n / WORLD];
            fixed_tree::reduce_scatter(&views, rank, &mut want).expect("reference");
            (result, bits(&out) == bits(&want))
        });
        for (rank, (result, same)) in got.into_iter().enumerate() {
            assert!(matches!(result, Ok(())) && same, "{handle:?} rank {rank}: {result:?}, fixed-tree bits: {same}");
        }
    }
}
