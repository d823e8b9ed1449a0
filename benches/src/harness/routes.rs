//! Which routing table a run uses, and `--route`: one route forced onto every call.
//!
//! Every backend the bench builds routes each call by a table (`collective_factory::Routed`):
//! process runs through the factory, thread runs and the CPU twin through `Routed` over their
//! IPC collective, so `--threads` measures what the same table gives processes. The table is
//! [`run_routing`]: the `--route` table ([`forced_table`]) when given, else
//! `DETCOLL_ROUTING_TABLE`, else the platform's built-in table for the world size.
use super::args::BenchOp;
use collective_core::{DType, Op, Route};
use collective_factory::{Platform, Routing, RoutingTable, Rule};
use detcoll_protocol::{bulk_all_reduce_elements, bulk_scatter_elements};

/// `--route` values: every [`Route`] name but `local` (world 1 is always local).
pub fn parse_route(s: &str) -> Result<String, String> {
    match Route::parse(s.trim()) {
        Some(Route::Local) | None => {
            let names: Vec<&str> = Route::ALL.iter().filter(|r| **r != Route::Local).map(|r| r.name()).collect();
            Err(format!("`{s}`: expected one of {}", names.join(", ")))
        }
        Some(r) => Ok(r.name().to_owned()),
    }
}

/// The route `op`'s rule takes in the table forcing `route`: `route` itself, except that
/// all_gather cannot take `ipc_rs_transport_ag` (it reduces nothing; `Routing::new` refuses
/// it) and takes that route's all_gather half, `transport`. `ipc_rs_ag` is written for every
/// op as asked: it is an all_reduce route, and the backends run the other ops on `ipc_one_shot`
/// (`collective_core::ipc_route_for`), which is what their rows report.
pub fn forced_rule_route(op: Op, route: Route) -> Route {
    match (op, route) {
        (Op::AllGather, Route::IpcReduceScatterTransportAllGather) => Route::Transport,
        _ => route,
    }
}

/// The routing table forcing `route` for every op at every size, in the schema of
/// `crates/collective-factory/tables/*.json` (one rule `0..null` per op).
pub fn forced_table(route: Route, platform: Platform) -> RoutingTable {
    RoutingTable {
        platform: platform.name().to_owned(),
        source: format!("forced by the bench's --route {}: every op, every size", route.name()),
        rules: Op::ALL
            .iter()
            .map(|&op| Rule {
                op: op.name().to_owned(),
                min_bytes: 0,
                max_bytes: None,
                route: forced_rule_route(op, route).name().to_owned(),
            })
            .collect(),
    }
}

/// [`forced_table`], checked.
pub fn forced_routing(route: &str, platform: Platform) -> anyhow::Result<Routing> {
    let r = Route::parse(route).ok_or_else(|| anyhow::anyhow!("--route {route}: unknown route"))?;
    Routing::new(forced_table(r, platform)).map_err(|e| anyhow::anyhow!("--route {route}: {e}"))
}

/// The table a run of `world` ranks on `platform` uses: `--route`'s, else
/// `DETCOLL_ROUTING_TABLE`, else the built-in one (what the factory's constructors pick:
/// per world on NVIDIA, the platform's table on ROCm and the CPU twin).
pub fn run_routing(forced: Option<&str>, platform: Platform, world: usize) -> anyhow::Result<Routing> {
    if let Some(route) = forced {
        if std::env::var_os("DETCOLL_ROUTING_TABLE").is_some() {
            eprintln!("[bench] --route {route} overrides DETCOLL_ROUTING_TABLE");
        }
        return forced_routing(route, platform);
    }
    let r = match platform {
        Platform::Nvidia => Routing::from_env_for_world(platform, world),
        _ => Routing::from_env(platform),
    };
    r.map_err(|e| anyhow::anyhow!("{e}"))
}

/// Runs without a transport (threads, the CPU twin) cannot take a table that needs one.
pub fn check_no_transport(routing: &Routing, what: &str) -> anyhow::Result<()> {
    if let Some(r) = routing.routes().find(|r| r.needs_transport()) {
        anyhow::bail!(
            "the routing table routes calls to `{}`, which needs the NCCL/RCCL transport, but {what} has none \
             (run one process per rank without --threads, or use another --route / DETCOLL_ROUTING_TABLE)",
            r.name()
        );
    }
    Ok(())
}

/// Payload bytes one rank pushes to one peer on the LL push route for a call of `op` on `size`
/// per-rank input bytes (`detcoll_protocol::Plan::push_payload_bytes`): the whole
/// input for all_reduce and all_gather, one shard for reduce_scatter, and for
/// reduce_scatter_many the lanes' shards back to back, each starting on a 16-byte boundary
/// (the end of the last one).
pub fn push_payload_bytes(op: BenchOp, size: usize, dtype: DType, world: usize) -> usize {
    let esize = dtype.size();
    match op {
        BenchOp::AllReduce | BenchOp::AllGather => size,
        BenchOp::ReduceScatter => size / world.max(1),
        BenchOp::ReduceScatterMany => {
            let align = (16 / esize).max(1);
            let shard = size / esize / op.lanes() / world.max(1);
            ((op.lanes() - 1) * shard.div_ceil(align) * align + shard) * esize
        }
    }
}

/// Frame bytes the bulk push route (`ipc_push`) needs on each receiver for a call of `op` on
/// `size` per-rank input bytes (`detcoll_protocol::Plan::frame_elems`): one slot per
/// sender of the largest shard (all_gather: the input) in whole 16 bytes, twice for all_reduce
/// (the reduced shards). `None` for reduce_scatter_many, which has no bulk plan.
pub fn bulk_frame_bytes(op: BenchOp, size: usize, dtype: DType, world: usize) -> Option<usize> {
    let esize = dtype.size();
    let world = world.max(1);
    let round = |bytes: usize| bytes.div_ceil(16) * 16;
    let n = size / esize;
    match op {
        BenchOp::AllReduce => Some(2 * world * round(n.div_ceil(world) * esize)),
        BenchOp::AllGather => Some(world * round(size)),
        BenchOp::ReduceScatter => Some(world * round(n / world * esize)),
        BenchOp::ReduceScatterMany => None,
    }
}

/// The route a call runs: `route` as the collective reports it (`Collective::route`), except
/// that a push call that does not fit its slots takes the one-shot pull route, as the IPC engine
/// does (same bits; `protocol::Chunks`): `ipc_push_ll` over the LL capacity (`ll_capacity`, when
/// the backend says), `ipc_push` over the frame (`capacity`) or for reduce_scatter_many — but
/// an all_reduce or reduce_scatter over the frame runs as bulk push chunks while one 16-byte
/// piece per slot fits.
pub fn effective_route(
    route: Route,
    op: BenchOp,
    size: usize,
    dtype: DType,
    world: usize,
    capacity: usize,
    ll_capacity: Option<usize>,
) -> Route {
    match (route, ll_capacity) {
        (Route::IpcPushLl, Some(cap)) if push_payload_bytes(op, size, dtype, world) > cap => Route::IpcOneShot,
        (Route::IpcPush, _) if bulk_frame_bytes(op, size, dtype, world).is_none_or(|b| b > capacity) => {
            let chunked = match op {
                BenchOp::AllReduce => bulk_all_reduce_elements(capacity, dtype.size(), world) > 0,
                BenchOp::ReduceScatter => bulk_scatter_elements(capacity, dtype.size(), world) > 0,
                _ => false,
            };
            if chunked { Route::IpcPush } else { Route::IpcOneShot }
        }
        _ => route,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_but_local_parses() {
        for r in Route::ALL {
            match r {
                Route::Local => assert!(parse_route("local").is_err()),
                r => assert_eq!(parse_route(r.name()).unwrap(), r.name()),
            }
        }
        let e = parse_route("ipc_pull").unwrap_err();
        assert!(e.contains("ipc_push_ll") && e.contains("ipc_one_shot") && !e.contains("local"), "{e}");
    }

    #[test]
    fn forced_tables_parse_and_route_every_op_as_asked() {
        for platform in [Platform::Nvidia, Platform::Rocm, Platform::Cpu] {
            for route in Route::ALL.into_iter().filter(|r| *r != Route::Local) {
                let table = forced_table(route, platform);
                assert_eq!(table.rules.len(), Op::ALL.len());
                // The JSON the table is written as reads back through the factory's parser.
                let json = serde_json::to_string_pretty(&table).unwrap();
                let routing = Routing::from_json(&json).unwrap_or_else(|e| panic!("{route:?}: {e}\n{json}"));
                assert_eq!(routing, forced_routing(route.name(), platform).unwrap());
                for op in Op::ALL {
                    for bytes in [0, 4096, 1 << 20, 64 << 20, usize::MAX / 2] {
                        assert_eq!(routing.route(op, bytes), forced_rule_route(op, route), "{op} {bytes}");
                    }
                }
                // The LL slots are allocated exactly when the forced route is the push route.
                let ll = routing.ll_capacity(detcoll_protocol::DEFAULT_LL_CAPACITY);
                assert_eq!(ll > 0, route == Route::IpcPushLl);
                assert_eq!(check_no_transport(&routing, "x").is_err(), route.needs_transport());
            }
        }
        let r = forced_routing("ipc_rs_transport_ag", Platform::Nvidia).unwrap();
        assert_eq!(r.route(Op::AllGather, 4096), Route::Transport);
        assert_eq!(r.route(Op::AllReduce, 4096), Route::IpcReduceScatterTransportAllGather);
        let e = check_no_transport(&forced_routing("transport", Platform::Nvidia).unwrap(), "a thread run")
            .unwrap_err()
            .to_string();
        assert!(e.contains("transport") && e.contains("a thread run"), "{e}");
    }

    #[test]
    fn the_forced_routing_wins_over_the_defaults() {
        let r = run_routing(Some("ipc_push_ll"), Platform::Nvidia, 2).unwrap();
        assert!(r.routes().all(|x| x == Route::IpcPushLl));
        if std::env::var_os("DETCOLL_ROUTING_TABLE").is_none() {
            assert_eq!(
                run_routing(None, Platform::Nvidia, 2).unwrap(),
                Routing::default_for_world(Platform::Nvidia, 2)
            );
            assert_eq!(
                run_routing(None, Platform::Nvidia, 8).unwrap(),
                Routing::default_for_world(Platform::Nvidia, 8)
            );
            assert_eq!(run_routing(None, Platform::Cpu, 4).unwrap(), Routing::default_for(Platform::Cpu));
        }
    }

    #[test]
    fn push_calls_over_the_ll_capacity_report_one_shot() {
        let cap = Some(512 << 10);
        let push = |op, size, world| effective_route(Route::IpcPushLl, op, size, DType::BF16, world, 1 << 30, cap);
        assert_eq!(push(BenchOp::AllReduce, 512 << 10, 2), Route::IpcPushLl);
        assert_eq!(push(BenchOp::AllReduce, 1 << 20, 2), Route::IpcOneShot);
        assert_eq!(push(BenchOp::AllGather, 1 << 20, 8), Route::IpcOneShot);
        // reduce_scatter pushes one shard per peer: 1 MiB over 2 ranks fits 512 KiB.
        assert_eq!(push(BenchOp::ReduceScatter, 1 << 20, 2), Route::IpcPushLl);
        assert_eq!(push(BenchOp::ReduceScatter, 2 << 20, 2), Route::IpcOneShot);
        assert_eq!(push(BenchOp::ReduceScatterMany, 1 << 20, 2), Route::IpcPushLl);
        // 64 bytes of bf16 = 2 lanes of 16 elements; 2-element shards over 8 ranks, the second
        // lane's starting at 8 elements (16 bytes): payload (8 + 2) * 2 bytes.
        assert_eq!(push_payload_bytes(BenchOp::ReduceScatterMany, 64, DType::BF16, 8), 20);
        // Other routes, and backends that do not say their LL capacity, are left alone.
        assert_eq!(
            effective_route(Route::IpcOneShot, BenchOp::AllReduce, 64 << 20, DType::BF16, 2, 1 << 30, cap),
            Route::IpcOneShot
        );
        assert_eq!(
            effective_route(Route::IpcPushLl, BenchOp::AllReduce, 64 << 20, DType::BF16, 2, 1 << 30, None),
            Route::IpcPushLl
        );
    }

    /// The bench's mirror of the engine's rule agrees with the real plans
    /// (`Plan::single_fitted`) for sizes around every boundary.
    #[test]
    fn bulk_fit_matches_the_engine_plans() {
        use collective_core::{Io, RawMut, RawRef, validate};
        use detcoll_protocol::Chunks;
        for world in [2usize, 4, 8] {
            for op in [BenchOp::AllReduce, BenchOp::AllGather, BenchOp::ReduceScatter] {
                for elems in [world, 7 * world, 1000 * world, 4096 * world + 8 * world] {
                    let size = elems * 2;
                    let frame = bulk_frame_bytes(op, size, DType::BF16, world).unwrap();
                    // Around the frame, and far below it (chunks), down to too small for one.
                    for capacity in [frame - 1, frame, frame + 1, frame / 5, 32 * world, 16] {
                        let out = match op {
                            BenchOp::AllGather => elems * world,
                            BenchOp::ReduceScatter => elems / world,
                            _ => elems,
                        };
                        // SAFETY: never dereferenced: only addresses and lengths are planned.
                        let io = unsafe {
                            Io::OutOfPlace {
                                input: RawRef::from_raw(0x10_0000, elems, DType::BF16),
                                output: RawMut::from_raw(0x4000_0000, out, DType::BF16),
                            }
                        };
                        let call = validate(op.op(), &io, 0, world, usize::MAX).unwrap();
                        // What runs: the first plan of the engine's chunking (every chunk
                        // takes the same route).
                        let mut plans = Chunks::single(&call, 0, world, Route::IpcPush, capacity, 0).unwrap();
                        let route = plans.next().unwrap().unwrap().route;
                        let mirrored = effective_route(Route::IpcPush, op, size, DType::BF16, world, capacity, None);
                        assert_eq!(route, mirrored, "{op:?} world {world} elems {elems} capacity {capacity}");
                    }
                }
            }
        }
        assert_eq!(
            effective_route(Route::IpcPush, BenchOp::ReduceScatterMany, 4096, DType::BF16, 2, 1 << 30, None),
            Route::IpcOneShot
        );
    }
}
