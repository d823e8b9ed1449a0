//! The per-call host path of a GPU collective before the driver — fail-closed validation, the
//! protocol plan and the kernel-parameter packing — as one function, shared by the criterion
//! bench (`benches/host_path.rs`, time) and `examples/hp_count.rs` (a fixed number of calls,
//! for exact instruction counts under callgrind).
use collective_core::{DType, Io, Op, RawMut, RawRef, Route, validate};
use detcoll_protocol::params::{Fixed, ParamsSingle, RankMemory, THREADS, pack};
use detcoll_protocol::{Layout, Plan};
use std::hint::black_box;

/// Staging capacity of the measured collective.
pub const CAPACITY: usize = 64 << 20;
/// Elements per call: 4 KiB of bf16.
pub const ELEMENTS: usize = 2048;

/// The constant launch part of rank 1 of `world` (132 blocks, an H200's SM count).
pub fn fixed(world: usize) -> Fixed {
    let layout = Layout::new(CAPACITY, 132).expect("layout");
    let mems: Vec<RankMemory> =
        (0..world as u64).map(|q| RankMemory::one_allocation(&layout, 0x7f00_0000_0000 + (q << 32))).collect();
    Fixed::new(&layout, &mems, 1, 0x6000_0000, 10_000_000_000, THREADS)
}

/// One all_reduce of [`ELEMENTS`] bf16 by rank 1 of `world` on `route`: validate, plan, pack.
// Inlined into the callers, as the loop it replaced was: the instruction counts stay comparable.
#[inline]
pub fn one_call(f: &Fixed, world: usize, route: Route) -> ParamsSingle {
    // SAFETY: never dereferenced: only the addresses are validated and packed.
    let io = unsafe {
        Io::OutOfPlace {
            input: RawRef::from_raw(black_box(0x1000_0000), ELEMENTS, DType::BF16),
            output: RawMut::from_raw(black_box(0x2000_0000), ELEMENTS, DType::BF16),
        }
    };
    let call = validate(Op::AllReduce, &io, 1, world, CAPACITY).expect("valid call");
    let plan = Plan::single(&call, 1, world, route).expect("plan");
    pack(f, &plan, false, "bench").expect("fits")
}
