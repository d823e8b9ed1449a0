//! The shared conformance suite on the NCCL transport: one rank per GPU as threads of this
//! process. World 1 runs on any host with a GPU and NCCL; larger worlds need that many GPUs
//! (NCCL refuses two ranks on one GPU) and print a skip otherwise.
#![cfg(feature = "cuda")]
mod common;

use ccl_transport::TransportConfig;
use collective_core::conformance::TestBackend;

/// The transport with both `reduce_scatter_many` paths in the suite's sizes (16 KiB packing
/// crossover) and the all_gather exchange for reduce_scatter.
struct Gather;

/// The same with reduce_scatter's all-to-all exchange for every size.
struct AllToAll;

fn run(
    world: usize,
    config: TransportConfig,
    case: &(dyn Fn(&mut common::Rank) -> Result<(), String> + Sync),
) -> Result<(), String> {
    match common::run_ranks(world, &config, |rank| case(rank)) {
        Some(r) => r,
        None => Ok(()),
    }
}

impl TestBackend for Gather {
    type Rank = common::Rank;
    fn name(&self) -> String {
        "ccl-transport (NCCL, all_gather exchange)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        run(world, TransportConfig::new(capacity).with_pack_threshold(16 << 10), case)
    }
}

impl TestBackend for AllToAll {
    type Rank = common::Rank;
    fn name(&self) -> String {
        "ccl-transport (NCCL, all-to-all reduce_scatter)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        run(world, TransportConfig::new(capacity).with_all_to_all_threshold(0).with_pack_threshold(usize::MAX), case)
    }
}

collective_core::conformance_suite!(super::Gather);

mod all_to_all {
    pub(crate) use super::AllToAll;
    collective_core::conformance_suite!(super::AllToAll);
}
