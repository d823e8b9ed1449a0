use collective_core::protocol::params::{Fixed, ParamsSingle, RankMemory, THREADS, pack};
use collective_core::protocol::{Layout, Plan};
use collective_core::{DType, Io, Op, RawMut, RawRef, Route, validate};
use std::hint::black_box;
const CAPACITY: usize = 64 << 20;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (world, route) = match args[1].as_str() {
        "w2" => (2, Route::IpcOneShot),
        "w8" => (8, Route::IpcOneShot),
        _ => (8, Route::IpcReduceScatterAllGather),
    };
    let layout = Layout::new(CAPACITY, 132).expect("layout");
    let mems: Vec<RankMemory> =
        (0..world as u64).map(|q| RankMemory::one_allocation(&layout, 0x7f00_0000_0000 + (q << 32))).collect();
    let f = Fixed::new(&layout, &mems, 1, 0x6000_0000, 10_000_000_000, THREADS);
    let n = 2048;
    for _ in 0..100_000 {
        let io = unsafe {
            Io::OutOfPlace {
                input: RawRef::from_raw(black_box(0x1000_0000), n, DType::BF16),
                output: RawMut::from_raw(black_box(0x2000_0000), n, DType::BF16),
            }
        };
        let call = validate(Op::AllReduce, &io, 1, world, CAPACITY).expect("valid call");
        let plan = Plan::single(&call, 1, world, route).expect("plan");
        let p: ParamsSingle = pack(&f, &plan, false, "bench").expect("fits");
        black_box(p);
    }
}
