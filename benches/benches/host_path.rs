//! Host cost of one GPU collective call before the driver: fail-closed validation, the protocol
//! plan and the kernel-parameter packing (`collective_core::{validate, protocol::Plan,
//! protocol::params::pack}`) — everything `cuda-ipc` / `hip-ipc` do per call besides the
//! launch itself. Measured on the CPU, so it runs in CI; on an H200 host the driver's own
//! `cuLaunchKernel` of an empty kernel costs ~3.6–4.4 us (`cuda_bench launch_cost`,
//! benches/results), which this path should stay far below.
use std::hint::black_box;

use collective_core::Route;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use detcoll_benches::host_path::{fixed, one_call};

fn host_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("host_path/all_reduce_bf16_4KiB");
    for (world, route) in [(2, Route::IpcOneShot), (8, Route::IpcOneShot), (8, Route::IpcReduceScatterAllGather)] {
        let f = fixed(world);
        let id = format!("world{world}/{}", route.name());
        group.bench_function(BenchmarkId::from_parameter(id), |b| b.iter(|| black_box(one_call(&f, world, route))));
    }
    group.finish();
}

criterion_group!(benches, host_path);
criterion_main!(benches);
