//! Which fused calls take the row loop (`IpcCollective::fused_norm_row_loop`): one kernel at any
//! row count, each row normalised in registers right after its reduce (`dc_norm_rows_kept` in
//! kernels/detcoll_norm.h). The front door asks it through `NormBackend::one_kernel_at_any_size`
//! for batches with more rows than the epilogue has blocks; a wrong yes would send a batch to a
//! one-kernel form the launch does not take (the slow epilogue), a wrong no costs the norm's own
//! launch. So: yes exactly on the one-shot route, f16/bf16 rows of one protocol tile (hidden
//! 4096), the norm's vector path, a call in one launch; never rows of two tiles (hidden 8192,
//! whose loop measured slower than the epilogue or the norm's launch), on any grid; and the CPU
//! twin's executor has the form (so its front door takes the GPU's forms).
use collective_core::fixed_tree::Element;
use collective_core::{Collective, Io, IpcRoute, Plain};
use detcoll_protocol::{IpcDevice, NormArgs, NormParams};
use half::{bf16, f16};
use shm_ipc::{HostDevice, ShmCollective, ShmConfig};

/// Which of rank 0's forms a fused call asks about: the row loop or rows of two tiles.
type Ask = fn(&ipc_engine::IpcCollective<HostDevice>, &Io<'_>, IpcRoute, &NormParams) -> bool;

/// What `ask` answers on rank 0 of `comms` for a fused call of `rows x hidden` in `T` by
/// `route`, its residual `offset` elements into its buffer (1: not 16-byte aligned).
fn form<T: Element + Plain>(
    comms: &[ShmCollective],
    rows: usize,
    hidden: usize,
    route: IpcRoute,
    offset: usize,
    ask: Ask,
) -> bool {
    let n = rows * hidden;
    let zero = T::from_f32_rounded(0.0);
    let (x, mut y) = (vec![zero; n], vec![zero; n]);
    let residual = vec![zero; n + offset];
    let weight = vec![zero; hidden];
    let sum = y.as_mut_ptr() as u64;
    let args = NormArgs {
        sum,
        residual: residual[offset..].as_ptr() as u64,
        weight: weight.as_ptr() as u64,
        h: residual[offset..].as_ptr() as u64,
        y: sum,
        rows,
        hidden,
        eps: 1e-6,
        dtype: T::DTYPE,
    };
    let packed = NormParams::pack(&args).expect("pack");
    ask(comms[0].engine(), &Io::host(&x, &mut y), route, &packed)
}

/// Whether rank 0 would take the row loop (`IpcCollective::fused_norm_row_loop`).
fn row_loop<T: Element + Plain>(
    comms: &[ShmCollective],
    rows: usize,
    hidden: usize,
    route: IpcRoute,
    offset: usize,
) -> bool {
    form::<T>(comms, rows, hidden, route, offset, |e, io, r, p| e.fused_norm_row_loop(io, r, p))
}

/// Whether rank 0 would hold rows of two tiles in registers, a block a row
/// (`IpcCollective::fused_norm_two_tile_rows`).
fn two_tile_rows<T: Element + Plain>(
    comms: &[ShmCollective],
    rows: usize,
    hidden: usize,
    route: IpcRoute,
    offset: usize,
) -> bool {
    form::<T>(comms, rows, hidden, route, offset, |e, io, r, p| e.fused_norm_two_tile_rows(io, r, p))
}

#[test]
fn the_row_loop_is_one_shot_in_one_launch_with_rows_of_one_tile() {
    const { assert!(<HostDevice as IpcDevice>::NORM_ROW_LOOP, "the host executor has the form") };
    // 4 MiB of staging; the twin's grid is one block.
    let comms = ShmCollective::group(2, ShmConfig::new(4 << 20)).expect("group");
    for rows in [1, 2, 65, 200] {
        assert!(row_loop::<bf16>(&comms, rows, 4096, IpcRoute::OneShot, 0), "bf16 {rows}x4096");
        assert!(row_loop::<f16>(&comms, rows, 4096, IpcRoute::OneShot, 0), "f16 {rows}x4096");
        for route in [IpcRoute::PushLl, IpcRoute::Push, IpcRoute::ReduceScatterAllGather] {
            assert!(!row_loop::<bf16>(&comms, rows, 4096, route, 0), "{route:?}: not one-shot");
        }
        assert!(!row_loop::<f32>(&comms, rows, 4096, IpcRoute::OneShot, 0), "f32: two tiles of f32 a row");
        assert!(!row_loop::<bf16>(&comms, rows, 2048, IpcRoute::OneShot, 0), "two rows a tile");
        assert!(!row_loop::<bf16>(&comms, rows, 4096, IpcRoute::OneShot, 1), "residual not 16-byte aligned");
        assert!(!row_loop::<bf16>(&comms, rows, 8192, IpcRoute::OneShot, 0), "two tiles a row");
    }
    // Above the staging: chunks, whose last launch does not hold every row.
    assert!(!row_loop::<bf16>(&comms, 600, 4096, IpcRoute::OneShot, 0), "a chunked call");
    for c in comms {
        c.close().expect("close");
    }
    // An even grid (where a loop over rows of two tiles could pair the blocks): still rows of
    // one tile only.
    let comms = ShmCollective::group(2, ShmConfig::new(4 << 20).with_max_blocks(4)).expect("group");
    for rows in [1, 2, 3, 100] {
        assert!(!row_loop::<bf16>(&comms, rows, 8192, IpcRoute::OneShot, 0), "bf16 {rows}x8192, 4 blocks");
        assert!(row_loop::<bf16>(&comms, rows, 4096, IpcRoute::OneShot, 0), "bf16 {rows}x4096, 4 blocks");
    }
    for c in comms {
        c.close().expect("close");
    }
}

/// The front door's one kernel above its row limit for rows of two tiles (hidden 8192): yes
/// exactly on one-shot, f16/bf16, the norm's vector path, one launch, and no more rows than the
/// resident grid (each row a block of its own, its tiles staged by one or two blocks each); a
/// wrong yes would send the batch to the slow epilogue, so every other case is no.
#[test]
fn rows_of_two_tiles_take_a_block_each_up_to_the_resident_grid() {
    let comms = ShmCollective::group(2, ShmConfig::new(4 << 20).with_max_blocks(4)).expect("group");
    for rows in 1..=4 {
        assert!(two_tile_rows::<bf16>(&comms, rows, 8192, IpcRoute::OneShot, 0), "bf16 {rows}x8192, 4 blocks");
        assert!(two_tile_rows::<f16>(&comms, rows, 8192, IpcRoute::OneShot, 0), "f16 {rows}x8192, 4 blocks");
        for route in [IpcRoute::PushLl, IpcRoute::Push, IpcRoute::ReduceScatterAllGather] {
            assert!(!two_tile_rows::<bf16>(&comms, rows, 8192, route, 0), "{route:?}: not one-shot");
        }
        assert!(!two_tile_rows::<f32>(&comms, rows, 8192, IpcRoute::OneShot, 0), "f32: four tiles a row");
        assert!(!two_tile_rows::<f32>(&comms, rows, 4096, IpcRoute::OneShot, 0), "f32 4096: two tiles, no form");
        assert!(!two_tile_rows::<bf16>(&comms, rows, 4096, IpcRoute::OneShot, 0), "a row a tile");
        assert!(!two_tile_rows::<bf16>(&comms, rows, 8192, IpcRoute::OneShot, 1), "residual not 16-byte aligned");
    }
    for rows in [5, 64, 66, 200] {
        assert!(!two_tile_rows::<bf16>(&comms, rows, 8192, IpcRoute::OneShot, 0), "{rows} rows > 4 blocks");
    }
    for c in comms {
        c.close().expect("close");
    }
    // A larger resident grid takes more rows; a call above the staging (300 rows of 8192 bf16
    // = 4.7 MiB > 4 MiB) runs in chunks, not one launch.
    let comms = ShmCollective::group(2, ShmConfig::new(4 << 20).with_max_blocks(400)).expect("group");
    assert!(two_tile_rows::<bf16>(&comms, 200, 8192, IpcRoute::OneShot, 0), "200 rows, 400 blocks");
    assert!(!two_tile_rows::<bf16>(&comms, 300, 8192, IpcRoute::OneShot, 0), "a chunked call");
    for c in comms {
        c.close().expect("close");
    }
}
