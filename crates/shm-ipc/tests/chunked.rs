//! Calls above the staging capacity on the CPU twin, ranks as threads: every op on every route
//! at 1x, 3.5x and 10x a small capacity (4 KiB of staging, 1 KiB of LL slots), aligned and
//! unaligned sizes, in place and out of place, gives exactly the bits of the fixed tree (the
//! concatenation for all_gather); `reduce_scatter_many` with lanes above capacity too; ranks
//! whose calls share their first chunk but not their size fail with a signature mismatch.
use collective_core::Timeouts;
use collective_core::{Collective, Error, Io, IpcRoute, Op, Plain, RouteSelect};
use half::bf16;
use shm_ipc::{ShmCollective, ShmConfig};
use std::time::Duration;

const CAP: usize = 4096;
const LL: usize = 1024;

fn config() -> ShmConfig {
    ShmConfig::new(CAP)
        .with_ll_capacity(LL)
        .with_timeouts(Timeouts { peer: Duration::from_secs(5), close: Duration::from_millis(300) })
}

fn on_all<T: Send>(comms: &[ShmCollective], f: impl Fn(&ShmCollective, usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(c, r))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Values of very different magnitudes (so the order of additions shows in the bits), signed
/// zeros, subnormals and infinities (so NaN results too), distinct per rank and index. No NaN
/// inputs: NaN payloads are not part of the contract, and an optimised reference build may
/// propagate another payload.
fn values(r: usize, n: usize) -> Vec<f32> {
    const SPECIAL: [u32; 5] = [0x8000_0000, 0x0000_0001, 0x7f80_0000, 0xff80_0000, 0x8040_0000];
    (0..n)
        .map(|i| match (i + 3 * r) % 41 {
            0 => f32::from_bits(SPECIAL[(i / 41 + r) % SPECIAL.len()]),
            k => ((i * 7 + r * 131) % 1000) as f32 * 0.013 * 10f32.powi((k % 9) as i32 * 3 - 12) - 3.1,
        })
        .collect()
}

/// The byte image of a plain slice.
fn bytes<T: Plain>(v: &[T]) -> Vec<u8> {
    // SAFETY: `Plain` types are plain old data without padding; the slice is initialised.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }.to_vec()
}

/// Per-rank input element counts of 1x, 3.5x and 10x `CAP` bytes, and unaligned ones near them;
/// for reduce_scatter multiples of `world`.
fn counts(op: Op, size: usize, world: usize) -> Vec<usize> {
    let e = CAP / size;
    let v = [e, e + 1, 7 * e / 2, 7 * e / 2 + 3, 10 * e, 10 * e - 5];
    v.into_iter().map(|n| if op == Op::ReduceScatter { n.div_ceil(world) * world } else { n }).collect()
}

fn routes(op: Op) -> &'static [IpcRoute] {
    match op {
        Op::AllReduce => &[IpcRoute::OneShot, IpcRoute::ReduceScatterAllGather, IpcRoute::PushLl, IpcRoute::Push],
        _ => &[IpcRoute::OneShot, IpcRoute::PushLl, IpcRoute::Push],
    }
}

/// Every reducing op of `T` on every route against `fixed_tree::reduce`, bit for bit.
fn reductions_match_the_tree<T: Plain + fixed_tree::Element + Copy + Send + Sync>(make: impl Fn(f32) -> T + Sync) {
    for world in [2, 4, 8] {
        let comms = ShmCollective::group(world, config()).unwrap();
        for op in [Op::AllReduce, Op::ReduceScatter] {
            for n in counts(op, size_of::<T>(), world) {
                let inputs: Vec<Vec<T>> = (0..world).map(|r| values(r, n).into_iter().map(&make).collect()).collect();
                let views: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
                let mut tree = vec![make(0.0); n];
                fixed_tree::reduce(&views, &mut tree).unwrap();
                let m = if op == Op::AllReduce { n } else { n / world };
                for &route in routes(op) {
                    for in_place in [false, true] {
                        let outs = on_all(&comms, |c, r| {
                            if in_place {
                                let mut buf = inputs[r].clone();
                                c.call_on_route(op, Io::host_in_place(&mut buf), route, &()).map(|()| {
                                    let at = if op == Op::AllReduce { 0 } else { r * m };
                                    buf[at..at + m].to_vec()
                                })
                            } else {
                                let mut out = vec![make(0.0); m];
                                c.call_on_route(op, Io::host(&inputs[r], &mut out), route, &()).map(|()| out)
                            }
                        });
                        for (r, out) in outs.into_iter().enumerate() {
                            let label = format!("{op} {route:?} world {world} n {n} in place {in_place} rank {r}");
                            let out = out.unwrap_or_else(|e| panic!("{label}: {e}"));
                            let at = if op == Op::AllReduce { 0 } else { r * m };
                            assert!(bytes(&out) == bytes(&tree[at..at + m]), "{label}: bits differ from the tree");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn all_reduce_and_reduce_scatter_above_capacity_give_the_tree_bits() {
    reductions_match_the_tree(|x| x);
    reductions_match_the_tree(bf16::from_f32);
}

/// all_gather of `T` on every route: exactly the concatenation, and nothing written around it.
fn gather_is_the_concatenation<T: Plain + Copy + Send + Sync + PartialEq>(make: impl Fn(usize, usize) -> T + Sync) {
    for world in [2, 4, 8] {
        let comms = ShmCollective::group(world, config()).unwrap();
        for n in counts(Op::AllGather, size_of::<T>(), world) {
            let inputs: Vec<Vec<T>> = (0..world).map(|r| (0..n).map(|i| make(r, i)).collect()).collect();
            let want = bytes(&inputs.concat());
            for &route in routes(Op::AllGather) {
                for in_place in [false, true] {
                    let outs = on_all(&comms, |c, r| {
                        // One guard element on each side of the output.
                        let mut buf = vec![make(99, 99); n * world + 2];
                        if in_place {
                            buf[1 + r * n..1 + (r + 1) * n].copy_from_slice(&inputs[r]);
                            let io = Io::host_in_place(&mut buf[1..1 + n * world]);
                            c.call_on_route(Op::AllGather, io, route, &()).map(|()| buf)
                        } else {
                            let io = Io::host(&inputs[r], &mut buf[1..1 + n * world]);
                            c.call_on_route(Op::AllGather, io, route, &()).map(|()| buf)
                        }
                    });
                    for (r, out) in outs.into_iter().enumerate() {
                        let label = format!("all_gather {route:?} world {world} n {n} in place {in_place} rank {r}");
                        let out = out.unwrap_or_else(|e| panic!("{label}: {e}"));
                        assert!(out[0] == make(99, 99) && out[n * world + 1] == make(99, 99), "{label}: guard");
                        assert!(bytes(&out[1..1 + n * world]) == want, "{label}: not the concatenation");
                    }
                }
            }
        }
    }
}

#[test]
fn all_gather_above_capacity_is_the_concatenation() {
    gather_is_the_concatenation(|r, i| f32::from_bits((r as u32) << 24 ^ i as u32 ^ 0x7fc0_0000));
    gather_is_the_concatenation(|r, i| (i * 31 + r * 7) as u8);
    gather_is_the_concatenation(|r, i| -((i as i64) << 40) ^ (r as i64 * 0x0101));
}

#[test]
fn reduce_scatter_many_above_capacity_gives_every_lane_its_tree() {
    for world in [2, 4, 8] {
        let comms = ShmCollective::group(world, config()).unwrap();
        let per_frame = CAP / 4 / world;
        // A lane above capacity between small ones; lanes that fit only one by one; one lane of
        // 10x capacity; an empty lane among them.
        let layouts: [Vec<usize>; 4] = [
            vec![world, (7 * per_frame / 2 + 3) * world, 5 * world],
            vec![per_frame / 2 * world, 2 * per_frame / 3 * world, per_frame / 2 * world, world],
            vec![10 * per_frame * world],
            vec![3 * world, 0, (per_frame + 1) * world, 0],
        ];
        for sizes in layouts {
            let inputs: Vec<Vec<Vec<f32>>> =
                (0..world).map(|r| sizes.iter().enumerate().map(|(l, &n)| values(r + 5 * l, n)).collect()).collect();
            for route in [IpcRoute::OneShot, IpcRoute::PushLl] {
                let outs = on_all(&comms, |c, r| {
                    let mut outs: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0f32; n / world]).collect();
                    let lanes: Vec<Io<'_>> =
                        inputs[r].iter().zip(outs.iter_mut()).map(|(i, o)| Io::host(i, o)).collect();
                    c.reduce_scatter_many_on_route(&lanes, route, &()).map(|()| outs)
                });
                for (r, out) in outs.into_iter().enumerate() {
                    let label = format!("reduce_scatter_many {sizes:?} {route:?} world {world} rank {r}");
                    let out = out.unwrap_or_else(|e| panic!("{label}: {e}"));
                    for (l, &n) in sizes.iter().enumerate() {
                        let views: Vec<&[f32]> = inputs.iter().map(|i| i[l].as_slice()).collect();
                        let mut tree = vec![0f32; n];
                        fixed_tree::reduce(&views, &mut tree).unwrap();
                        let m = n / world;
                        assert!(bytes(&out[l]) == bytes(&tree[r * m..(r + 1) * m]), "{label}: lane {l} differs");
                    }
                }
            }
        }
        // The collective keeps working with small calls after the chunked ones.
        let outs = on_all(&comms, |c, r| {
            let mut out = [0f32; 4];
            c.all_reduce(Io::host(&[r as f32; 4], &mut out), &()).map(|()| out)
        });
        let want = (0..world).map(|r| r as f32).sum::<f32>();
        assert!(outs.into_iter().all(|o| o.unwrap() == [want; 4]));
    }
}

/// Rank 0 makes `first`, every other rank `other`: both ranks' first chunks are the same
/// elements, but the calls differ; every rank must report a signature mismatch.
fn expect_mismatch(world: usize, call: impl Fn(&ShmCollective, usize) -> Result<(), Error> + Sync, what: &str) {
    let comms = ShmCollective::group(world, config()).unwrap();
    let results = on_all(&comms, call);
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Err(Error::SignatureMismatch { ours, theirs, .. }) => assert_ne!(ours, theirs),
            other => panic!("{what} world {world} rank {r}: expected a signature mismatch, got {other:?}"),
        }
    }
}

#[test]
fn calls_of_another_size_that_share_the_first_chunk_are_a_mismatch() {
    for world in [2, 4] {
        for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
            for &route in routes(op) {
                // 3.5x and 3.5x + 4 elements (shard elements for reduce_scatter).
                let n = |r: usize| {
                    let unit = if op == Op::ReduceScatter { world } else { 1 };
                    (7 * CAP / 8 / unit + if r == 0 { 0 } else { 4 }) * unit
                };
                expect_mismatch(
                    world,
                    |c, r| {
                        let input = values(r, n(r));
                        let m = match op {
                            Op::AllReduce => n(r),
                            Op::AllGather => n(r) * world,
                            _ => n(r) / world,
                        };
                        let mut out = vec![0f32; m];
                        c.call_on_route(op, Io::host(&input, &mut out), route, &())
                    },
                    &format!("{op} {route:?}"),
                );
            }
        }
        // reduce_scatter_many: the same total, lanes split differently, both above capacity.
        let big = (CAP / 4 / world * 3) * world;
        expect_mismatch(
            world,
            |c, r| {
                let sizes = if r == 0 { [big, 2 * big] } else { [2 * big, big] };
                let inputs: Vec<Vec<f32>> = sizes.iter().map(|&n| values(r, n)).collect();
                let mut outs: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0f32; n / world]).collect();
                let lanes: Vec<Io<'_>> = inputs.iter().zip(outs.iter_mut()).map(|(i, o)| Io::host(i, o)).collect();
                c.reduce_scatter_many(&lanes, &())
            },
            "reduce_scatter_many",
        );
    }
}

#[test]
fn capabilities_promise_calls_of_any_size() {
    let comms = ShmCollective::group(2, config()).unwrap();
    let caps = comms[0].capabilities();
    assert_eq!((caps.capacity_bytes, caps.max_call_bytes), (CAP, usize::MAX));
}
