//! The push routes on the CPU twin — LL (`ipc_push_ll`) and bulk (`ipc_push`) — ranks as
//! threads: every bit pattern travels unchanged, every op gives the fixed tree's bits,
//! mismatches (another call, or the same call by another route) are errors before any output is
//! written, calls above a push route's slots take the pull route with the same bits, and push
//! and pull calls mix across the generation wrap.
use collective_core::Timeouts;
use collective_core::{Collective, Error, Io, IpcRoute, Op, Plain, RouteSelect};
use half::{bf16, f16};
use shm_ipc::{ShmCollective, ShmConfig};
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(3);
/// Both push routes.
const PUSH: [IpcRoute; 2] = [IpcRoute::PushLl, IpcRoute::Push];
const SENTINEL: u32 = 0x7fc0_dead;

fn config() -> ShmConfig {
    ShmConfig::new(1 << 16).with_timeouts(Timeouts { peer: BOUND, close: Duration::from_millis(300) })
}

fn on_all<T: Send>(comms: &[ShmCollective], f: impl Fn(&ShmCollective, usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(c, r))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Bits of special and ordinary f32 values, distinct per rank and index.
fn special_f32(r: usize, n: usize) -> Vec<f32> {
    const SPECIAL: [u32; 8] =
        [0x8000_0000, 0x7f80_0001, 0xffc1_2345, 0x0000_0001, 0x8040_0000, 0x7f80_0000, 0xff80_0000, 0x7fff_ffff];
    (0..n)
        .map(|i| {
            if i % 3 == 0 {
                f32::from_bits(SPECIAL[(i / 3 + r) % SPECIAL.len()])
            } else {
                ((i * 7 + r * 131) % 1000) as f32 * 0.013 - 3.1
            }
        })
        .collect()
}

fn push_call<T: Plain>(c: &ShmCollective, op: Op, input: &[T], out: &mut [T], route: IpcRoute) -> Result<(), Error> {
    c.call_on_route(op, Io::host(input, out), route, &())
}

#[test]
fn all_gather_carries_every_bit_pattern_of_every_element_type() {
    for route in PUSH {
        all_gather_bits(route);
    }
}

fn all_gather_bits(route: IpcRoute) {
    for world in [2, 4, 8] {
        let comms = ShmCollective::group(world, config()).unwrap();
        for n in [1usize, 3, 5, 17, 1000] {
            // f32 with -0.0, NaN payloads, subnormals and infinities.
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| special_f32(r, n)).collect();
            let outs = on_all(&comms, |c, r| {
                let mut out = vec![f32::from_bits(SENTINEL); n * world];
                push_call(c, Op::AllGather, &inputs[r], &mut out, route).map(|()| out)
            });
            let want: Vec<u32> = inputs.concat().iter().map(|x| x.to_bits()).collect();
            for (r, out) in outs.into_iter().enumerate() {
                let got: Vec<u32> = out.unwrap().iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{route:?} f32 world {world} n {n} rank {r}");
            }
            // Bytes (odd lengths: partial LL words) and 8-byte integers.
            let bytes: Vec<Vec<u8>> = (0..world).map(|r| (0..n).map(|i| (i * 31 + r * 7) as u8).collect()).collect();
            let outs = on_all(&comms, |c, r| {
                let mut out = vec![0xAAu8; n * world];
                push_call(c, Op::AllGather, &bytes[r], &mut out, route).map(|()| out)
            });
            for out in outs {
                assert_eq!(out.unwrap(), bytes.concat(), "u8 world {world} n {n}");
            }
            let longs: Vec<Vec<i64>> =
                (0..world).map(|r| (0..n).map(|i| -((i as i64) << 40) ^ (r as i64 * 0x0101)).collect()).collect();
            let outs = on_all(&comms, |c, r| {
                let mut out = vec![0i64; n * world];
                push_call(c, Op::AllGather, &longs[r], &mut out, route).map(|()| out)
            });
            for out in outs {
                assert_eq!(out.unwrap(), longs.concat(), "i64 world {world} n {n}");
            }
        }
    }
}

/// Finite special values (signed zeros, subnormals, the largest finite) among ordinary ones: a
/// reduction's NaN payloads are not part of the contract (the optimiser may pick either
/// operand's), so the reduce tests keep NaN and infinities out.
fn finite_special_f32(r: usize, n: usize) -> Vec<f32> {
    const SPECIAL: [u32; 6] = [0x8000_0000, 0x0000_0001, 0x8040_0000, 0x0080_0000, 0x0000_0000, 0x3f80_0001];
    (0..n)
        .map(|i| {
            if i % 3 == 0 {
                f32::from_bits(SPECIAL[(i / 3 + r) % SPECIAL.len()])
            } else {
                ((i * 7 + r * 131) % 1000) as f32 * 0.013 - 3.1
            }
        })
        .collect()
}

/// Every reducing op over `T` on a push route, in place and out of place, against the tree.
fn reduce_ops_match_the_tree<T: Plain + fixed_tree::Element + Copy + Send + Sync>(
    route: IpcRoute,
    make: impl Fn(f32) -> T + Sync,
    bits: impl Fn(T) -> u64,
) {
    for world in [2, 4, 8] {
        let comms = ShmCollective::group(world, config()).unwrap();
        for n in [world, 3 * world, 17 * world, 1000 * world] {
            let inputs: Vec<Vec<T>> =
                (0..world).map(|r| finite_special_f32(r, n).into_iter().map(&make).collect()).collect();
            let views: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
            let mut tree = vec![make(0.0); n];
            fixed_tree::reduce(&views, &mut tree).unwrap();
            let tree: Vec<u64> = tree.into_iter().map(&bits).collect();
            for in_place in [false, true] {
                for op in [Op::AllReduce, Op::ReduceScatter] {
                    let outs = on_all(&comms, |c, r| {
                        let m = if op == Op::AllReduce { n } else { n / world };
                        if in_place {
                            let mut buf = inputs[r].clone();
                            c.call_on_route(op, Io::host_in_place(&mut buf), route, &()).map(|()| {
                                let at = if op == Op::AllReduce { 0 } else { r * m };
                                buf[at..at + m].to_vec()
                            })
                        } else {
                            let mut out = vec![make(0.0); m];
                            push_call(c, op, &inputs[r], &mut out, route).map(|()| out)
                        }
                    });
                    for (r, out) in outs.into_iter().enumerate() {
                        let got: Vec<u64> = out.unwrap().into_iter().map(&bits).collect();
                        let want =
                            if op == Op::AllReduce { &tree[..] } else { &tree[r * n / world..(r + 1) * n / world] };
                        assert_eq!(got, want, "{route:?} {op} world {world} n {n} in place {in_place} rank {r}");
                    }
                }
            }
        }
    }
}

#[test]
fn all_reduce_and_reduce_scatter_give_the_tree_bits_in_every_dtype() {
    for route in PUSH {
        reduce_ops_match_the_tree(route, |x| x, |x: f32| u64::from(x.to_bits()));
        reduce_ops_match_the_tree(route, f16::from_f32, |x: f16| u64::from(x.to_bits()));
        reduce_ops_match_the_tree(route, bf16::from_f32, |x: bf16| u64::from(x.to_bits()));
    }
}

#[test]
fn reduce_scatter_many_lanes_land_in_their_own_lines() {
    let world = 4;
    let comms = ShmCollective::group(world, config()).unwrap();
    // Lane shards of 1, 3 and 1000 elements: lane offsets in the slots are rounded to 16 bytes.
    let sizes = [world, 3 * world, 1000 * world];
    let inputs: Vec<Vec<Vec<f32>>> = (0..world)
        .map(|r| sizes.iter().enumerate().map(|(l, &n)| finite_special_f32(r + 5 * l, n)).collect())
        .collect();
    let outs = on_all(&comms, |c, r| {
        let mut outs: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0f32; n / world]).collect();
        let lanes: Vec<Io<'_>> = inputs[r].iter().zip(outs.iter_mut()).map(|(i, o)| Io::host(i, o)).collect();
        c.reduce_scatter_many_on_route(&lanes, IpcRoute::PushLl, &()).map(|()| outs)
    });
    for (r, out) in outs.into_iter().enumerate() {
        let out = out.unwrap();
        for (l, &n) in sizes.iter().enumerate() {
            let views: Vec<&[f32]> = inputs.iter().map(|i| i[l].as_slice()).collect();
            let mut tree = vec![0f32; n];
            fixed_tree::reduce(&views, &mut tree).unwrap();
            let want: Vec<u32> = tree[r * n / world..(r + 1) * n / world].iter().map(|x| x.to_bits()).collect();
            let got: Vec<u32> = out[l].iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "lane {l} rank {r}");
        }
    }
}

#[test]
fn another_call_or_another_route_is_a_mismatch_and_writes_nothing() {
    // (rank 0's call, rank 1's call): another count on the push route; the same call by the
    // push and by the one-shot pull route.
    let cases = [
        ((64usize, IpcRoute::PushLl), (65usize, IpcRoute::PushLl)),
        ((64, IpcRoute::PushLl), (64, IpcRoute::OneShot)),
        ((64, IpcRoute::OneShot), (64, IpcRoute::PushLl)),
        ((64, IpcRoute::Push), (66, IpcRoute::Push)),
        ((64, IpcRoute::Push), (64, IpcRoute::PushLl)),
        ((64, IpcRoute::ReduceScatterAllGather), (64, IpcRoute::Push)),
    ];
    for ((n0, r0), (n1, r1)) in cases {
        let comms = ShmCollective::group(2, config()).unwrap();
        let t = Instant::now();
        let outs = on_all(&comms, |c, r| {
            let (n, route) = if r == 0 { (n0, r0) } else { (n1, r1) };
            let input = special_f32(r, n);
            let mut out = vec![f32::from_bits(SENTINEL); n];
            let res = push_call(c, Op::AllReduce, &input, &mut out, route);
            (res, out)
        });
        assert!(t.elapsed() < BOUND, "a mismatch must not wait for the bound: {:?}", t.elapsed());
        for (r, (res, out)) in outs.into_iter().enumerate() {
            match res {
                Err(Error::SignatureMismatch { peer, ours, theirs }) => {
                    assert_eq!(peer, 1 - r);
                    assert_ne!(ours, theirs);
                }
                other => panic!("rank {r} ({n0}/{r0:?} vs {n1}/{r1:?}): expected a mismatch, got {other:?}"),
            }
            assert!(out.iter().all(|x| x.to_bits() == SENTINEL), "rank {r} wrote its output");
        }
    }
}

#[test]
fn calls_above_a_push_routes_slots_take_the_pull_route_with_the_same_bits() {
    // LL slots of 1 KiB; the bulk route needs 2 x the all_reduce in a 64 KiB frame.
    let world = 2;
    let comms = ShmCollective::group(world, config().with_ll_capacity(1024)).unwrap();
    for (route, n) in [
        (IpcRoute::PushLl, 200usize),
        (IpcRoute::PushLl, 256),
        (IpcRoute::PushLl, 257),
        (IpcRoute::PushLl, 4096),
        (IpcRoute::Push, 8192),
        (IpcRoute::Push, 8193),
        (IpcRoute::Push, 16384),
    ] {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| finite_special_f32(r, n)).collect();
        let views: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut tree = vec![0f32; n];
        fixed_tree::reduce(&views, &mut tree).unwrap();
        let outs = on_all(&comms, |c, r| {
            let mut out = vec![0f32; n];
            push_call(c, Op::AllReduce, &inputs[r], &mut out, route).map(|()| out)
        });
        for out in outs {
            let got: Vec<u32> = out.unwrap().iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, tree.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{route:?} n {n}");
        }
    }
}

#[test]
fn push_and_pull_calls_mix_across_the_generation_wrap() {
    let routes =
        [IpcRoute::PushLl, IpcRoute::OneShot, IpcRoute::Push, IpcRoute::PushLl, IpcRoute::ReduceScatterAllGather];
    for start in [(1u32 << 31) + 5, u32::MAX - 3] {
        for world in [2, 4] {
            let comms = ShmCollective::group_at_generation(world, config(), start).unwrap();
            for call in 0..12 {
                let route = routes[call % routes.len()];
                let n = [64usize, 2048, 8, 1000, 3][call % 5];
                let inputs: Vec<Vec<f32>> = (0..world).map(|r| finite_special_f32(r + call, n)).collect();
                let views: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                let mut tree = vec![0f32; n];
                fixed_tree::reduce(&views, &mut tree).unwrap();
                let outs = on_all(&comms, |c, r| {
                    let mut out = vec![0f32; n];
                    push_call(c, Op::AllReduce, &inputs[r], &mut out, route).map(|()| out)
                });
                for (r, out) in outs.into_iter().enumerate() {
                    let out = out.unwrap_or_else(|e| panic!("start {start} world {world} call {call} rank {r}: {e}"));
                    let got: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
                    let want: Vec<u32> = tree.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, want, "start {start} world {world} call {call} ({route:?}) rank {r}");
                }
            }
        }
    }
}

#[test]
fn a_closed_peer_ends_a_push_wait_at_once() {
    for route in PUSH {
        let comms = ShmCollective::group(2, config()).unwrap();
        comms[1].close().unwrap(); // a thread group's close acknowledges and returns (staging is shared)
        let t = Instant::now();
        let input = special_f32(0, 64);
        let mut out = vec![0f32; 64];
        match push_call(&comms[0], Op::AllReduce, &input, &mut out, route) {
            Err(Error::PeerClosed { peer: 1, .. }) => {}
            other => panic!("{route:?}: expected PeerClosed, got {other:?}"),
        }
        assert!(t.elapsed() < BOUND, "{:?}", t.elapsed());
    }
}
