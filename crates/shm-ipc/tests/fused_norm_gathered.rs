//! The fused all_reduce + residual + RMSNorm launch whose norm reads the gathered sums in
//! place (`CollectiveNormParams::new` flags the phase-2 segments `SEG_NORM_READ`; the executor
//! skips their copies and the norm reads through `CollectiveNormParams::sum_at`), through the
//! engine's own entry as the front door and raw callers reach it: on the RS+AG and the bulk push
//! routes, in one launch and chunked (the last launch reads its chunk in place, the earlier
//! rows from the output), in and out of place, f32 (a lane of two 16-byte vectors) and bf16 —
//! every rank's h and y bit for bit `fixed_tree::residual_rmsnorm`.
use collective_core::fixed_tree::{Element, RmsNormShape, residual_rmsnorm};
use collective_core::{Collective, DType, Io, IpcRoute, Plain};
use detcoll_protocol::params::NORM_GATHERED_MIN_ROWS;
use detcoll_protocol::{Device, IpcDevice, NormArgs};
use half::bf16;
use shm_ipc::{ShmCollective, ShmConfig};

/// Values of rank `r` (the residual and weight: `r` = 100, 101), distinct per element.
fn values<T: Element>(n: usize, r: usize) -> Vec<T> {
    (0..n).map(|i| T::from_f32_rounded(((i * 37 + r * 101) % 997) as f32 * 0.0071 - 3.3)).collect()
}

fn bits<T: Element>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits_u32()).collect()
}

/// One fused call of `rows x hidden` on every rank of `comms` by `route`; `in_place`: x is y
/// and the residual is h. Returns every rank's (h, y).
fn run<T: Element + Plain>(
    comms: &[ShmCollective],
    (rows, hidden): (usize, usize),
    route: IpcRoute,
    dtype: DType,
    in_place: bool,
) -> Vec<(Vec<T>, Vec<T>)> {
    let n = rows * hidden;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                s.spawn(move || {
                    let x: Vec<T> = values(n, r);
                    let weight: Vec<T> = values(hidden, 101);
                    let (mut xb, mut y) = (x.clone(), vec![T::from_f32_rounded(0.0); n]);
                    let (mut rb, mut h) = (values::<T>(n, 100), vec![T::from_f32_rounded(0.0); n]);
                    // The norm's addresses first (writable: taken from `&mut`), then the call's views.
                    let sum = if in_place { xb.as_mut_ptr() } else { y.as_mut_ptr() } as u64;
                    let residual = rb.as_mut_ptr() as u64;
                    let h_at = if in_place { residual } else { h.as_mut_ptr() as u64 };
                    let io = if in_place { Io::host_in_place(&mut xb) } else { Io::host(&x, &mut y) };
                    let args = NormArgs {
                        sum,
                        residual,
                        weight: weight.as_ptr() as u64,
                        h: h_at,
                        y: sum,
                        rows,
                        hidden,
                        eps: 1e-6,
                        dtype,
                    };
                    let engine = c.engine();
                    let stream = engine.device().raw_stream(&()).expect("host stream");
                    // SAFETY: every address is a live host buffer of this thread of the sizes
                    // `args` names (x/y and the residual/h exactly aliased in place), alive until
                    // the call returns (a host stream completes the call before returning).
                    let fused =
                        unsafe { engine.enqueue_all_reduce_norm(io, Some(route), &args, stream) }.expect("fused");
                    assert!(fused, "the engine took the norm");
                    if in_place { (rb, xb) } else { (h, y) }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

fn check<T: Element + Plain>(comms: &[ShmCollective], route: IpcRoute, dtype: DType, hidden: usize) {
    check_rows::<T>(comms, route, dtype, (NORM_GATHERED_MIN_ROWS, hidden));
}

fn check_rows<T: Element + Plain>(
    comms: &[ShmCollective],
    route: IpcRoute,
    dtype: DType,
    (rows, hidden): (usize, usize),
) {
    let world = comms.len();
    let n = rows * hidden;
    let xs: Vec<Vec<T>> = (0..world).map(|r| values(n, r)).collect();
    let refs: Vec<&[T]> = xs.iter().map(Vec::as_slice).collect();
    let (mut h, mut y) = (vec![T::from_f32_rounded(0.0); n], vec![T::from_f32_rounded(0.0); n]);
    let shape = RmsNormShape { rows, hidden };
    residual_rmsnorm(&refs, &values(n, 100), &values(hidden, 101), 1e-6, shape, &mut h, &mut y).expect("reference");
    for in_place in [false, true] {
        for (r, (gh, gy)) in run::<T>(comms, (rows, hidden), route, dtype, in_place).into_iter().enumerate() {
            let what = format!("world {world} {route:?} {} {rows}x{hidden} in place {in_place} rank {r}", T::NAME);
            assert_eq!(bits(&gh), bits(&h), "{what}: h");
            assert_eq!(bits(&gy), bits(&y), "{what}: y");
        }
    }
}

/// 64 KiB of staging: 512 x 8 and 512 x 16 f32 and 512 x 8 bf16 fit one launch on both routes;
/// 512 x 24 f32 (48 KiB) is chunked on bulk push (its frame holds every sender's slot and the
/// reduced shards). Shards of an odd number of 16-byte vectors (world 3 at 512 x 16, world 5 at
/// 512 x 8 and 512 x 24) make an f32 lane straddle two sources.
#[test]
fn gathered_sums_read_in_place_equal_the_reference() {
    const { assert!(<shm_ipc::HostDevice as IpcDevice>::NORM_READS_GATHERED, "the host executor has the form") };
    for world in [2, 3, 4, 5] {
        let comms = ShmCollective::group(world, ShmConfig::new(1 << 16)).expect("group");
        for route in [IpcRoute::ReduceScatterAllGather, IpcRoute::Push] {
            check::<f32>(&comms, route, DType::F32, 8);
            check::<f32>(&comms, route, DType::F32, 16);
            check::<f32>(&comms, route, DType::F32, 24);
            check::<bf16>(&comms, route, DType::BF16, 8);
        }
        for c in comms {
            c.close().expect("close");
        }
    }
}

/// The shape of the row forms inside the protocol (`CollectiveNormParams::shard_rows`: bulk push
/// and RS+AG, f16/bf16 rows of 4096 whose shards are whole rows, one launch; flagged at any row
/// count), which the host executor runs as the gathered-sum form: every rank's h and y the reference's, from 2 rows up,
/// and with rows that are not a multiple of the world (the block form after the copies).
#[test]
fn bulk_rows_shape_equals_the_reference() {
    for world in [2, 4] {
        let comms = ShmCollective::group(world, ShmConfig::new(1 << 22)).expect("group");
        for route in [IpcRoute::Push, IpcRoute::ReduceScatterAllGather] {
            for rows in [world, 2 * world, 64, 66, 130] {
                check_rows::<bf16>(&comms, route, DType::BF16, (rows, 4096));
            }
            check_rows::<half::f16>(&comms, route, DType::F16, (2 * world, 4096));
        }
        for c in comms {
            c.close().expect("close");
        }
    }
}

/// Chunked calls (64 KiB of staging: bulk push chunks of at most 4 rows of 4096 bf16 at worlds 2
/// and 4, balanced: `chunk::balanced`): 4 rows (one launch), 8 and 12 (chunks of 4 rows) take
/// the bulk rows form in every launch (each launch's norm its own rows: `fused_norm_shard_rows`
/// says so); 6 rows (two chunks of 3: shards inside a row) and 10 (chunks inside a row) keep
/// the norm in the last launch (it says no). Either way every rank's h and y are the
/// reference's.
#[test]
fn bulk_rows_in_every_chunk_equal_the_reference() {
    for world in [2, 4] {
        let comms = ShmCollective::group(world, ShmConfig::new(1 << 16)).expect("group");
        for (rows, every_launch) in [(4, true), (8, true), (12, true), (6, false), (10, false)] {
            let (taken, _) = shape_taken(&comms[0], IpcRoute::Push, (rows, 4096));
            assert_eq!(taken, every_launch, "world {world}, {rows} rows of 4096");
            check_rows::<bf16>(&comms, IpcRoute::Push, DType::BF16, (rows, 4096));
            // RS+AG in one-shot-sized chunks of 8 rows (whole rows; their shards whole rows
            // where the world divides the chunk's rows).
            check_rows::<bf16>(&comms, IpcRoute::ReduceScatterAllGather, DType::BF16, (rows, 4096));
        }
        for c in comms {
            c.close().expect("close");
        }
    }
}

/// Whether a fused bf16 call of `rows x hidden` by `route` on `comm` takes the row forms in every
/// launch (`fused_norm_shard_rows`), and its protocol tile (`fused_norm_tile`): the engine's
/// answers from the call's shape alone (no call is made).
fn shape_taken(comm: &ShmCollective, route: IpcRoute, (rows, hidden): (usize, usize)) -> (bool, u32) {
    let n = rows * hidden;
    let (x, mut y, residual, weight) =
        (vec![bf16::ZERO; n], vec![bf16::ZERO; n], vec![bf16::ZERO; n], vec![bf16::ONE; hidden]);
    let args = NormArgs {
        sum: y.as_mut_ptr() as u64,
        residual: residual.as_ptr() as u64,
        weight: weight.as_ptr() as u64,
        h: residual.as_ptr() as u64,
        y: y.as_mut_ptr() as u64,
        rows,
        hidden,
        eps: 1e-6,
        dtype: DType::BF16,
    };
    let packed = detcoll_protocol::NormParams::pack(&args).expect("pack");
    let io = Io::host(&x, &mut y);
    let engine = comm.engine();
    (engine.fused_norm_shard_rows(&io, route, &packed), engine.fused_norm_tile(&io, route, &packed).expect("a call"))
}

/// Rows of 8192 (16 KiB in f16/bf16) whose shards are whole rows on bulk push and RS+AG take
/// the wide tile (`params::WIDE_TILE_BYTES`: a row a tile, the row forms' shape; the engine's
/// `fused_norm_shard_rows` says so) in one launch and chunked (128 KiB of staging: bulk push
/// chunks of whole rows at world 2, RS+AG chunks of 8 rows); rows that are not a multiple of
/// the world keep 8 KiB tiles. Every rank's h and y the reference's either way, in and out of
/// place, worlds 2, 3 and 4.
#[test]
fn rows_of_8192_in_wide_tiles_equal_the_reference() {
    for (world, capacity) in [(2, 1 << 22), (3, 1 << 22), (4, 1 << 22), (2, 1 << 17), (4, 1 << 17)] {
        let comms = ShmCollective::group(world, ShmConfig::new(capacity)).expect("group");
        for route in [IpcRoute::Push, IpcRoute::ReduceScatterAllGather] {
            for rows in [world, 2 * world, 8 * world, 8 * world + 1, 5] {
                let (taken, _) = shape_taken(&comms[0], route, (rows, 8192));
                let what = format!("world {world}, capacity {capacity}, {route:?}, {rows} rows of 8192");
                if rows % world == 0 && capacity == 1 << 22 {
                    assert!(taken, "{what}: the row forms' shape in wide tiles");
                }
                if rows % world != 0 {
                    assert!(!taken, "{what}: shards inside a row");
                }
                check_rows::<bf16>(&comms, route, DType::BF16, (rows, 8192));
            }
            check_rows::<half::f16>(&comms, route, DType::F16, (2 * world, 8192));
        }
        for c in comms {
            c.close().expect("close");
        }
    }
}

/// Rows of 4096 whose shards are whole pairs of rows on bulk push and RS+AG take the wide tile
/// two rows to a tile (the row forms' pairs on the GPU, `dc_norm_row_pair_in_regs`; the host
/// executor runs the gathered-sum form in the same tiles), in one launch and chunked (128 KiB of
/// staging); shards of an odd number of rows, or rows that are not a multiple of the world,
/// keep 8 KiB tiles. Every rank's h and y the reference's either way, in and out of place,
/// worlds 2, 3 and 4.
#[test]
fn pairs_of_rows_of_4096_in_wide_tiles_equal_the_reference() {
    use detcoll_protocol::params::{TILE_BYTES, WIDE_TILE_BYTES};
    for (world, capacity) in [(2, 1 << 22), (3, 1 << 22), (4, 1 << 22), (2, 1 << 17), (4, 1 << 17)] {
        let comms = ShmCollective::group(world, ShmConfig::new(capacity)).expect("group");
        for route in [IpcRoute::Push, IpcRoute::ReduceScatterAllGather] {
            for rows in [world, 2 * world, 3 * world, 8 * world, 8 * world + 2, 7] {
                let (_, tile) = shape_taken(&comms[0], route, (rows, 4096));
                let what = format!("world {world}, capacity {capacity}, {route:?}, {rows} rows of 4096");
                if rows % (2 * world) == 0 && capacity == 1 << 22 {
                    assert_eq!(tile, WIDE_TILE_BYTES, "{what}: shards of whole pairs");
                }
                if rows % (2 * world) != 0 {
                    assert_eq!(tile, TILE_BYTES, "{what}: shards of an odd number of rows, or inside a row");
                }
                check_rows::<bf16>(&comms, route, DType::BF16, (rows, 4096));
            }
            check_rows::<half::f16>(&comms, route, DType::F16, (4 * world, 4096));
        }
        for c in comms {
            c.close().expect("close");
        }
    }
}
