//! The staging capacity's floor (issue 25): a capacity below
//! [`detcoll_protocol::MIN_CAPACITY`] used to be accepted while some calls (every f32
//! call at 0-3 bytes, f32 reduce_scatter at world 8 with 16 or 31) then failed one by one; it
//! is refused at construction on every rank, and the floor itself runs every op, dtype, world
//! and route — in chunks of 16 bytes per piece — with the bits of the fixed tree, so
//! `Capabilities::max_call_bytes = usize::MAX` is true of every accepted capacity.
use collective_core::bootstrap::LocalBootstrap;
use collective_core::conformance::HostBuf;
use collective_core::conformance::data::{compare, finite_values, reference_reduce};
use collective_core::{Collective, DType, Error, Io, IpcRoute, Op, RouteSelect};
use detcoll_protocol::{MIN_CAPACITY, Timeouts};
use shm_ipc::{ShmCollective, ShmConfig};
use std::time::{Duration, Instant};

fn config(capacity: usize) -> ShmConfig {
    // LL slots of 64 bytes: the LL route carries the smallest calls, the rest fall back.
    ShmConfig::new(capacity)
        .with_ll_capacity(64)
        .with_timeouts(Timeouts { peer: Duration::from_secs(10), close: Duration::from_millis(500) })
}

fn refused(r: Result<impl std::fmt::Debug, Error>, what: &str) {
    match r {
        Err(Error::InvalidConfig { detail }) => assert!(detail.contains("at least 128 bytes"), "{what}: {detail}"),
        other => panic!("{what}: expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn capacities_below_the_floor_are_refused_at_construction() {
    assert_eq!(MIN_CAPACITY, 128);
    for world in [1, 2, 4, 8] {
        for capacity in 0..MIN_CAPACITY {
            refused(ShmCollective::group(world, config(capacity)), &format!("group of {world}, capacity {capacity}"));
        }
    }
    // One process per rank (threads with the in-process bootstrap here): every rank fails at
    // once, also when a single rank has the capacity (its failure reaches the others).
    for (world, capacities) in [(1, [3, 3]), (2, [16, 16]), (2, [MIN_CAPACITY, 31]), (2, [0, MIN_CAPACITY])] {
        let boots = LocalBootstrap::group_with_timeout(world, Duration::from_secs(20));
        let t = Instant::now();
        std::thread::scope(|s| {
            let hs: Vec<_> =
                boots.iter().zip(capacities).map(|(b, c)| s.spawn(move || ShmCollective::new(b, config(c)))).collect();
            for h in hs {
                refused(h.join().unwrap(), &format!("new, capacities {capacities:?}"));
            }
        });
        assert!(t.elapsed() < Duration::from_secs(5), "{capacities:?}: failing took {:?}", t.elapsed());
    }
}

/// One call (`lanes` per-rank input element counts: one for a single-lane op) of `op` on
/// `route` (`None`: the collective's own choice) on every rank, every output compared bit for
/// bit with the fixed tree over all inputs (all_gather: the concatenation).
fn checked(comms: &[ShmCollective], op: Op, dtype: DType, lanes: &[usize], route: Option<IpcRoute>, seed: u64) {
    let world = comms.len();
    let size = dtype.size();
    let what = format!("{op} {dtype} world {world} lanes {lanes:?} {route:?}");
    // inputs[lane][rank]
    let inputs: Vec<Vec<Vec<u8>>> = lanes
        .iter()
        .enumerate()
        .map(|(l, &n)| (0..world).map(|r| finite_values(dtype, n, seed * 1000 + (l * 8 + r) as u64)).collect())
        .collect();
    let want = |l: usize, r: usize| -> Vec<u8> {
        let n = lanes[l];
        match op {
            Op::AllGather => inputs[l].concat(),
            Op::AllReduce => reference_reduce(&inputs[l], dtype),
            _ => reference_reduce(&inputs[l], dtype)[r * n / world * size..(r + 1) * n / world * size].to_vec(),
        }
    };
    let outs: Vec<Result<Vec<Vec<u8>>, Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let inputs = &inputs;
                s.spawn(move || {
                    let ins: Vec<HostBuf> = lanes
                        .iter()
                        .enumerate()
                        .map(|(l, &n)| {
                            let mut b = HostBuf::new(n * size);
                            b.as_bytes_mut().copy_from_slice(&inputs[l][r]);
                            b
                        })
                        .collect();
                    let out_len = |n: usize| match op {
                        Op::AllGather => n * world,
                        Op::AllReduce => n,
                        _ => n / world,
                    };
                    let mut outs: Vec<HostBuf> = lanes.iter().map(|&n| HostBuf::new(out_len(n) * size)).collect();
                    for o in &mut outs {
                        o.as_bytes_mut().fill(0xA5);
                    }
                    let mut ios: Vec<Io<'_>> = ins
                        .iter()
                        .zip(outs.iter_mut())
                        .zip(lanes)
                        .map(|((i, o), &n)| Io::OutOfPlace {
                            input: i.view(0, n, dtype),
                            output: o.view_mut(0, out_len(n), dtype),
                        })
                        .collect();
                    let res = match (op, route) {
                        (Op::ReduceScatterMany, None) => c.reduce_scatter_many(&ios, &()),
                        (Op::ReduceScatterMany, Some(route)) => c.reduce_scatter_many_on_route(&ios, route, &()),
                        (_, Some(route)) => c.call_on_route(op, ios.pop().unwrap(), route, &()),
                        (Op::AllReduce, None) => c.all_reduce(ios.pop().unwrap(), &()),
                        (Op::AllGather, None) => c.all_gather(ios.pop().unwrap(), &()),
                        (_, None) => c.reduce_scatter(ios.pop().unwrap(), &()),
                    };
                    drop(ios);
                    res?;
                    Ok(outs.iter().map(|o| o.as_bytes().to_vec()).collect())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, out) in outs.into_iter().enumerate() {
        let out = out.unwrap_or_else(|e| panic!("{what} rank {r}: {e}"));
        for (l, got) in out.iter().enumerate() {
            compare(got, &want(l, r), dtype).unwrap_or_else(|e| panic!("{what} rank {r} lane {l}: {e}"));
        }
    }
}

#[test]
fn the_floor_runs_every_op_with_the_bits_of_the_tree() {
    for world in [2usize, 4, 8] {
        let comms = ShmCollective::group(world, config(MIN_CAPACITY)).expect("the floor is accepted");
        let caps = comms[0].capabilities();
        assert_eq!((caps.capacity_bytes, caps.max_call_bytes), (MIN_CAPACITY, usize::MAX));
        let mut seed = 0;
        for dtype in [DType::F32, DType::BF16] {
            let single = |op: Op| -> &'static [Option<IpcRoute>] {
                match op {
                    Op::AllReduce => &[
                        None,
                        Some(IpcRoute::OneShot),
                        Some(IpcRoute::ReduceScatterAllGather),
                        Some(IpcRoute::PushLl),
                        Some(IpcRoute::Push),
                    ],
                    _ => &[None, Some(IpcRoute::OneShot), Some(IpcRoute::PushLl), Some(IpcRoute::Push)],
                }
            };
            // Element counts per rank: one element, a few chunks, many chunks (the floor holds
            // 32 f32 / 64 bf16 elements; a reduce_scatter chunk 16 bytes of each shard).
            for op in [Op::AllReduce, Op::AllGather] {
                for n in [1, 37, 700] {
                    for &route in single(op) {
                        seed += 1;
                        checked(&comms, op, dtype, &[n], route, seed);
                    }
                }
            }
            for m in [1, 9, 130] {
                for &route in single(Op::ReduceScatter) {
                    seed += 1;
                    checked(&comms, Op::ReduceScatter, dtype, &[m * world], route, seed);
                }
            }
            for route in [None, Some(IpcRoute::PushLl)] {
                seed += 1;
                checked(&comms, Op::ReduceScatterMany, dtype, &[3 * world, 70 * world, world], route, seed);
            }
        }
    }
}
