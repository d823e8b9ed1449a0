//! The conformance suite on the trivial in-memory backend, and proof that it catches wrong ones.
use collective_core::conformance::cases::run_case;
use collective_core::conformance::memory::{Flaw, MemoryBackend};

collective_core::conformance_suite!(collective_core::conformance::memory::MemoryBackend {
    flaw: collective_core::conformance::memory::Flaw::None
});

/// Runs `case` on a flawed backend and asserts the suite fails it.
fn must_fail(flaw: Flaw, case: &str, world: usize) {
    let r = std::panic::catch_unwind(|| run_case(&MemoryBackend { flaw }, case, world, "unused"));
    assert!(r.is_err(), "the suite accepted a backend with flaw {flaw:?} in case {case} at world {world}");
}

#[test]
fn suite_catches_left_fold() {
    must_fail(Flaw::LeftFold, "all_reduce", 4);
    must_fail(Flaw::LeftFold, "reduce_scatter", 8);
    must_fail(Flaw::LeftFold, "cross_tp", 8);
}

#[test]
fn suite_catches_wide_accumulation() {
    must_fail(Flaw::WideAccumulate, "all_reduce", 4);
    must_fail(Flaw::WideAccumulate, "special_values", 8);
}

#[test]
fn suite_catches_wrong_shard() {
    must_fail(Flaw::WrongShard, "reduce_scatter", 2);
    must_fail(Flaw::WrongShard, "reduce_scatter_many", 4);
}

#[test]
fn suite_catches_output_overrun() {
    must_fail(Flaw::OverrunsOutput, "all_gather", 2);
    must_fail(Flaw::OverrunsOutput, "unaligned_views", 1);
}
