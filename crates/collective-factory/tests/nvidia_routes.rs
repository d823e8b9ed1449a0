//! Route equivalence on NVIDIA GPUs: the factory's collective built with a forced routing (every
//! op through IPC one-shot; IPC reduce_scatter + all_gather; the NCCL transport; the hybrid, IPC
//! reduce_scatter + transport all_gather) must give fixed-tree's bits on every call of
//! `common::plan`: every op, f32/f16/bf16, odd and above-256-KiB sizes, in place and not,
//! reduce_scatter_many with 2 and 3 lanes, and report the forced route.
//!
//! One process per rank (CUDA IPC handles cannot be opened in the process that made them), one
//! GPU per rank (NCCL refuses two ranks on one GPU): the world is the largest of 2, 4, 8 that
//! the GPUs allow. With fewer than 2 GPUs, no CUDA or no NCCL each test prints why it skipped.
#![cfg(feature = "cuda")]
mod common;

use collective_core::bootstrap::Bootstrap;
use collective_core::conformance::{CHILD_ENV, run_processes, skip};
use collective_core::protocol::Timeouts;
use collective_core::{Op, Route};
use collective_factory::{NvidiaConfig, Routing, RoutingTable, Rule, nvidia_collective};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bounds every wait of a rank: peer flags and NCCL calls, close, and stream synchronisation.
const TIMEOUTS: Timeouts = Timeouts { peer: Duration::from_secs(60), close: Duration::from_secs(30) };
const SYNC_BOUND: Duration = Duration::from_secs(120);

/// The world these tests run, or why they cannot.
fn world() -> Result<usize, String> {
    let n = common::cuda_devices()?;
    if n < 2 {
        return Err(format!("{n} CUDA device: route equivalence needs 2+ GPUs (NCCL refuses two ranks on one GPU)"));
    }
    ccl_transport::load(Some(ccl_transport::Vendor::Nvidia)).map_err(|e| format!("NCCL is not loadable ({e})"))?;
    Ok([8, 4, 2].into_iter().find(|&w| w <= n).unwrap_or(2))
}

/// A table sending every call of `op` through `route_of(op)`.
fn forced(name: &str, route_of: fn(Op) -> Route) -> Routing {
    let rule = |op: Op| Rule { op: op.name().into(), min_bytes: 0, max_bytes: None, route: route_of(op).name().into() };
    let table =
        RoutingTable { platform: "nvidia".into(), source: format!("test: {name}"), rules: Op::ALL.map(rule).into() };
    Routing::new(table).unwrap_or_else(|e| panic!("forced routing {name}: {e}"))
}

/// Runs the plan on every rank of a world built with the forced routing `route_of`.
fn check(test: &str, route_of: fn(Op) -> Route) {
    let child = std::env::var_os(CHILD_ENV).is_some();
    // Children take the world from the launcher (run_processes ignores it there) and must not
    // touch CUDA before NCCL_NVLS_ENABLE is set.
    let world = match child {
        true => 0,
        false => match world() {
            Ok(w) => w,
            Err(why) => return skip(&why),
        },
    };
    // One world on the GPUs at a time.
    static WORLDS: Mutex<()> = Mutex::new(());
    let _one = WORLDS.lock().unwrap_or_else(|p| p.into_inner());
    let routing = forced(test, route_of);
    let make = |boot: Box<dyn Bootstrap>| {
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: no CUDA or NCCL library is loaded in this child yet, and no other thread
            // reads the environment (the bootstrap starts none; libtest's main thread waits).
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
        let boot: Arc<dyn Bootstrap> = Arc::from(boot);
        let config = NvidiaConfig { capacity: common::CAPACITY, routing: Some(routing), timeouts: TIMEOUTS };
        let comm = nvidia_collective(boot.clone(), &config).map_err(|e| format!("nvidia_collective: {e}"))?;
        let ordinal = boot.local_rank() % common::cuda_devices()?;
        common::Rank::new(comm, ordinal, SYNC_BOUND)
    };
    let case = |rank: &mut common::Rank| rank.run(&route_of);
    if let Err(e) = run_processes(world, test, make, &case, common::Rank::close) {
        panic!("{test} (world {world}):\n{e}");
    }
}

macro_rules! routes {
    ($($name:ident: $route_of:expr;)*) => {$(
        #[test]
        fn $name() {
            check(stringify!($name), $route_of)
        }
    )*};
}

routes! {
    every_op_through_ipc_one_shot_is_bit_exact: |_| Route::IpcOneShot;
    every_op_through_ipc_rs_ag_is_bit_exact: |_| Route::IpcReduceScatterAllGather;
    every_op_through_the_transport_is_bit_exact: |_| Route::Transport;
    // all_gather reduces nothing, so it cannot take the hybrid: it takes the transport (the
    // hybrid's second half); reduce_scatter takes the hybrid's IPC half.
    hybrid_ipc_rs_transport_ag_is_bit_exact: |op| match op {
        Op::AllGather => Route::Transport,
        _ => Route::IpcReduceScatterTransportAllGather,
    };
}
