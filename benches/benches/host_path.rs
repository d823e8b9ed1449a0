//! Host cost of one GPU collective call before the driver: fail-closed validation, the protocol
//! plan and the kernel-parameter packing (`collective_core::{validate, protocol::Plan,
//! protocol::params::pack}`) — everything `cuda-ipc` / `hip-ipc` do per call besides the
//! launch itself. Measured on the CPU, so it runs in CI; on an H200 host the driver's own
//! `cuLaunchKernel` of an empty kernel costs ~3.6–4.4 us (`cuda_bench launch_cost`,
//! benches/results), which this path should stay far below.
use std::hint::black_box;

use collective_core::protocol::params::{Fixed, ParamsSingle, RankMemory, THREADS, pack};
use collective_core::protocol::{Layout, Plan};
use collective_core::{DType, Io, Op, RawMut, RawRef, Route, validate};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

const CAPACITY: usize = 64 << 20;

fn fixed(world: usize, rank: usize) -> Fixed {
    let layout = Layout::new(CAPACITY, 132).expect("layout");
    let mems: Vec<RankMemory> =
        (0..world as u64).map(|q| RankMemory::one_allocation(&layout, 0x7f00_0000_0000 + (q << 32))).collect();
    Fixed::new(&layout, &mems, rank, 0x6000_0000, 10_000_000_000, THREADS)
}

fn host_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("host_path/all_reduce_bf16_4KiB");
    let n = 2048;
    for (world, route) in [(2, Route::IpcOneShot), (8, Route::IpcOneShot), (8, Route::IpcReduceScatterAllGather)] {
        let f = fixed(world, 1);
        let id = format!("world{world}/{}", route.name());
        group.bench_function(BenchmarkId::from_parameter(id), |b| {
            b.iter(|| {
                // SAFETY: never dereferenced: only the addresses are validated and packed.
                let io = unsafe {
                    Io::OutOfPlace {
                        input: RawRef::from_raw(black_box(0x1000_0000), n, DType::BF16),
                        output: RawMut::from_raw(black_box(0x2000_0000), n, DType::BF16),
                    }
                };
                let call = validate(Op::AllReduce, &io, 1, world, CAPACITY).expect("valid call");
                let plan = Plan::single(&call, 1, world, route).expect("plan");
                let p: ParamsSingle = pack(&f, &plan, false, "bench").expect("fits");
                black_box(p)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, host_path);
criterion_main!(benches);
