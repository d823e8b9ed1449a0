//! The fused all_reduce + residual + RMSNorm through the NVIDIA front door, as a cudarc user calls
//! it (`all_reduce_residual_rmsnorm_into`: `x` in, `y` out, the residual updated in place;
//! `_in_place`: `y` over `x`): ranks as threads on the GPUs there are (rank `r` on GPU `r %
//! count`), worlds 1, 2, 4, 8; bf16, f16, f32; rows 0..64 (an empty batch on every route), hidden
//! 4096, 8192 and 2049; every rank's `h` and `y` bit for bit `fixed_tree::residual_rmsnorm`, and a
//! row's bits the same in a batch of one. The raw entry in place and out of place on the routes
//! that hold a row in registers. Views one element off 16 bytes, on every rank or on one, where the
//! row forms in the protocol would take them. Two threads with their own streams on one rank:
//! fused calls atomic per handle. Fail-closed: a peer that never calls, or calls with another row
//! count, another `hidden` or `eps` or a plain all_reduce, ends the call with a typed error in
//! bounded time, through the launch barrier of the norm. Skips, saying so, without a GPU.
#![cfg(feature = "cuda")]
mod norm_data;

use collective_core::fixed_tree::Element;
use collective_factory::cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use collective_factory::half::{bf16, f16};
use collective_factory::{Collective, Config, NvidiaCollective, Reducible, nvidia};
use norm_data::{bits, every_size_by, reference, values};

fn gpu() -> bool {
    let ok = cuda_ipc::driver::driver_present() && cuda_ipc::driver::device_count().is_ok_and(|n| n > 0);
    if !ok {
        println!("skipped: no CUDA device");
    }
    ok
}

type Stream = std::sync::Arc<collective_factory::cudarc::driver::CudaStream>;
type Buf<T> = collective_factory::cudarc::driver::CudaSlice<T>;

/// Every rank's `call` on a stream of its own, given its inputs of seed `seed` (`x`, the
/// residual, the weight, uploaded); returns what each rank's call gives back (its h and y).
fn on_every_rank<T, F>(
    comms: &[NvidiaCollective],
    rows: usize,
    hidden: usize,
    seed: u64,
    call: F,
) -> Vec<(Vec<T>, Vec<T>)>
where
    T: Element + Reducible + DeviceRepr + ValidAsZeroBits + Default + Clone,
    F: Fn(&NvidiaCollective, &Stream, Buf<T>, Buf<T>, Buf<T>) -> (Vec<T>, Vec<T>) + Sync,
{
    let n = rows * hidden;
    each_rank(comms, |comm| {
        let stream = comm.context().new_stream().expect("stream");
        let x = stream.clone_htod(&values::<T>(n, seed * 100 + comm.rank() as u64)).expect("x");
        let residual = stream.clone_htod(&values::<T>(n, seed * 7 + 1)).expect("residual");
        let weight = stream.clone_htod(&values::<T>(hidden, seed * 7 + 2)).expect("weight");
        call(comm, &stream, x, residual, weight)
    })
}

/// `body` of every rank, each on a thread of its own; what each gives back, in rank order.
fn each_rank<R: Send, F: Fn(&NvidiaCollective) -> R + Sync>(comms: &[NvidiaCollective], body: F) -> Vec<R> {
    let body = &body;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|comm| s.spawn(move || body(comm))).collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

/// Every rank's fused call on its own stream; returns every rank's (h, y).
fn run<T>(comms: &[NvidiaCollective], rows: usize, hidden: usize, seed: u64) -> Vec<(Vec<T>, Vec<T>)>
where
    T: Element + Reducible + DeviceRepr + ValidAsZeroBits + Default + Clone,
{
    on_every_rank(comms, rows, hidden, seed, |comm, stream, x, mut residual, weight| {
        let mut y = stream.alloc_zeros::<T>(rows * hidden).expect("y");
        comm.all_reduce_residual_rmsnorm_into(&x, &mut y, &mut residual, &weight, hidden, 1e-6, stream)
            .expect("fused call");
        comm.synchronize(stream).expect("synchronize");
        (stream.clone_dtoh(&residual).expect("h"), stream.clone_dtoh(&y).expect("y"))
    })
}

/// Every rank's fused call in place (`all_reduce_residual_rmsnorm_in_place`: `y` over `x`);
/// returns every rank's (h, y).
fn run_in_place<T>(comms: &[NvidiaCollective], rows: usize, hidden: usize, seed: u64) -> Vec<(Vec<T>, Vec<T>)>
where
    T: Element + Reducible + DeviceRepr + ValidAsZeroBits + Default + Clone,
{
    on_every_rank(comms, rows, hidden, seed, |comm, stream, mut x, mut residual, weight| {
        comm.all_reduce_residual_rmsnorm_in_place(&mut x, &mut residual, &weight, hidden, 1e-6, stream)
            .expect("fused call in place");
        comm.synchronize(stream).expect("synchronize");
        (stream.clone_dtoh(&residual).expect("h"), stream.clone_dtoh(&x).expect("y"))
    })
}

/// Every rank's h and y of `shapes` = the reference.
fn check_shapes<T>(comms: &[NvidiaCollective], name: &str, shapes: &[(usize, usize)])
where
    T: Element + Reducible + DeviceRepr + ValidAsZeroBits + Default + Clone,
{
    let world = comms.len();
    for &(rows, hidden) in shapes {
        let seed = (rows * 31 + hidden) as u64;
        let (h, y) = reference::<T>(world, rows, hidden, seed);
        for (r, (gh, gy)) in run::<T>(comms, rows, hidden, seed).into_iter().enumerate() {
            assert_eq!(bits(&gh), bits(&h), "world {world} {name} rank {r}: h, {rows}x{hidden}");
            assert_eq!(bits(&gy), bits(&y), "world {world} {name} rank {r}: y, {rows}x{hidden}");
        }
    }
}

fn check<T>(comms: &[NvidiaCollective], name: &str)
where
    T: Element + Reducible + DeviceRepr + ValidAsZeroBits + Default + Clone,
{
    let world = comms.len();
    // 64 rows: the most in one kernel (ONE_KERNEL_MAX_ROWS) where a launch has a block a row
    // (worlds 1 and 2 on one H200; at worlds 4/8 the ranks sharing the GPU have 33 or 16 blocks,
    // so two launches: collective_factory::one_kernel, except for f16/bf16 rows of 4096 on
    // one-shot, the row loop); 80: the norm as a second launch.
    // Rows and the 8 KiB protocol tile: 4096 (bf16: a row per tile, no barrier of the launch;
    // f32: two tiles a row), 2048 (f32: a row per tile), 8192, 3000, 1000 and 2049 (rows across
    // tiles or tiles across rows: the barrier).
    let shapes = [(1, 4096), (7, 8192), (64, 4096), (3, 2049), (80, 2048), (5, 3000), (9, 1000)];
    check_shapes::<T>(comms, name, &shapes);
    // The typed in-place form (y over x) on a row a tile, rows of two tiles and rows across tiles.
    for (rows, hidden) in [(1, 4096), (7, 8192), (3, 2049)] {
        let seed = (rows * 31 + hidden) as u64;
        let (h, y) = reference::<T>(world, rows, hidden, seed);
        for (r, (gh, gy)) in run_in_place::<T>(comms, rows, hidden, seed).into_iter().enumerate() {
            assert_eq!(bits(&gh), bits(&h), "world {world} {name} rank {r}: h in place, {rows}x{hidden}");
            assert_eq!(bits(&gy), bits(&y), "world {world} {name} rank {r}: y in place, {rows}x{hidden}");
        }
    }
    // Row 0 alone and in a batch of 64 (the same inputs: row 0 of `values` is the same).
    let one = run::<T>(comms, 1, 4096, 5);
    let many = run::<T>(comms, 64, 4096, 5);
    for r in 0..world {
        assert_eq!(bits(&one[r].1), bits(&many[r].1[..4096]), "world {world} {name} rank {r}: batch invariance");
    }
}

#[test]
fn fused_norm_equals_the_reference_at_every_world() {
    if !gpu() {
        return;
    }
    for world in [1, 2, 3, 4, 8] {
        let comms = nvidia::thread_group(world, &Config::new().with_capacity(1 << 22)).expect("thread group");
        check::<bf16>(&comms, "bf16");
        check::<f16>(&comms, "f16");
        check::<f32>(&comms, "f32");
        println!("world {world}: h and y of every rank = fixed_tree::residual_rmsnorm (bf16, f16, f32)");
    }
}

/// Batches up to 2048 x 8192 bf16 (32 MiB a rank) on the default tables and staging (16 MiB):
/// worlds 4 and 8 take RS+AG (512 x 4096 in one launch: one kernel whose norm reads the gathered
/// sums; two chunks for the largest: the norm a second launch), world 2 bulk push (a second
/// launch). And 40-256 rows of 8192 on one-shot (up to 2 MiB a rank at worlds 4/8, 4 MiB at
/// world 2): at world 2 on a GPU of 132 multiprocessors (a resident grid of 66) 40 and 66 rows
/// are a block's each in registers while blocks stage two tiles each (`dc_norm_two_tile_rows`;
/// 66 rows one kernel above the 64-row limit: `fused_norm_two_tile_rows`), 128 and 256 rows
/// the norm's own launch; at worlds 4/8 (33 and 16 blocks) more rows than blocks.
#[test]
fn large_batches_on_the_default_routes() {
    if !gpu() {
        return;
    }
    for world in [2, 4, 8] {
        let comms = nvidia::thread_group(world, &Config::new()).expect("thread group");
        let shapes = [(512, 4096), (2048, 8192), (40, 8192), (66, 8192), (128, 8192), (256, 8192)];
        check_shapes::<bf16>(&comms, "bf16, default routes", &shapes);
        check_shapes::<f16>(&comms, "f16, default routes", &[(40, 8192), (66, 8192), (129, 8192)]);
        println!("world {world}: 512 x 4096, 2048 x 8192, 40-256 x 8192 = fixed_tree::residual_rmsnorm");
    }
}

/// The row forms inside the protocol (bulk push: the bulk rows form; RS+AG: the RS+AG rows form;
/// f16/bf16 rows of 4096 whose shards are whole rows: each block normalises the own shard's rows
/// as it reduces them and the peers' rows where their reduced shards lie after phase 2, in every
/// launch of a call in chunks of whole rows): each route forced at worlds 2, 3 and 4 with the
/// default staging — rows a multiple of the world (the form; 2048 rows in whole-row chunks) and
/// not (the gathered-sum form after the launch's barrier, or the norm's own launch) — in place
/// and out of place; 64 KiB of staging (chunks of a few rows: 8 and 12 rows in whole-row
/// chunks, 6 and 10 not always); and the default tables at worlds 2, 4 and 8 from 512 rows
/// (bulk push at world 2, RS+AG at 4 and 8), where the front door takes them.
#[test]
fn row_forms_in_the_protocol_on_bulk_push_and_rs_ag() {
    if !gpu() {
        return;
    }
    for route in ["ipc_push", "ipc_rs_ag"] {
        for world in [2, 3, 4] {
            let config = Config::new().with_routing(every_size_by("nvidia", route));
            let comms = nvidia::thread_group(world, &config).expect("thread group");
            let w = world;
            let shapes = [(w, 4096), (6 * w, 4096), (64 * w, 4096), (64 * w + 1, 4096), (2048, 4096), (2, 4096)];
            check_shapes::<bf16>(&comms, &format!("bf16 by {route}, rows in the protocol"), &shapes);
            check_shapes::<f16>(
                &comms,
                &format!("f16 by {route}, rows in the protocol"),
                &[(2 * w, 4096), (130 * w, 4096)],
            );
            for rows in [w, 64 * w] {
                let seed = (rows * 31 + 4096) as u64;
                let (h, y) = reference::<bf16>(world, rows, 4096, seed);
                for (r, (gh, gy)) in run_in_place::<bf16>(&comms, rows, 4096, seed).into_iter().enumerate() {
                    assert_eq!(bits(&gh), bits(&h), "world {world} rank {r}: h in place, {rows}x4096 by {route}");
                    assert_eq!(bits(&gy), bits(&y), "world {world} rank {r}: y in place, {rows}x4096 by {route}");
                }
            }
            let small = Config::new().with_capacity(64 << 10).with_routing(every_size_by("nvidia", route));
            let comms = nvidia::thread_group(world, &small).expect("thread group");
            let chunked = [(8, 4096), (12, 4096), (6, 4096), (10, 4096)];
            check_shapes::<bf16>(&comms, &format!("bf16 by {route} in chunks"), &chunked);
            println!("{route}, world {world}: rows in the protocol = fixed_tree::residual_rmsnorm");
        }
    }
    for world in [2, 4, 8] {
        let comms = nvidia::thread_group(world, &Config::new()).expect("thread group");
        check_shapes::<bf16>(&comms, "bf16, default table", &[(512, 4096), (1024, 4096), (2048, 4096), (1026, 4096)]);
        println!("world {world}, default table: 512-2048 x 4096 = fixed_tree::residual_rmsnorm");
    }
}

/// The row forms in wide tiles: f16/bf16 rows of 8192 whose shards are whole rows on bulk push
/// and RS+AG take a 16 KiB protocol tile (a row a tile, two vectors a thread), chosen from
/// signed values so every rank cuts its frames the same: each route forced at worlds 2, 3 and
/// 4 — rows a multiple of the world (the form in wide tiles; 1024 rows chunked in whole rows)
/// and not (8 KiB tiles) — in place; 256 KiB of staging (chunks of a few rows); inputs off 16
/// bytes on one rank and on every rank (the gathered-sum form in the same wide tiles); and the
/// default tables at worlds 2, 4 and 8 from 512 rows.
#[test]
fn row_forms_in_wide_tiles_for_rows_of_8192() {
    if !gpu() {
        return;
    }
    row_forms_in_wide_tiles(8192);
}

/// The row forms' pairs: f16/bf16 rows of 4096 whose shards are whole pairs of rows on bulk
/// push and RS+AG take the 16 KiB tile two rows to a tile (`dc_norm_row_pair_in_regs`: half the
/// block a row); shards of an odd number of rows keep the 8 KiB tile, a row a tile. The same
/// cases as rows of 8192 (above), with shards of 1, 2, 3, 6 and 64 rows besides.
#[test]
fn row_forms_in_pairs_of_rows_of_4096() {
    if !gpu() {
        return;
    }
    row_forms_in_wide_tiles(4096);
}

fn row_forms_in_wide_tiles(hidden: usize) {
    for route in ["ipc_push", "ipc_rs_ag"] {
        for world in [2, 3, 4] {
            let config = Config::new().with_routing(every_size_by("nvidia", route));
            let comms = nvidia::thread_group(world, &config).expect("thread group");
            let w = world;
            let shapes = [
                (w, hidden),
                (2 * w, hidden),
                (3 * w, hidden),
                (6 * w, hidden),
                (64 * w, hidden),
                (64 * w + 1, hidden),
                (64 * w + 2, hidden),
                (1024, hidden),
                (2, hidden),
            ];
            check_shapes::<bf16>(&comms, &format!("bf16 by {route}, wide tiles"), &shapes);
            check_shapes::<f16>(&comms, &format!("f16 by {route}, wide tiles"), &[(2 * w, hidden), (130 * w, hidden)]);
            for rows in [w, 2 * w, 64 * w] {
                let seed = (rows * 31 + hidden) as u64;
                let (h, y) = reference::<bf16>(world, rows, hidden, seed);
                for (r, (gh, gy)) in run_in_place::<bf16>(&comms, rows, hidden, seed).into_iter().enumerate() {
                    assert_eq!(bits(&gh), bits(&h), "world {world} rank {r}: h in place, {rows}x{hidden} by {route}");
                    assert_eq!(bits(&gy), bits(&y), "world {world} rank {r}: y in place, {rows}x{hidden} by {route}");
                }
                for off_ranks in [1, u32::MAX] {
                    for (r, (gh, gy)) in
                        run_offset::<bf16>(&comms, rows, hidden, seed, off_ranks, true, false).into_iter().enumerate()
                    {
                        let what =
                            format!("world {world} rank {r} by {route}, {rows}x{hidden}, ranks off {off_ranks:#x}");
                        assert_eq!(bits(&gh), bits(&h), "{what}: h");
                        assert_eq!(bits(&gy), bits(&y), "{what}: y");
                    }
                }
            }
            let small = Config::new().with_capacity(256 << 10).with_routing(every_size_by("nvidia", route));
            let comms = nvidia::thread_group(world, &small).expect("thread group");
            let chunked = [(8, hidden), (12, hidden), (6, hidden), (10, hidden), (48, hidden), (96, hidden)];
            check_shapes::<bf16>(&comms, &format!("bf16 by {route} in chunks, wide tiles"), &chunked);
            println!("{route}, world {world}: rows of {hidden} in wide tiles = fixed_tree::residual_rmsnorm");
        }
    }
    for world in [2, 4, 8] {
        let comms = nvidia::thread_group(world, &Config::new()).expect("thread group");
        let shapes = [(512, hidden), (1024, hidden), (2048, hidden), (1026, hidden)];
        check_shapes::<bf16>(&comms, "bf16, default table", &shapes);
        println!("world {world}, default table: 512-2048 x {hidden} = fixed_tree::residual_rmsnorm");
    }
}

/// Every rank's fused call with views one element into buffers one element longer on the ranks
/// of `off_ranks` (bit r: rank r; the others aligned): `x` off alone, or with `all_off` `x`, the
/// residual and `y` off together (`in_place`: `y` over `x`); returns every rank's (h, y).
fn run_offset<T>(
    comms: &[NvidiaCollective],
    rows: usize,
    hidden: usize,
    seed: u64,
    off_ranks: u32,
    all_off: bool,
    in_place: bool,
) -> Vec<(Vec<T>, Vec<T>)>
where
    T: Element + Reducible + DeviceRepr + ValidAsZeroBits + Default + Clone,
{
    let n = rows * hidden;
    let padded = |v: Vec<T>| -> Vec<T> { std::iter::once(T::default()).chain(v).collect() };
    each_rank(comms, |comm| {
        let stream = comm.context().new_stream().expect("stream");
        let off = off_ranks >> comm.rank() & 1 == 1;
        let all_off = all_off && off;
        let x0 = usize::from(off);
        let x_host = values::<T>(n, seed * 100 + comm.rank() as u64);
        let res_host = values::<T>(n, seed * 7 + 1);
        let mut x = stream.clone_htod(&if off { padded(x_host) } else { x_host }).expect("x");
        let weight = stream.clone_htod(&values::<T>(hidden, seed * 7 + 2)).expect("weight");
        let (mut residual, mut y) = if all_off {
            (stream.clone_htod(&padded(res_host)).expect("residual"), stream.alloc_zeros::<T>(n + 1).expect("y"))
        } else {
            (stream.clone_htod(&res_host).expect("residual"), stream.alloc_zeros::<T>(n).expect("y"))
        };
        let r0 = usize::from(all_off);
        let mut res_view = residual.slice_mut(r0..r0 + n);
        if in_place {
            let mut x_view = x.slice_mut(x0..x0 + n);
            comm.all_reduce_residual_rmsnorm_in_place(&mut x_view, &mut res_view, &weight, hidden, 1e-6, &stream)
                .expect("fused call in place, x off 16 bytes");
        } else {
            let x_view = x.slice(x0..x0 + n);
            let mut y_view = y.slice_mut(r0..r0 + n);
            comm.all_reduce_residual_rmsnorm_into(&x_view, &mut y_view, &mut res_view, &weight, hidden, 1e-6, &stream)
                .expect("fused call, x off 16 bytes");
        }
        comm.synchronize(&stream).expect("synchronize");
        let h = stream.clone_dtoh(&residual.slice(r0..r0 + n)).expect("h");
        let out = if in_place { x.slice(x0..x0 + n) } else { y.slice(r0..r0 + n) };
        (h, stream.clone_dtoh(&out).expect("y"))
    })
}

/// Inputs one element (2 bytes) off 16 bytes on the row forms' shapes (bulk push and RS+AG
/// forced, f16/bf16 rows of 4096 that are whole-row shards): bulk push's rows form reads the own
/// leaf from the input with 16-byte loads, so an input off 16 bytes must keep the gathered-sum
/// form (`shard_rows_shape`); `x` off alone (the rows form elsewhere could still apply), `x`,
/// the residual and `y` off together (the norm's scalar path), and in place (`y` over `x`, off).
#[test]
fn inputs_off_16_bytes_on_the_row_forms() {
    if !gpu() {
        return;
    }
    for route in ["ipc_push", "ipc_rs_ag"] {
        for world in [2, 4] {
            let config = Config::new().with_routing(every_size_by("nvidia", route));
            let comms = nvidia::thread_group(world, &config).expect("thread group");
            for rows in [world, 64 * world, 64 * world + 1] {
                let seed = (rows * 31 + 4096) as u64;
                let (h, y) = reference::<bf16>(world, rows, 4096, seed);
                // Every rank off, or rank 0 alone (its peers' row form pairs with its
                // gathered-sum form: the same frames, flags and pushes).
                let cases = [(false, false), (true, false), (false, true), (true, true)];
                for (off_ranks, (all_off, in_place)) in [u32::MAX, 1].into_iter().flat_map(|m| cases.map(|c| (m, c))) {
                    let got = run_offset::<bf16>(&comms, rows, 4096, seed, off_ranks, all_off, in_place);
                    for (r, (gh, gy)) in got.into_iter().enumerate() {
                        let what = format!(
                            "world {world} rank {r} by {route}, {rows}x4096, ranks off {off_ranks:#x}, all off {all_off}, in place {in_place}"
                        );
                        assert_eq!(bits(&gh), bits(&h), "{what}: h");
                        assert_eq!(bits(&gy), bits(&y), "{what}: y");
                    }
                }
            }
            let (h, y) = reference::<f16>(world, 2 * world, 4096, 9);
            let got = run_offset::<f16>(&comms, 2 * world, 4096, 9, u32::MAX, false, false);
            for (r, (gh, gy)) in got.into_iter().enumerate() {
                assert_eq!(bits(&gh), bits(&h), "world {world} rank {r} by {route}: f16 h, x off");
                assert_eq!(bits(&gy), bits(&y), "world {world} rank {r} by {route}: f16 y, x off");
            }
            println!("{route}, world {world}: views off 16 bytes = fixed_tree::residual_rmsnorm");
        }
    }
}

/// The one-kernel form on every IPC route (LL push, one-shot pull, bulk push, RS+AG) and in
/// chunked calls (64 KiB of staging: the larger shapes run in several launches, the norm in
/// the last one's epilogue, with more blocks than the collective's grid for 64 rows).
#[test]
fn fused_norm_on_every_ipc_route_and_in_chunks() {
    if !gpu() {
        return;
    }
    for route in ["ipc_push_ll", "ipc_one_shot", "ipc_push", "ipc_rs_ag"] {
        for world in [2, 3, 4] {
            let config = Config::new().with_capacity(64 << 10).with_routing(every_size_by("nvidia", route));
            let comms = nvidia::thread_group(world, &config).expect("thread group");
            check::<bf16>(&comms, &format!("bf16 by {route}"));
            check::<f32>(&comms, &format!("f32 by {route}"));
            if route == "ipc_rs_ag" {
                // Batches above the one-kernel limit (the norm as a second launch) whose
                // all_reduce runs in chunks of a few rows through the 64 KiB staging, rows of
                // 2049 (not a 16-byte multiple) and of 32 KiB (8192 f32).
                let shapes = [(300, 4096), (130, 2048), (9, 2049), (70, 8192)];
                check_shapes::<bf16>(&comms, &format!("bf16 by {route}, large batches"), &shapes);
                check_shapes::<f32>(&comms, &format!("f32 by {route}, large batches"), &[(130, 2048), (3, 8192)]);
                // One launch whose rows divide the 8 KiB tile (world 3: shards that end inside a
                // tile, whose two parts are reduced and gathered by the same block).
                let whole_rows = [(8, 4096), (16, 2048), (40, 256), (5, 64)];
                check_shapes::<bf16>(&comms, &format!("bf16 by {route}, whole rows per block"), &whole_rows);
                check_shapes::<f32>(&comms, &format!("f32 by {route}, whole rows per block"), &[(8, 2048), (7, 1024)]);
                // GATHERED_MIN_ROWS in one launch: one kernel whose norm reads the peers'
                // reduced shards in place (512 x 16 f32 at world 3: shards of 683 16-byte
                // vectors, so an f32 lane straddles two sources).
                check_shapes::<f32>(&comms, &format!("f32 by {route}, gathered"), &[(512, 16), (512, 24)]);
                check_shapes::<bf16>(&comms, &format!("bf16 by {route}, gathered"), &[(512, 24), (600, 40)]);
            }
            println!("{route}, world {world}: h and y of every rank = fixed_tree::residual_rmsnorm");
        }
    }
}

/// An empty batch (0 rows: a rank with no tokens this step) on every route forced and the
/// default table, worlds 1, 2 and 4, rows of 8, 4096 and 8192 (the row forms' shapes): every
/// rank's call succeeds and writes nothing (its views are empty slices of one-row buffers), and
/// the next call, a row on the same buffers, is the reference's bits (so the empty call
/// neither wrote the residual nor left the ranks' generations apart).
#[test]
fn an_empty_batch_then_a_row_on_every_route() {
    if !gpu() {
        return;
    }
    for route in [None, Some("ipc_push_ll"), Some("ipc_one_shot"), Some("ipc_push"), Some("ipc_rs_ag")] {
        for world in [1, 2, 4] {
            let config = Config::new().with_capacity(64 << 10);
            let config = match route {
                Some(r) => config.with_routing(every_size_by("nvidia", r)),
                None => config,
            };
            let comms = nvidia::thread_group(world, &config).expect("thread group");
            for hidden in [8, 4096, 8192] {
                let seed = 3 + hidden as u64;
                let (h, y) = reference::<bf16>(world, 1, hidden, seed);
                let got = on_every_rank(&comms, 1, hidden, seed, |comm, stream, x, mut residual, weight| {
                    let mut y = stream.alloc_zeros::<bf16>(hidden).expect("y");
                    comm.all_reduce_residual_rmsnorm_into(
                        &x.slice(0..0),
                        &mut y.slice_mut(0..0),
                        &mut residual.slice_mut(0..0),
                        &weight,
                        hidden,
                        1e-6,
                        stream,
                    )
                    .expect("an empty batch");
                    comm.synchronize(stream).expect("synchronize after the empty batch");
                    comm.all_reduce_residual_rmsnorm_into(&x, &mut y, &mut residual, &weight, hidden, 1e-6, stream)
                        .expect("a row after it");
                    comm.synchronize(stream).expect("synchronize");
                    (stream.clone_dtoh(&residual).expect("h"), stream.clone_dtoh(&y).expect("y"))
                });
                for (r, (gh, gy)) in got.into_iter().enumerate() {
                    let what = format!("world {world} by {route:?}, 0 then 1 x {hidden}, rank {r}");
                    assert_eq!(bits(&gh), bits(&h), "{what}: h");
                    assert_eq!(bits(&gy), bits(&y), "{what}: y");
                }
            }
            println!("world {world} by {route:?}: an empty batch, then a row = the reference");
        }
    }
}

/// Every rank's fused call through the raw entry (`all_reduce_residual_rmsnorm_raw`, as an
/// engine on another binding calls it) on its own stream: in place (`x` is `y`, the residual is
/// `h`: two buffers) or out of place (four). Returns every rank's (h, y).
fn run_raw<T>(
    comms: &[NvidiaCollective],
    rows: usize,
    hidden: usize,
    seed: u64,
    in_place: bool,
) -> Vec<(Vec<T>, Vec<T>)>
where
    T: Element + Reducible + DeviceRepr + ValidAsZeroBits + Default + Clone,
{
    use collective_factory::cudarc::driver::{DevicePtr, DevicePtrMut};
    let n = rows * hidden;
    on_every_rank(comms, rows, hidden, seed, |comm, stream, mut x, mut residual, weight| {
        let (mut y, mut h) = (stream.alloc_zeros::<T>(n).expect("y"), stream.alloc_zeros::<T>(n).expect("h"));
        {
            let (xp, _gx) = x.device_ptr_mut(stream);
            let (rp, _gr) = residual.device_ptr_mut(stream);
            let (wp, _gw) = weight.device_ptr(stream);
            let (yp, _gy) = y.device_ptr_mut(stream);
            let (hp, _gh) = h.device_ptr_mut(stream);
            let (yp, hp) = if in_place { (xp, rp) } else { (yp, hp) };
            // SAFETY: live device buffers of this rank's context of the sizes the call names,
            // untouched by anything else until the stream synchronises below; the stream is
            // this rank's.
            unsafe {
                comm.all_reduce_residual_rmsnorm_raw(
                    xp,
                    yp,
                    rp,
                    hp,
                    wp,
                    n,
                    hidden,
                    1e-6,
                    T::DTYPE,
                    stream.cu_stream().cast(),
                )
            }
            .expect("raw fused call");
        }
        comm.synchronize(stream).expect("synchronize");
        let (h, y) = if in_place { (&residual, &x) } else { (&h, &y) };
        (stream.clone_dtoh(h).expect("h"), stream.clone_dtoh(y).expect("y"))
    })
}

/// The raw entry in place and out of place on the routes whose fused launch holds the row in
/// registers (LL push and one-shot, forced), worlds 2 and 4: rows of 4096 (a row a tile) and
/// of 8192 (two tiles a row: on LL push each block's chunk walk takes the row's two tiles), f16
/// and bf16, every rank's h and y bit for bit the reference; in place is where a rank's store
/// of a row could overwrite its input before its send read it. And a row of 8192 alone = the
/// row in a batch of 8, on both routes.
#[test]
fn raw_fused_calls_in_place_and_out_of_place() {
    if !gpu() {
        return;
    }
    for route in ["ipc_push_ll", "ipc_one_shot"] {
        for world in [2, 4] {
            let comms = nvidia::thread_group(world, &Config::new().with_routing(every_size_by("nvidia", route)))
                .expect("thread group");
            for in_place in [true, false] {
                for (rows, hidden) in [(1, 8192), (8, 8192), (3, 4096), (2, 8192)] {
                    let seed = (rows * 31 + hidden) as u64;
                    let what = format!("world {world} by {route}, in place {in_place}, {rows}x{hidden}");
                    let (h, y) = reference::<bf16>(world, rows, hidden, seed);
                    for (r, (gh, gy)) in run_raw::<bf16>(&comms, rows, hidden, seed, in_place).into_iter().enumerate() {
                        assert_eq!(bits(&gh), bits(&h), "{what} bf16 rank {r}: h");
                        assert_eq!(bits(&gy), bits(&y), "{what} bf16 rank {r}: y");
                    }
                    let (h, y) = reference::<f16>(world, rows, hidden, seed);
                    for (r, (gh, gy)) in run_raw::<f16>(&comms, rows, hidden, seed, in_place).into_iter().enumerate() {
                        assert_eq!(bits(&gh), bits(&h), "{what} f16 rank {r}: h");
                        assert_eq!(bits(&gy), bits(&y), "{what} f16 rank {r}: y");
                    }
                }
            }
            let one = run_raw::<bf16>(&comms, 1, 8192, 5, true);
            let many = run_raw::<bf16>(&comms, 8, 8192, 5, false);
            for r in 0..world {
                assert_eq!(
                    bits(&one[r].1),
                    bits(&many[r].1[..8192]),
                    "world {world} by {route} rank {r}: batch invariance"
                );
            }
            println!("{route}, world {world}: the raw entry in place and out of place = fixed_tree::residual_rmsnorm");
            for c in comms {
                c.close().expect("close");
            }
        }
    }
}

/// The row loop: one-shot with more rows than the launch's blocks take one at a time, f16 and
/// bf16 rows of one protocol tile (hidden 4096): each block reduces its rows one after the
/// other and normalises each in registers right after its reduce (`dc_norm_rows_kept`), in one
/// kernel at any row count (`collective_factory::one_kernel`). Rows of two tiles (8192) beside
/// them, which do not loop (a block a row up to the grid, its tiles staged by other blocks;
/// the norm's own launch above), on the
/// same grids and handles. Grids capped at 1 to 6 blocks
/// (`with_max_blocks`), worlds 2, 3, 4 and 8; rows from just above the blocks to 200 (40 a block
/// at the least); the typed entry out of place and in place (`y` over `x`: the sum is not
/// stored, y is) and the raw entry both ways: every rank's h and y bit for bit the reference,
/// and row 0 of 200 = row 0 alone (a row's bits do not depend on which block or which turn of
/// the loop took it).
#[test]
fn more_rows_than_blocks_on_one_shot_in_one_kernel() {
    if !gpu() {
        return;
    }
    for (world, blocks) in [(2, 1), (2, 4), (3, 3), (4, 2), (8, 6)] {
        let config = Config::new()
            .with_capacity(4 << 20)
            .with_max_blocks(blocks)
            .with_routing(every_size_by("nvidia", "ipc_one_shot"));
        let comms = nvidia::thread_group(world, &config).expect("thread group");
        let shapes = [(blocks + 1, 4096), (2 * blocks + 1, 4096), (64, 4096), (200, 4096)];
        check_shapes::<bf16>(&comms, &format!("bf16, {blocks} blocks"), &shapes);
        check_shapes::<f16>(&comms, &format!("f16, {blocks} blocks"), &shapes);
        let shapes = [(blocks / 2 + 1, 8192), (blocks + 1, 8192), (33, 8192), (70, 8192)];
        check_shapes::<bf16>(&comms, &format!("bf16, {blocks} blocks"), &shapes);
        check_shapes::<f16>(&comms, &format!("f16, {blocks} blocks"), &shapes);
        for (rows, hidden) in [(blocks + 2, 4096), (77, 4096), (blocks + 1, 8192), (35, 8192)] {
            let seed = (rows * 31 + hidden) as u64;
            let what = format!("world {world}, {blocks} blocks, {rows}x{hidden}");
            let (h, y) = reference::<bf16>(world, rows, hidden, seed);
            for (r, (gh, gy)) in run_in_place::<bf16>(&comms, rows, hidden, seed).into_iter().enumerate() {
                assert_eq!(bits(&gh), bits(&h), "{what} rank {r}: h in place");
                assert_eq!(bits(&gy), bits(&y), "{what} rank {r}: y in place");
            }
            for in_place in [true, false] {
                for (r, (gh, gy)) in run_raw::<bf16>(&comms, rows, hidden, seed, in_place).into_iter().enumerate() {
                    assert_eq!(bits(&gh), bits(&h), "{what} rank {r}: h, raw, in place {in_place}");
                    assert_eq!(bits(&gy), bits(&y), "{what} rank {r}: y, raw, in place {in_place}");
                }
            }
        }
        for (rows, hidden) in [(200, 4096), (70, 8192)] {
            let one = run::<bf16>(&comms, 1, hidden, 5);
            let many = run::<bf16>(&comms, rows, hidden, 5);
            for r in 0..world {
                let what = format!("world {world} rank {r}: batch invariance, {rows}x{hidden}");
                assert_eq!(bits(&one[r].1), bits(&many[r].1[..hidden]), "{what}");
            }
        }
        println!(
            "world {world}, {blocks} blocks: up to 200 rows of 4096 and 70 of 8192 = fixed_tree::residual_rmsnorm"
        );
        for c in comms {
            c.close().expect("close");
        }
    }
}

/// One fused call of `rows x hidden` bf16 by `comm` on a new stream, timed to the end of its
/// stream work: (the call's, the stream's and the check's first error, how long it took, a
/// second call's result, made only after that).
fn fused_outcome(
    comm: &NvidiaCollective,
    rows: usize,
    hidden: usize,
) -> (Result<(), collective_core::Error>, std::time::Duration, Result<(), collective_core::Error>) {
    // Buffers of at least one row; the call's views are their first `rows` rows (an empty
    // batch: empty views, as a rank with no tokens passes them).
    let (n, len) = (rows * hidden, rows.max(1) * hidden);
    let stream = comm.context().new_stream().expect("stream");
    let x = stream.clone_htod(&values::<bf16>(len, 3)).expect("x");
    let mut residual = stream.clone_htod(&values::<bf16>(len, 4)).expect("residual");
    let weight = stream.clone_htod(&values::<bf16>(hidden, 5)).expect("weight");
    let mut y = stream.alloc_zeros::<bf16>(len).expect("y");
    let (x, mut y, mut residual) = (x.slice(0..n), y.slice_mut(0..n), residual.slice_mut(0..n));
    let t = std::time::Instant::now();
    let outcome = comm
        .all_reduce_residual_rmsnorm_into(&x, &mut y, &mut residual, &weight, hidden, 1e-6, &stream)
        .and_then(|()| comm.synchronize(&stream))
        .and_then(|()| comm.check());
    let waited = t.elapsed();
    let again = comm.all_reduce_residual_rmsnorm_into(&x, &mut y, &mut residual, &weight, hidden, 1e-6, &stream);
    (outcome, waited, again)
}

/// The epilogue's forms on world 2, each behind a fault: the barrier of the launch's blocks
/// before the norm for rows across tiles on LL push (16 x 6144, 12 KiB rows in 8 KiB tiles) and
/// for the gathered-sum form on RS+AG (512 x 4096, forced), and the row held in registers
/// across the protocol on LL push (one row of 4096, a tile; 16 rows of 8192, two tiles each: no
/// barrier of the launch). And empty batches on one-shot and LL push, rows of 8192 and 4096 (the
/// row forms' bodies): an empty call still waits for its peers (each call is one generation).
/// Until 2026-12-06 the one-shot body for rows of two tiles waited only in the blocks that had a
/// row, so an empty call of hidden 8192 waited for nobody and returned `Ok` (then a next call
/// could restage a frame a late peer was still reading).
const FAULT_SHAPES: [(usize, usize, Option<&str>); 7] = [
    (16, 6144, None),
    (512, 4096, Some("ipc_rs_ag")),
    (1, 4096, None),
    (16, 8192, None),
    (0, 8192, Some("ipc_one_shot")),
    (0, 4096, Some("ipc_one_shot")),
    (0, 8192, Some("ipc_push_ll")),
];

/// World 2 with `bound` on every wait for a peer, the lockstep off (rank 0's kernel then runs
/// and waits for its peer in the GPU; with it, the host would wait before launching), `route`
/// forced if given.
fn fault_group(bound: std::time::Duration, route: Option<&str>) -> Vec<NvidiaCollective> {
    let mut config = Config::new().with_timeout(bound).with_lockstep(false);
    if let Some(route) = route {
        config = config.with_routing(every_size_by("nvidia", route));
    }
    nvidia::thread_group(2, &config).expect("thread group")
}

/// Rank 1 never makes its fused call: rank 0's call ends after the peer timeout (and within
/// ten times it) as PeerTimeout naming rank 1 — every block of its launch ends its wait (at the
/// launch's barrier, or in the protocol before the row in registers), none waits for ever —
/// and its next call is refused as poisoned; rank 1 itself stays healthy.
#[test]
fn a_fused_call_whose_peer_never_comes_times_out_and_poisons() {
    use collective_core::conformance::faults;
    if !gpu() {
        return;
    }
    let bound = std::time::Duration::from_millis(300);
    for (rows, hidden, route) in FAULT_SHAPES {
        let comms = fault_group(bound, route);
        std::thread::scope(|s| {
            let absent = s.spawn(|| {
                // It keeps its handle open until rank 0 has timed out (a closed handle would
                // fail rank 0 at once with PeerClosed).
                std::thread::sleep(std::time::Duration::from_millis(50));
                let healthy = comms[1].check();
                std::thread::sleep(bound * 4);
                healthy
            });
            let (outcome, waited, again) = fused_outcome(&comms[0], rows, hidden);
            let cause = faults::expect_timeout(waited, bound, outcome, || again)
                .unwrap_or_else(|e| panic!("{rows} x {hidden} by {route:?}: {e}"));
            absent.join().expect("rank 1").expect("the absent rank is not poisoned itself");
            println!("{rows} x {hidden} by {route:?}: timed out after {waited:?}; then poisoned ({cause})");
        });
    }
}

/// The two ranks' fused calls differ by one row: both report SignatureMismatch naming the
/// other, with both element counts, well before the timeout (not a hang at the launch's
/// barrier, not a wrong `Ok`), and are poisoned.
#[test]
fn fused_calls_of_different_rows_fail_with_signature_mismatch() {
    use collective_core::conformance::faults;
    if !gpu() {
        return;
    }
    let bound = std::time::Duration::from_secs(8);
    for (rows, hidden, route) in FAULT_SHAPES {
        let comms = fault_group(bound, route);
        let counts = [rows * hidden, (rows + 1) * hidden];
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|me| {
                    let comm = &comms[me];
                    s.spawn(move || {
                        let (outcome, waited, again) = fused_outcome(comm, counts[me] / hidden, hidden);
                        faults::expect_mismatch(me, counts, waited, bound, outcome, || again)
                            .map(|()| println!("rank {me}, {rows} x {hidden} by {route:?}: mismatch after {waited:?}"))
                    })
                })
                .collect();
            for (me, h) in hs.into_iter().enumerate() {
                h.join().expect("rank").unwrap_or_else(|e| panic!("rank {me}, {rows} x {hidden} by {route:?}: {e}"));
            }
        });
    }
}

/// Several threads on one handle (issue 25) with fused calls, the GPU twin of
/// `fused_norm_threads.rs`: rank 0 driven by two threads with their own streams (inputs 1 and
/// 2, residuals 100 and 200), rank 1 by one (inputs 10 and 20 alternating); 16 rows of 4096 f32
/// (256 KiB: the norm in the last chunk's launch) and 80 (the norm a launch of its own) on a
/// 64 KiB staging, on every IPC route forced and the default table. Every `h` must be one
/// call's constant and every `y` row its norm bit for bit, and rank 1 must meet each of rank
/// 0's threads exactly `CALLS` times.
#[test]
fn two_threads_with_their_own_streams_on_one_rank_make_atomic_fused_calls() {
    if !gpu() {
        return;
    }
    const CALLS: usize = 10;
    const HIDDEN: usize = 4096;
    let weight: Vec<f32> = (0..HIDDEN).map(|j| 0.5 + (j % 256) as f32 / 256.0).collect();
    let call = |comm: &NvidiaCollective, stream: &Stream, rows: usize, x: f32, residual: f32, what: &str| -> f32 {
        let n = rows * HIDDEN;
        let xs = stream.clone_htod(&vec![x; n]).expect("x");
        let mut h = stream.clone_htod(&vec![residual; n]).expect("residual");
        let w = stream.clone_htod(&weight).expect("weight");
        let mut y = stream.alloc_zeros::<f32>(n).expect("y");
        comm.all_reduce_residual_rmsnorm_into(&xs, &mut y, &mut h, &w, HIDDEN, 1e-6, stream)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        comm.synchronize(stream).unwrap_or_else(|e| panic!("{what}: synchronize: {e}"));
        let (h, y) = (stream.clone_dtoh(&h).expect("h"), stream.clone_dtoh(&y).expect("y"));
        norm_data::one_call_of_constants(&h, &y, &weight, 1e-6, what) - residual
    };
    let call = &call;
    for route in ["default", "ipc_push_ll", "ipc_one_shot", "ipc_push", "ipc_rs_ag"] {
        let config = Config::new().with_capacity(64 << 10);
        let config = if route == "default" { config } else { config.with_routing(every_size_by("nvidia", route)) };
        let ranks = nvidia::thread_group(2, &config).expect("thread group");
        for rows in [16, 80] {
            std::thread::scope(|s| {
                for t in 0..2usize {
                    let comm = &ranks[0];
                    s.spawn(move || {
                        let stream = comm.context().new_stream().expect("stream");
                        let x0 = 1.0 + t as f32;
                        for k in 0..CALLS {
                            let what = format!("{route}, {rows} rows: rank 0 thread {t} call {k}");
                            let x1 = call(comm, &stream, rows, x0, 100.0 * (t + 1) as f32, &what) - x0;
                            assert!(x1 == 10.0 || x1 == 20.0, "{what}: x1 = {x1}");
                        }
                    });
                }
                let comm = &ranks[1];
                s.spawn(move || {
                    let stream = comm.context().new_stream().expect("stream");
                    let mut met = [0usize; 2];
                    for k in 0..2 * CALLS {
                        let x1 = 10.0 * (1 + k % 2) as f32;
                        let what = format!("{route}, {rows} rows: rank 1 call {k}");
                        let x0 = call(comm, &stream, rows, x1, 1000.0, &what) - x1;
                        assert!(x0 == 1.0 || x0 == 2.0, "{what}: x0 = {x0}");
                        met[x0 as usize - 1] += 1;
                    }
                    assert_eq!(met, [CALLS, CALLS], "{route}, {rows} rows: rank 1 met rank 0's threads unevenly");
                });
            });
        }
        println!("{route}: two threads on rank 0 with their own streams, fused calls atomic");
    }
}

/// Ranks that disagree on the norm with the same element count fail on both ranks with
/// `SignatureMismatch`, then `Poisoned` (the GPU twin of `fused_norm_disagreement.rs`): rank 1
/// normalises rows of half the width (twice as many), uses another `eps`, or makes a plain
/// all_reduce, in every form of `FAULT_SHAPES` and with the norm a launch of its own (100 x
/// 4096).
#[test]
fn fused_calls_that_disagree_on_the_norm_fail_with_signature_mismatch() {
    if !gpu() {
        return;
    }
    let bound = std::time::Duration::from_secs(8);
    // Rank 1's call: `None` a plain all_reduce, else the fused call of (rows, hidden, eps).
    let outcome = |comm: &NvidiaCollective, n: usize, fused: Option<(usize, f32)>| {
        let stream = comm.context().new_stream().expect("stream");
        let x = stream.clone_htod(&values::<bf16>(n, 3)).expect("x");
        let mut y = stream.alloc_zeros::<bf16>(n).expect("y");
        let t = std::time::Instant::now();
        let call = |y: &mut Buf<bf16>| match fused {
            Some((hidden, eps)) => {
                let mut residual = stream.clone_htod(&values::<bf16>(n, 4)).expect("residual");
                let weight = stream.clone_htod(&values::<bf16>(hidden, 5)).expect("weight");
                comm.all_reduce_residual_rmsnorm_into(&x, y, &mut residual, &weight, hidden, eps, &stream)
            }
            None => comm.all_reduce_into(&x, y, &stream),
        };
        let got = call(&mut y).and_then(|()| comm.synchronize(&stream)).and_then(|()| comm.check());
        (got, t.elapsed(), call(&mut y))
    };
    let shapes = FAULT_SHAPES.iter().copied().chain([(100, 4096, None)]);
    for (rows, hidden, route) in shapes {
        let n = rows * hidden;
        for theirs in [Some((hidden / 2, 1e-6)), Some((hidden, 1e-5)), None] {
            let comms = fault_group(bound, route);
            let calls = [Some((hidden, 1e-6f32)), theirs];
            std::thread::scope(|s| {
                for (me, comm) in comms.iter().enumerate() {
                    s.spawn(move || {
                        let what = format!("rank {me}, {rows} x {hidden} by {route:?}, calls {calls:?}");
                        let (got, waited, again) = outcome(comm, n, calls[me]);
                        assert!(waited < bound, "{what}: the mismatch took {waited:?}");
                        match got {
                            Err(collective_core::Error::SignatureMismatch { peer, .. }) if peer == 1 - me => {}
                            other => panic!("{what}: expected SignatureMismatch naming the peer, got {other:?}"),
                        }
                        match again {
                            Err(collective_core::Error::Poisoned { .. }) => {}
                            other => panic!("{what}: expected Poisoned after the mismatch, got {other:?}"),
                        }
                        println!("{what}: mismatch after {waited:?}");
                    });
                }
            });
        }
    }
}
