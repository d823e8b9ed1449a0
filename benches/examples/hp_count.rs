//! 100,000 calls of the host path (`detcoll_benches::host_path`) for exact instruction counts:
//! `valgrind --tool=callgrind target/release/examples/hp_count w2|w8|rs`.
use collective_core::Route;
use detcoll_benches::host_path::{fixed, one_call};
use std::hint::black_box;

fn main() {
    let (world, route) = match std::env::args().nth(1).as_deref() {
        Some("w2") => (2, Route::IpcOneShot),
        Some("w8") => (8, Route::IpcOneShot),
        _ => (8, Route::IpcReduceScatterAllGather),
    };
    let f = fixed(world);
    for _ in 0..100_000 {
        black_box(one_call(&f, world, route));
    }
}
