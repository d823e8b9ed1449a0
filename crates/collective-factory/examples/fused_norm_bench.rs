//! The fused all_reduce + residual + RMSNorm next to its parts, ranks as threads on the GPUs
//! there are, in one run (issue 29's measurement): per world, hidden and row count, the
//! slowest rank's median time per call (CUDA events on each rank's stream, 20 calls a sample)
//! of
//!
//! * `ar`: the all_reduce alone (`x` -> `y`, the agreed route: `route`);
//! * `unfused`: the all_reduce, then the residual + RMSNorm kernel launched on its own;
//! * `fused`: `all_reduce_residual_rmsnorm` (one kernel where `collective_factory::one_kernel`
//!   says: on the IPC routes up to `ONE_KERNEL_MAX_ROWS` rows and no more than a launch's
//!   blocks, on RS+AG from `GATHERED_MIN_ROWS`; else the all_reduce then the norm kernel);
//! * `one kernel` (graphs only): the same call forced into the one-kernel form at every row
//!   count (`NormBackend::all_reduce_then_norm` on the fused call's IPC route, `fused route`:
//!   the table's `all_reduce_residual_rmsnorm` rules, else the all_reduce's), the measurement
//!   behind `ONE_KERNEL_MAX_ROWS`;
//!
//! eager (calls enqueued one by one) and replayed from a CUDA graph of the 20 calls, with
//! `fused / ar` (the issue's goal: at most 1.10), a check that `fused`, `unfused` and `one
//! kernel` give the same bits (`y` and `h`), and a check of every rank's `y` and `h` against
//! the reference, `fixed_tree::residual_rmsnorm`, and the form `fused` takes (`fused form`: one
//! kernel or two launches).
//!
//! `floor` is the least `fused / ar` (graphs) the memory allows: besides what the all_reduce
//! moves, the fused call must read the residual and write `y` (it writes `h` where the
//! all_reduce writes its sum), `2 * bytes/rank` more per rank, and the ranks sharing a GPU share
//! its memory, whose peak is the device's memory clock x bus width (double data rate). So
//! `floor = 1 + 2 * bytes/rank * ranks per GPU / peak / graph ar`: where it is above 1.10 the
//! issue's goal cannot be met on that machine by any kernel (with a GPU per rank, peer reads
//! over NVLink dominate and the floor falls back towards 1). The inputs differ per element and rank and
//! repeat every [`PERIOD`] rows, so the reference of `PERIOD` rows checks every row at every
//! batch size and position (batch invariance with it). The residual is updated in place (`h`
//! over it, as engines call it), so successive timed calls see a growing residual: the same
//! work per call; the checks start from the initial residual.
//!
//! ```text
//! fused_norm_bench [--worlds 2,4,8] [--hidden 4096,8192] [--rows 1,8,64,512,2048,8192]
//! ```
#![cfg_attr(not(feature = "cuda"), allow(unused))]

/// Rows after which the inputs repeat (prime to the row counts measured, so a row's position
/// in the tile and the grid varies between its copies).
const PERIOD: usize = 5;

/// Element `k` of a row-periodic input of seed `seed` (a rank, or 100 for the residual, 101 for
/// the weight): spread over about [-3.3, 3.7] so that sums round.
#[cfg(feature = "cuda")]
fn value(k: usize, seed: usize) -> collective_factory::half::bf16 {
    collective_factory::half::bf16::from_f32(((k * 37 + seed * 101) % 997) as f32 * 0.0071 - 3.3)
}

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use collective_core::fixed_tree::{RmsNormShape, residual_rmsnorm};
    use collective_core::{Collective, DType, Io, IpcRoute, Op, RawMut, RawRef, RmsNorm};
    use collective_factory::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, sys};
    use collective_factory::half::bf16;
    use collective_factory::nodes::CallStream;
    use collective_factory::{Config, NormBackend, nvidia};
    use cuda_ipc::NormArgs;
    use detcoll_protocol::norm::NormParams;
    /// A rank's medians (eager ar, unfused, fused; graph ar, unfused, fused, one kernel), whether
    /// its three forms gave the same bits, whether they are the reference's, and the form the
    /// front door takes (`collective_factory::one_kernel`).
    type Outcome = ([f64; 7], bool, bool, &'static str);

    let arg = |name: &str, default: &str| -> Vec<usize> {
        let a: Vec<String> = std::env::args().collect();
        let v = a.iter().position(|x| x == name).and_then(|i| a.get(i + 1)).map_or(default.to_string(), |s| s.clone());
        v.split(',').map(|x| x.trim().parse().expect("a number")).collect()
    };
    let (worlds, hiddens, rows_list) =
        (arg("--worlds", "2,4,8"), arg("--hidden", "4096,8192"), arg("--rows", "1,8,64,512,2048,8192"));
    println!(
        "| world | hidden | rows | bytes/rank | ar us | unfused us | fused us | fused/ar | unfused/ar \
         | graph: ar us | unfused us | fused us | fused/ar | one kernel us | one kernel/ar | route | fused route | same bits \
         | = reference | fused form | floor |"
    );
    println!(
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- | :--- | :---: | :---: | :--- | ---: |"
    );
    for &world in &worlds {
        let comms = nvidia::thread_group(world, &Config::new().with_capacity(64 << 20))?;
        // The memory's peak in bytes per second, and how many ranks share rank 0's GPU.
        let peak = {
            use sys::CUdevice_attribute as A;
            let ctx = comms[0].context();
            let clock_khz = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).map_err(|x| x.to_string())?;
            let bus_bits = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).map_err(|x| x.to_string())?;
            clock_khz as f64 * 1e3 * 2.0 * bus_bits as f64 / 8.0
        };
        let sharing = comms.iter().filter(|c| c.context().ordinal() == comms[0].context().ordinal()).count();
        for &hidden in &hiddens {
            for &rows in &rows_list {
                let n = rows * hidden;
                // Every rank's inputs (rows repeating every PERIOD) and the reference's h and y
                // of one period.
                let periodic =
                    |seed: usize| -> Vec<bf16> { (0..n).map(|k| value(k % (PERIOD * hidden), seed)).collect() };
                let period_rows = PERIOD.min(rows);
                let one_period =
                    |seed: usize| -> Vec<bf16> { (0..period_rows * hidden).map(|k| value(k, seed)).collect() };
                let xs: Vec<Vec<bf16>> = (0..world).map(one_period).collect();
                let refs: Vec<&[bf16]> = xs.iter().map(Vec::as_slice).collect();
                let (mut h_ref, mut y_ref) =
                    (vec![bf16::ZERO; period_rows * hidden], vec![bf16::ZERO; period_rows * hidden]);
                let weight_host: Vec<bf16> = (0..hidden).map(|j| value(j, 101)).collect();
                let shape = RmsNormShape { rows: period_rows, hidden };
                residual_rmsnorm(&refs, &one_period(100), &weight_host, 1e-6, shape, &mut h_ref, &mut y_ref)
                    .map_err(|e| e.to_string())?;
                let (h_ref, y_ref, weight_host) = (&h_ref, &y_ref, &weight_host);
                let periodic = &periodic;
                // Per rank: (ar, unfused, fused) median microseconds and the outputs' bits.
                let barrier = std::sync::Barrier::new(world);
                let barrier = &barrier;
                // The routes the table gives this all_reduce and the fused call's all_reduce
                // (the same on every rank).
                let ar_route = comms[0].route(Op::AllReduce, n * 2);
                let route = comms[0].fused_norm_route(n * 2);
                let per_rank: Vec<Result<Outcome, String>> = std::thread::scope(|s| {
                    let hs: Vec<_> = comms
                        .iter()
                        .map(|comm| {
                            s.spawn(move || -> Result<Outcome, String> {
                                let e = |e: &dyn std::fmt::Display| e.to_string();
                                let stream = comm.context().new_stream().map_err(|x| e(&x))?;
                                let x = stream.clone_htod(&periodic(comm.rank())).map_err(|x| e(&x))?;
                                let res0 = stream.clone_htod(&periodic(100)).map_err(|x| e(&x))?;
                                let weight = stream.clone_htod(weight_host).map_err(|x| e(&x))?;
                                let mut y: CudaSlice<bf16> = stream.alloc_zeros(n).map_err(|x| e(&x))?;
                                let mut residual: CudaSlice<bf16> = stream.alloc_zeros(n).map_err(|x| e(&x))?;
                                let (xp, _g1) = x.device_ptr(&stream);
                                let (wp, _g2) = weight.device_ptr(&stream);
                                let (yp, _g3) = y.device_ptr_mut(&stream);
                                let (rp, _g4) = residual.device_ptr_mut(&stream);
                                let (r0p, _g5) = res0.device_ptr(&stream);
                                // The bits of `n` bf16 at `ptr`, after the stream's work.
                                let dl = |ptr: u64| {
                                    let mut out = vec![0u16; n];
                                    comm.context().bind_to_thread().expect("bind");
                                    // SAFETY: `ptr` holds `n` bf16 of this context; synchronous
                                    // copy after the stream was synchronised.
                                    let r = unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr, n * 2) };
                                    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
                                    out
                                };
                                let reset = || {
                                    // SAFETY: both hold `n` bf16; ordered on this stream.
                                    let r = unsafe { sys::cuMemcpyDtoDAsync_v2(rp, r0p, n * 2, stream.cu_stream()) };
                                    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
                                };
                                // The all_reduce's `x` -> `y`.
                                // SAFETY: the buffers above, alive and borrowed for the whole
                                // measurement, ordered on `stream`.
                                let xy = || unsafe {
                                    Io::OutOfPlace {
                                        input: RawRef::from_raw(xp, n, DType::BF16),
                                        output: RawMut::from_raw(yp, n, DType::BF16),
                                    }
                                };
                                let ar = || comm.all_reduce(xy(), &stream).map_err(|x| e(&x));
                                let norm_args = NormArgs {
                                    sum: yp,
                                    residual: rp,
                                    weight: wp,
                                    h: rp,
                                    y: yp,
                                    rows,
                                    hidden,
                                    eps: 1e-6,
                                    dtype: DType::BF16,
                                };
                                let unfused = || {
                                    ar()?;
                                    let ipc = comm.ipc().ok_or("no IPC backend")?;
                                    ipc.residual_rmsnorm(&norm_args, CallStream::Safe(&stream)).map_err(|x| e(&x))
                                };
                                // SAFETY: as for `xy`.
                                let fused = || unsafe {
                                    let norm = RmsNorm {
                                        residual: Io::InPlace(RawMut::from_raw(rp, n, DType::BF16)),
                                        weight: RawRef::from_raw(wp, hidden, DType::BF16),
                                        hidden,
                                        eps: 1e-6,
                                    };
                                    comm.all_reduce_residual_rmsnorm(xy(), norm, &stream).map_err(|x| e(&x))
                                };
                                // The one-kernel form at any row count, on the fused call's IPC route
                                // (world 1 and the transport routes: the fused call as it is).
                                let one_kernel = || {
                                    let (Some(r), Some(ipc)) = (IpcRoute::of(route), comm.ipc()) else {
                                        return fused();
                                    };
                                    let both = ipc
                                        .all_reduce_then_norm(xy(), r, &norm_args, true, 0, CallStream::Safe(&stream))
                                        .map_err(|x| e(&x))?;
                                    if both {
                                        Ok(())
                                    } else {
                                        ipc.residual_rmsnorm(&norm_args, CallStream::Safe(&stream)).map_err(|x| e(&x))
                                    }
                                };
                                // The form the front door takes for this call (world 1: a copy,
                                // then the norm's launch).
                                let form = match (IpcRoute::of(route), comm.ipc()) {
                                    (Some(r), Some(ipc)) if world > 1 => {
                                        let packed = NormParams::pack(&norm_args).map_err(|x| e(&x))?;
                                        let at_any_size = || ipc.one_kernel_at_any_size(&xy(), r, &packed);
                                        if collective_factory::one_kernel(rows, ipc.epilogue_rows(), at_any_size) {
                                            "one kernel"
                                        } else {
                                            "two launches"
                                        }
                                    }
                                    _ => "two launches",
                                };
                                let ctx = comm.context();
                                let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
                                let time = |f: &dyn Fn() -> Result<(), String>| -> Result<f64, String> {
                                    let mut samples = Vec::new();
                                    for _ in 0..3 {
                                        f()?;
                                        let (a, b) = (
                                            ctx.new_event(flags).map_err(|x| e(&x))?,
                                            ctx.new_event(flags).map_err(|x| e(&x))?,
                                        );
                                        a.record(&stream).map_err(|x| e(&x))?;
                                        for _ in 0..20 {
                                            f()?;
                                        }
                                        b.record(&stream).map_err(|x| e(&x))?;
                                        b.synchronize().map_err(|x| e(&x))?;
                                        samples.push(f64::from(a.elapsed_ms(&b).map_err(|x| e(&x))?) * 1e3 / 20.0);
                                    }
                                    samples.sort_by(f64::total_cmp);
                                    Ok(samples[1])
                                };
                                // The same 20 calls captured into a graph and replayed. Every rank
                                // has instantiated and uploaded its graph (which may synchronise
                                // the device) before any replays: a replay waits for its peers.
                                let graph_time = |f: &dyn Fn() -> Result<(), String>| -> Result<f64, String> {
                                    stream.synchronize().map_err(|x| e(&x))?;
                                    barrier.wait();
                                    stream
                                        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                                        .map_err(|x| e(&x))?;
                                    let enq = (0..20).try_for_each(|_| f());
                                    let g = stream.end_capture(sys::CUgraphInstantiate_flags_enum(0));
                                    enq?;
                                    let g = g.map_err(|x| e(&x))?.ok_or("an empty graph")?;
                                    g.upload().map_err(|x| e(&x))?;
                                    stream.synchronize().map_err(|x| e(&x))?;
                                    barrier.wait();
                                    let mut samples = Vec::new();
                                    for _ in 0..3 {
                                        g.launch().map_err(|x| e(&x))?;
                                        let (a, b) = (
                                            ctx.new_event(flags).map_err(|x| e(&x))?,
                                            ctx.new_event(flags).map_err(|x| e(&x))?,
                                        );
                                        a.record(&stream).map_err(|x| e(&x))?;
                                        g.launch().map_err(|x| e(&x))?;
                                        b.record(&stream).map_err(|x| e(&x))?;
                                        b.synchronize().map_err(|x| e(&x))?;
                                        samples.push(f64::from(a.elapsed_ms(&b).map_err(|x| e(&x))?) * 1e3 / 20.0);
                                    }
                                    samples.sort_by(f64::total_cmp);
                                    stream.synchronize().map_err(|x| e(&x))?;
                                    barrier.wait();
                                    Ok(samples[1])
                                };
                                // No reset of the residual between timed calls (a copy per call
                                // would be timed with them): it grows, the work does not.
                                let t_ar = time(&ar)?;
                                let t_unfused = time(&unfused)?;
                                let t_fused = time(&fused)?;
                                let g_ar = graph_time(&ar)?;
                                let g_unfused = graph_time(&unfused)?;
                                let g_fused = graph_time(&fused)?;
                                let g_one = graph_time(&one_kernel)?;
                                // Bits: one unfused and one fused call from the same residual.
                                reset();
                                unfused()?;
                                stream.synchronize().map_err(|x| e(&x))?;
                                let (ya, ha) = (dl(yp), dl(rp));
                                reset();
                                fused()?;
                                stream.synchronize().map_err(|x| e(&x))?;
                                let (yb, hb) = (dl(yp), dl(rp));
                                reset();
                                one_kernel()?;
                                stream.synchronize().map_err(|x| e(&x))?;
                                let (yc, hc) = (dl(yp), dl(rp));
                                let same = ya == yb && ha == hb && ya == yc && ha == hc;
                                // Row i of the fused call's y and h = row i % PERIOD of the reference.
                                let row_ok = |got: &[u16], want: &[bf16]| {
                                    got.chunks(hidden.max(1)).enumerate().all(|(i, row)| {
                                        let p = (i % PERIOD) * hidden;
                                        row.iter().zip(&want[p..p + hidden]).all(|(g, w)| *g == w.to_bits())
                                    })
                                };
                                let reference = row_ok(&yb, y_ref) && row_ok(&hb, h_ref);
                                Ok(([t_ar, t_unfused, t_fused, g_ar, g_unfused, g_fused, g_one], same, reference, form))
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
                });
                let mut worst = [0f64; 7];
                let (mut same, mut reference, mut form) = (true, true, "");
                for r in per_rank {
                    let (t, s, ok, f) = r?;
                    form = f;
                    reference &= ok;
                    for i in 0..7 {
                        worst[i] = worst[i].max(t[i]);
                    }
                    same &= s;
                }
                let w = worst;
                let floor = 1.0 + 2.0 * (n * 2) as f64 * sharing as f64 / peak / (w[3] * 1e-6);
                println!(
                    "| {world} | {hidden} | {rows} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {:.3} | {} | {} | {} | {} | {} | {floor:.3} |",
                    n * 2,
                    w[0],
                    w[1],
                    w[2],
                    w[2] / w[0],
                    w[1] / w[0],
                    w[3],
                    w[4],
                    w[5],
                    w[5] / w[3],
                    w[6],
                    w[6] / w[3],
                    ar_route.name(),
                    route.name(),
                    if same { "yes" } else { "NO" },
                    if reference { "yes" } else { "NO" },
                    form
                );
            }
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("fused_norm_bench needs the `cuda` feature");
}
