//! The conformance suite every backend instantiates (the cubecl `testgen` pattern).
//!
//! A backend implements [`TestBackend`] (how to build a world of ranks and move bytes in and
//! out of its memory) and expands [`conformance_suite!`](crate::conformance_suite) in a test
//! file; that generates one `#[test]` per case × world size. Every case runs the same sequence
//! of collective calls on every rank and checks this rank's output against `fixed-tree`, bit
//! for bit (a NaN result must be NaN; its payload is not part of the contract), and that the
//! bytes around every output view are untouched.
//!
//! Cases: ops × dtypes × in-place/caller output × sizes up to capacity, unaligned offset
//! views, empty all_gather, special values, cross-TP, repeats, fail-closed validation, and
//! calls above capacity (those the backend's `Capabilities::max_call_bytes` promises).
//! [`memory::MemoryBackend`] is a trivial in-memory backend that passes; its deliberately
//! wrong flavours must fail (tested in this crate), which keeps the suite honest.

pub mod cases;
pub mod data;
pub mod faults;
mod harness;
pub mod memory;
mod process;
pub mod sequence;

pub use harness::{HostBuf, HostRank, RankEnv, TestBackend, run_owned, run_threads, skip};
pub use process::{CHILD_ENV, run_processes};

/// Staging capacity, in bytes per rank, every suite world is built with.
pub const SUITE_CAPACITY: usize = 1 << 18;

/// Expands to one `#[test]` per conformance case and world size for `$backend`
/// (an expression of a type implementing [`TestBackend`]).
///
/// ```ignore
/// collective_core::conformance_suite!(my_backend::TestHarness::new());
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::conformance_suite!(@cases $backend;
            all_reduce, all_gather, reduce_scatter, reduce_scatter_many, unaligned_views,
            empty_and_tiny, special_values, cross_tp, repeats, randomized_sequence, validation, above_capacity);
    };
    (@cases $backend:expr; $($case:ident),*) => {
        $(
            #[allow(non_snake_case)]
            mod $case {
                #[allow(unused_imports)]
                use super::*;
                fn run(world: usize, test: &str) {
                    let backend = $backend;
                    let name = module_path!();
                    let full = format!("{}::{}", name.split_once("::").map_or(name, |(_, rest)| rest), test);
                    $crate::conformance::cases::run_case(&backend, stringify!($case), world, &full);
                }
                #[test] fn world1() { run(1, "world1") }
                #[test] fn world2() { run(2, "world2") }
                #[test] fn world3() { run(3, "world3") }
                #[test] fn world4() { run(4, "world4") }
                #[test] fn world5() { run(5, "world5") }
                #[test] fn world6() { run(6, "world6") }
                #[test] fn world7() { run(7, "world7") }
                #[test] fn world8() { run(8, "world8") }
            }
        )*
    };
}
