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

/// Whether rank 0 of `comms` would take the row loop for a fused call of `rows x hidden` in `T`
/// by `route`, its residual `offset` elements into its buffer (1: not 16-byte aligned).
fn row_loop<T: Element + Plain>(
    comms: &[ShmCollective],
    rows: usize,
    hidden: usize,
    route: IpcRoute,
    offset: usize,
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
    comms[0].engine().fused_norm_row_loop(&Io::host(&x, &mut y), route, &packed)
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
