//! Throughput of the CPU reference `fixed_tree::reduce`, per dtype and world size, at 1 Mi
//! elements per rank. Elements/s counts output elements (one tree each).
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fixed_tree::{Element, SUPPORTED_WORLD_SIZES, reduce};
use half::{bf16, f16};

const N: usize = 1 << 20;

/// Deterministic inputs in [-1, 1): `world` ranks of `N` elements.
fn inputs<T: Element>(world: usize, from_f32: fn(f32) -> T) -> Vec<Vec<T>> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..world)
        .map(|_| {
            (0..N)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    from_f32((state >> 40) as f32 / (1u32 << 23) as f32 - 1.0)
                })
                .collect()
        })
        .collect()
}

fn bench_dtype<T: Element>(c: &mut Criterion, from_f32: fn(f32) -> T) {
    let mut group = c.benchmark_group(format!("reduce/{}", T::NAME));
    group.throughput(Throughput::Elements(N as u64));
    for world in SUPPORTED_WORLD_SIZES {
        let data = inputs(world, from_f32);
        let ranks: Vec<&[T]> = data.iter().map(Vec::as_slice).collect();
        let mut out = vec![from_f32(0.0); N];
        group.bench_with_input(BenchmarkId::from_parameter(world), &ranks, |b, ranks| {
            b.iter(|| reduce(black_box(ranks), black_box(&mut out)).expect("valid arguments"));
        });
    }
    group.finish();
}

fn reference(c: &mut Criterion) {
    bench_dtype::<f32>(c, |x| x);
    bench_dtype::<f16>(c, f16::from_f32);
    bench_dtype::<bf16>(c, bf16::from_f32);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = reference
}
criterion_main!(benches);
