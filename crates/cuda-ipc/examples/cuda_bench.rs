//! GPU measurements of the CUDA IPC twin, one JSON object per line on stdout:
//!
//! * `fused_tree`: W = 2/4/8 bf16 inputs of 64 MiB -> one output, bandwidth (bytes read +
//!   written) against a device-to-device copy moving the same number of bytes, same run;
//! * `enqueue`: host cost of one all_reduce call (world 1, and world 8 as threads), averaged
//!   over 10,000 calls with no synchronisation inside each batch of 500;
//! * `launch_cost`: host cost per call of an all_reduce (world 1, and world 2 as threads) next
//!   to a bare `cuLaunchKernel` of an empty kernel on the same stream, same run, in batches of
//!   16, 64 and 500 calls (a stream sync between batches, not timed), so the ratio shows what
//!   detcoll adds to the driver's own launch cost;
//! * `latency`: worlds 2, 4 and 8 as threads on one GPU, all_reduce of 4 KiB .. 64 MiB by every IPC
//!   route (pull one-shot and RS+AG, push LL and bulk), per-call time of back-to-back calls
//!   (eager and CUDA graph), next to a device copy of the same bytes on every rank's stream and
//!   `world` empty kernels on `world` streams in the same run. `latency --small`: 4 and
//!   64 KiB only; `--worlds 2` and `--sizes 4096,262144` choose the worlds and sizes. Each
//!   line names `pdl`, whether `DETCOLL_PDL` left programmatic dependent launches on (they are
//!   taken where the device and driver allow: sm_90+, CUDA 12.4+).
//!
//! `cargo run --release -p cuda-ipc --example cuda_bench`. Prints `{"skipped": ...}` without a GPU.
use collective_core::{Collective, DType, Io, RawMut, RawRef, Route, RouteTable};
use cuda_ipc::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use cuda_ipc::{CudaIpcCollective, CudaIpcConfig, FusedTree};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn addr<T>(b: &CudaSlice<T>, s: &CudaStream) -> u64 {
    b.device_ptr(s).0
}

fn timed_event(ctx: &Arc<CudaContext>) -> Res<cuda_ipc::cudarc::driver::CudaEvent> {
    Ok(ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Mean milliseconds of `f` over `iters` runs on `s`, after `warmup` runs.
fn time_ms(
    ctx: &Arc<CudaContext>,
    s: &Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Res<()>,
) -> Res<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let (a, b) = (timed_event(ctx)?, timed_event(ctx)?);
    a.record(s)?;
    for _ in 0..iters {
        f()?;
    }
    b.record(s)?;
    b.synchronize()?;
    Ok(f64::from(a.elapsed_ms(&b)?) / iters as f64)
}

fn fused_tree(ctx: &Arc<CudaContext>) -> Res<()> {
    let s = ctx.new_stream()?;
    let tree = FusedTree::new(ctx)?;
    let bytes = 64usize << 20;
    let n = bytes / 2;
    for w in [2usize, 4, 8] {
        let mut inputs = Vec::new();
        for i in 0..w {
            // SAFETY: filled right below before any read.
            let b = unsafe { s.alloc::<u16>(n) }?;
            // SAFETY: `n` u16 of a live allocation, on its stream. 1.0 + i/8 in bf16.
            unsafe { sys::cuMemsetD16Async(addr(&b, &s), 0x3F80 + i as u16, n, s.cu_stream()) }.result()?;
            inputs.push(b);
        }
        // SAFETY: written by the kernel before being read.
        let out = unsafe { s.alloc::<u16>(n) }?;
        let ptrs: Vec<u64> = inputs.iter().map(|b| addr(b, &s)).collect();
        let o = addr(&out, &s);
        let t_tree = time_ms(ctx, &s, 5, 20, || {
            // SAFETY: every buffer holds `n` bf16.
            unsafe { tree.launch(&ptrs, o, n, DType::BF16, s.cu_stream()) }?;
            Ok(())
        })?;
        // The copy moves as many bytes as the tree: (W + 1) * 64 MiB read + written.
        let copy_bytes = (w + 1) * bytes / 2;
        // SAFETY: as above.
        let src = unsafe { s.alloc::<u8>(copy_bytes) }?;
        // SAFETY: as above.
        let dst = unsafe { s.alloc::<u8>(copy_bytes) }?;
        let (sp, dp) = (addr(&src, &s), addr(&dst, &s));
        let t_copy = time_ms(ctx, &s, 5, 20, || {
            // SAFETY: two live allocations of `copy_bytes`.
            unsafe { sys::cuMemcpyDtoDAsync_v2(dp, sp, copy_bytes, s.cu_stream()) }.result()?;
            Ok(())
        })?;
        let moved = ((w + 1) * bytes) as f64;
        let tree_gbps = moved / t_tree / 1e6;
        let copy_gbps = (2 * copy_bytes) as f64 / t_copy / 1e6;
        println!(
            "{{\"bench\":\"fused_tree\",\"dtype\":\"bf16\",\"world\":{w},\"bytes_per_input\":{bytes},\"tree_ms\":{t_tree:.4},\"tree_gbps\":{tree_gbps:.1},\"copy_ms\":{t_copy:.4},\"copy_gbps\":{copy_gbps:.1},\"ratio\":{:.3},\"grid\":{},\"kernels\":\"{}\"}}",
            tree_gbps / copy_gbps,
            tree.grid(),
            tree.origin()
        );
    }
    Ok(())
}

/// A bf16 buffer of `n` elements of 1.0.
fn ones(s: &Arc<CudaStream>, n: usize) -> Res<CudaSlice<u16>> {
    // SAFETY: filled right below.
    let b = unsafe { s.alloc::<u16>(n.max(1)) }?;
    // SAFETY: `n` u16 of a live allocation.
    unsafe { sys::cuMemsetD16Async(addr(&b, s), 0x3F80, n.max(1), s.cu_stream()) }.result()?;
    Ok(b)
}

fn all_reduce(c: &CudaIpcCollective, s: &CudaStream, i: u64, o: u64, n: usize) -> Res<()> {
    // SAFETY: the bench's buffers hold `n` bf16 and outlive the synchronised runs.
    let io = unsafe {
        Io::OutOfPlace { input: RawRef::from_raw(i, n, DType::BF16), output: RawMut::from_raw(o, n, DType::BF16) }
    };
    Ok(c.all_reduce(io, s)?)
}

/// Runs `f(rank, comm, stream)` on one thread per rank.
fn on_ranks<T: Send>(
    ctx: &Arc<CudaContext>,
    comms: Vec<CudaIpcCollective>,
    f: impl Fn(usize, &CudaIpcCollective, &Arc<CudaStream>) -> Res<T> + Sync,
) -> Res<Vec<T>> {
    let world = comms.len();
    let slots = Mutex::new(comms.into_iter().map(Some).collect::<Vec<_>>());
    let results: Vec<Res<T>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..world)
            .map(|r| {
                let (slots, f) = (&slots, &f);
                sc.spawn(move || -> Res<T> {
                    let comm = slots.lock().map_err(|_| "lock")?[r].take().ok_or("taken")?;
                    let s = ctx.new_stream()?;
                    let out = f(r, &comm, &s);
                    s.synchronize()?;
                    comm.check()?;
                    comm.close()?;
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("rank thread panicked".into()))).collect()
    });
    results.into_iter().collect()
}

/// Host microseconds per call of `f`, enqueued in batches of `batch` calls (a stream sync
/// between batches, not timed) until `calls` calls ran, after one untimed batch.
fn host_us_per_call(s: &CudaStream, calls: usize, batch: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    let mut timed = |on: bool| -> Res<f64> {
        let t = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        let took = t.elapsed().as_secs_f64();
        s.synchronize()?;
        Ok(if on { took } else { 0.0 })
    };
    timed(false)?;
    let batches = calls.div_ceil(batch);
    let mut host = 0f64;
    for _ in 0..batches {
        host += timed(true)?;
    }
    Ok(host / (batches * batch) as f64 * 1e6)
}

fn launch_cost(ctx: &Arc<CudaContext>) -> Res<()> {
    let n = 2048; // 4 KiB of bf16
    for world in [1usize, 2] {
        let comms = cuda_ipc::group_on_device(ctx, world, &CudaIpcConfig::new(1 << 20))?;
        let barrier = Barrier::new(world);
        let rows = on_ranks(ctx, comms, |_, c, s| {
            let tree = FusedTree::new(ctx)?;
            let (i, o) = (ones(s, n)?, ones(s, n)?);
            let (ip, op) = (addr(&i, s), addr(&o, s));
            let mut rows = Vec::new();
            for batch in [16usize, 64, 500] {
                barrier.wait();
                // SAFETY: the empty kernel on this context's stream.
                let noop = host_us_per_call(s, 10_000, batch, || Ok(unsafe { tree.launch_noop(s.cu_stream()) }?))?;
                barrier.wait();
                let ours = host_us_per_call(s, 10_000, batch, || all_reduce(c, s, ip, op, n))?;
                rows.push((batch, noop, ours));
            }
            Ok(rows)
        })?;
        for (k, &(batch, _, _)) in rows[0].iter().enumerate() {
            let mean = |f: fn(&(usize, f64, f64)) -> f64| rows.iter().map(|r| f(&r[k])).sum::<f64>() / world as f64;
            let (noop, ours) = (mean(|r| r.1), mean(|r| r.2));
            println!(
                "{{\"bench\":\"launch_cost\",\"op\":\"all_reduce\",\"world\":{world},\"bytes\":{},\"batch\":{batch},\"empty_kernel_launch_us\":{noop:.3},\"all_reduce_us\":{ours:.3},\"ratio_vs_launch\":{:.3}}}",
                n * 2,
                ours / noop
            );
        }
    }
    Ok(())
}

fn enqueue_cost(ctx: &Arc<CudaContext>) -> Res<()> {
    let calls = 10_000usize;
    let batch = 500usize;
    let n = 2048; // 4 KiB of bf16
    for world in [1usize, 8] {
        let comms = cuda_ipc::group_on_device(ctx, world, &CudaIpcConfig::new(1 << 20))?;
        let barrier = Barrier::new(world);
        let per_rank = on_ranks(ctx, comms, |_, c, s| {
            let (i, o) = (ones(s, n)?, ones(s, n)?);
            let (ip, op) = (addr(&i, s), addr(&o, s));
            for _ in 0..100 {
                all_reduce(c, s, ip, op, n)?;
            }
            s.synchronize()?;
            let mut host = 0f64;
            let mut done = 0;
            while done < calls {
                barrier.wait();
                let t = Instant::now();
                for _ in 0..batch {
                    all_reduce(c, s, ip, op, n)?;
                }
                host += t.elapsed().as_secs_f64();
                s.synchronize()?;
                done += batch;
            }
            Ok(host / calls as f64 * 1e6)
        })?;
        let mean = per_rank.iter().sum::<f64>() / per_rank.len() as f64;
        let max = per_rank.iter().cloned().fold(0f64, f64::max);
        println!(
            "{{\"bench\":\"enqueue\",\"op\":\"all_reduce\",\"world\":{world},\"bytes\":{},\"calls\":{calls},\"us_per_call_mean\":{mean:.3},\"us_per_call_max_rank\":{max:.3},\"route\":\"{}\"}}",
            n * 2,
            if world == 1 { "local" } else { "ipc_one_shot" }
        );
    }
    // World 8 driven by one host thread (round robin over the ranks): the per-call cost without
    // 8 threads contending for the driver.
    let world = 8;
    // One thread drives every rank: the engine's lockstep (which needs a thread per rank) off.
    let comms = cuda_ipc::group_on_device(ctx, world, &CudaIpcConfig::new(1 << 20).with_lockstep(false))?;
    let streams = (0..world).map(|_| ctx.new_stream()).collect::<Result<Vec<_>, _>>()?;
    let bufs = streams.iter().map(|s| Ok((ones(s, n)?, ones(s, n)?))).collect::<Res<Vec<_>>>()?;
    let ptrs: Vec<(u64, u64)> = bufs.iter().zip(&streams).map(|((i, o), s)| (addr(i, s), addr(o, s))).collect();
    for s in &streams {
        s.synchronize()?;
    }
    let mut host = 0f64;
    let rounds = calls / world;
    for k in 0..(rounds / batch).max(1) + 1 {
        let t = Instant::now();
        for _ in 0..batch.min(rounds) {
            for ((c, s), (ip, op)) in comms.iter().zip(&streams).zip(&ptrs) {
                all_reduce(c, s, *ip, *op, n)?;
            }
        }
        if k > 0 {
            host += t.elapsed().as_secs_f64();
        }
        for s in &streams {
            s.synchronize()?;
        }
    }
    let per_call = host / ((rounds / batch).max(1) * batch.min(rounds) * world) as f64 * 1e6;
    for c in &comms {
        c.check()?;
        c.close()?;
    }
    println!(
        "{{\"bench\":\"enqueue\",\"op\":\"all_reduce\",\"world\":{world},\"driver\":\"one_thread_round_robin\",\"bytes\":{},\"us_per_call\":{per_call:.3},\"route\":\"ipc_one_shot\"}}",
        n * 2
    );
    Ok(())
}

/// Per-call microseconds of `f` on every rank's stream at once (slowest rank): eager, back to
/// back, and replayed from a CUDA graph of 100 calls captured on each rank's stream.
fn eager_and_graph(
    ctx: &Arc<CudaContext>,
    comms: Vec<CudaIpcCollective>,
    iters: usize,
    f: impl Fn(&CudaIpcCollective, &Arc<CudaStream>, u64, u64) -> Res<()> + Sync,
    bytes: usize,
) -> Res<(f64, f64)> {
    let world = comms.len();
    let barrier = Barrier::new(world);
    let per_rank = on_ranks(ctx, comms, |_, c, s| {
        let (i, o) = (ones(s, bytes / 2)?, ones(s, bytes / 2 * world)?);
        let (ip, op) = (addr(&i, s), addr(&o, s));
        s.synchronize()?;
        barrier.wait();
        let eager = time_ms(ctx, s, 20, iters, || f(c, s, ip, op))?;
        let per_graph = 100;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let mut r = Ok(());
        for _ in 0..per_graph {
            r = r.and(f(c, s, ip, op));
        }
        let g = s.end_capture(sys::CUgraphInstantiate_flags_enum(0))?;
        r?;
        let g = g.ok_or("empty graph")?;
        g.upload()?;
        // Instantiation may synchronise the device: nobody replays before every rank is done.
        s.synchronize()?;
        barrier.wait();
        let graph = time_ms(ctx, s, 1, (iters / per_graph).max(3), || Ok(g.launch()?))? / per_graph as f64;
        Ok((eager, graph))
    })?;
    let max = |k: fn(&(f64, f64)) -> f64| per_rank.iter().map(k).fold(0f64, f64::max) * 1e3;
    Ok((max(|p| p.0), max(|p| p.1)))
}

/// Worlds 2, 4 and 8 as threads on one GPU: all_reduce (bf16) by each IPC route — the pull routes
/// (one-shot, RS+AG) and the push routes (LL, bulk) — eager and CUDA-graph replay, next to a
/// device-to-device copy of the same bytes on every rank's stream and `world` empty kernels on
/// `world` streams, all in the same run. One JSON line per measurement.
fn latency(ctx: &Arc<CudaContext>) -> Res<()> {
    let small = std::env::args().any(|a| a == "--small");
    // `--worlds` and `--sizes` (comma-separated) replace the defaults below.
    let list = |name: &str| -> Res<Option<Vec<usize>>> {
        let a: Vec<String> = std::env::args().collect();
        let Some(v) = a.iter().position(|x| x == name).map(|i| a.get(i + 1).cloned().unwrap_or_default()) else {
            return Ok(None);
        };
        let parsed: Result<Vec<usize>, _> = v.split(',').map(|x| x.trim().parse::<usize>()).collect();
        Ok(Some(parsed.map_err(|e| format!("{name} {v}: {e}"))?))
    };
    let (worlds, sizes_asked) = (list("--worlds")?.unwrap_or_else(|| vec![2, 4, 8]), list("--sizes")?);
    let pdl = match collective_core::env::read(cuda_ipc::PDL_ENV, collective_core::env::parse_bool)? {
        Some(false) => "off",
        _ => "on",
    };
    let tree = FusedTree::new(ctx)?;
    for world in worlds {
        // The launch floor: one empty kernel per rank stream per call, eager and replayed.
        let noop_comms = cuda_ipc::group_on_device(ctx, world, &CudaIpcConfig::new(4096))?;
        let tree_ref = &tree;
        let (noop_us, noop_graph_us) = eager_and_graph(
            ctx,
            noop_comms,
            1000,
            // SAFETY: the empty kernel on this rank's stream of this context.
            |_, s, _, _| Ok(unsafe { tree_ref.launch_noop(s.cu_stream()) }?),
            4096,
        )?;
        println!(
            "{{\"bench\":\"latency\",\"op\":\"empty_kernel\",\"world\":{world},\"eager_us_per_call\":{noop_us:.2},\"graph_us_per_call\":{noop_graph_us:.2}}}"
        );
        let sizes: &[usize] = if let Some(sizes) = &sizes_asked {
            sizes
        } else if small {
            &[4 << 10, 64 << 10]
        } else if world == 2 {
            &[4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
        } else {
            &[4 << 10, 64 << 10, 1 << 20, 16 << 20]
        };
        for &bytes in sizes {
            let iters = if bytes >= 16 << 20 { 100 } else { 1000 };
            // The copy baseline: every rank copies `bytes` on its own stream at once.
            let copy_comms = cuda_ipc::group_on_device(ctx, world, &CudaIpcConfig::new(4096))?;
            let (ce, cg) = eager_and_graph(
                ctx,
                copy_comms,
                iters,
                |_, s, i, o| {
                    // SAFETY: both buffers hold at least `bytes` bytes.
                    Ok(unsafe { sys::cuMemcpyDtoDAsync_v2(o, i, bytes, s.cu_stream()) }.result()?)
                },
                bytes,
            )?;
            println!(
                "{{\"bench\":\"latency\",\"op\":\"memcpy\",\"world\":{world},\"bytes\":{bytes},\"eager_us_per_call\":{ce:.2},\"graph_us_per_call\":{cg:.2},\"empty_kernels_us\":{noop_us:.2}}}"
            );
            let capacity = (2 * bytes + (1 << 20)).max(4 << 20);
            // Each route asked for by a table that takes it at every size.
            let only = |r: Route| CudaIpcConfig::new(capacity).with_routes(RouteTable::uniform(r));
            let mut routes =
                vec![("ipc_one_shot", only(Route::IpcOneShot)), ("ipc_rs_ag", only(Route::IpcReduceScatterAllGather))];
            if bytes <= 1 << 20 {
                routes.push(("ipc_push_ll", only(Route::IpcPushLl).with_ll_capacity(bytes)));
            }
            routes.push(("ipc_push", only(Route::IpcPush)));
            for (name, config) in routes {
                let comms = cuda_ipc::group_on_device(ctx, world, &config)?;
                let route = comms[0].route(collective_core::Op::AllReduce, bytes).name();
                let (e, g) = eager_and_graph(ctx, comms, iters, |c, s, i, o| all_reduce(c, s, i, o, bytes / 2), bytes)?;
                println!(
                    "{{\"bench\":\"latency\",\"op\":\"all_reduce\",\"dtype\":\"bf16\",\"pdl\":\"{pdl}\",\"world\":{world},\"placement\":\"threads_one_gpu\",\"bytes\":{bytes},\"asked\":\"{name}\",\"route\":\"{route}\",\"eager_us_per_call\":{e:.2},\"graph_us_per_call\":{g:.2},\"eager_vs_memcpy\":{:.3},\"graph_vs_memcpy\":{:.3},\"graph_vs_empty_kernels\":{:.3},\"graph_vs_empty_kernels_graph\":{:.3}}}",
                    e / ce,
                    g / cg,
                    g / noop_us,
                    g / noop_graph_us
                );
            }
        }
    }
    Ok(())
}

fn main() {
    let ctx = match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => match cuda_ipc::driver::open_device(0) {
            Ok(c) => c,
            Err(e) => {
                println!("{{\"skipped\":\"{e}\"}}");
                return;
            }
        },
        Ok(_) => {
            println!("{{\"skipped\":\"no CUDA device\"}}");
            return;
        }
        Err(e) => {
            println!("{{\"skipped\":\"{}\"}}", e.to_string().replace('"', "'"));
            return;
        }
    };
    // SAFETY: every buffer here is used on one stream; graphs must not record tracking events.
    unsafe { ctx.disable_event_tracking() };
    let which: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let want = |name: &str| which.is_empty() || which.iter().any(|w| w == name);
    let mut failed = false;
    for (name, f) in [
        ("fused_tree", fused_tree as fn(&Arc<CudaContext>) -> Res<()>),
        ("enqueue", enqueue_cost),
        ("launch_cost", launch_cost),
        ("latency", latency),
    ] {
        if want(name)
            && let Err(e) = f(&ctx)
        {
            println!("{{\"bench\":\"{name}\",\"error\":\"{}\"}}", e.to_string().replace('"', "'"));
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}
