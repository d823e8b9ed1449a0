"""One rank process of the GPU checks: ``python gpu_worker.py MODE OUT_DIR`` under
``detcoll.launch`` (torchrun's variables). A gloo group is the bootstrap; the tensors are CUDA
tensors on ``LOCAL_RANK % device count``; results are saved as ``rank<r>.pt`` (bit patterns),
or, for the stand-in modes (standin_checks.py), compared on the rank into ``rank<r>.json``."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import detcoll  # noqa: E402
import standin_checks  # noqa: E402
from torch_reference import DTYPES, bits, contribution  # noqa: E402

SMALL = 8 * 129  # a tail past the vector widths
LARGE = 3 * (1 << 20) // 2 + 8 * 3  # 3 MiB of bf16 through 1 MiB of staging: chunked
CAPACITY = 1 << 20


def setup():
    dist.init_process_group("gloo")
    if os.environ.get("DETCOLL_STANDIN_DEVICE") == "cpu":  # standin_checks.py's dry run without a GPU
        return detcoll.create_deterministic_collective(capacity=CAPACITY, device="cpu")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return detcoll.create_deterministic_collective(capacity=CAPACITY)  # the default (gloo) group


def ops(comm, out_dir):
    r, w = comm.rank, comm.world_size
    res = {}
    for name in DTYPES:
        for n in (SMALL, LARGE if name == "bf16" else SMALL * 8):
            x = contribution(name, r, n).cuda()
            y = x.clone()
            comm.all_reduce(y)
            res[f"ar_inplace_{name}_{n}"] = y
            res[f"ar_out_{name}_{n}"] = comm.all_reduce(x, out=torch.empty_like(x))
            res[f"ag_{name}_{n}"] = comm.all_gather(x)
            res[f"rs_{name}_{n}"] = comm.reduce_scatter(x)
        lanes = [contribution(name, r, 16 * w, seed=5).cuda(), contribution(name, r, 64 * w, seed=6).cuda()]
        for i, lane in enumerate(comm.reduce_scatter_many(lanes)):
            res[f"many{i}_{name}"] = lane
    comm.synchronize()
    torch.save({k: bits(v) for k, v in res.items()}, os.path.join(out_dir, f"rank{r}.pt"))
    # Host cost per call: enqueue time of back-to-back calls (Python + the Rust call), next to
    # the same count of torch kernel launches of the same tensor (zero_), and the device time.
    x = torch.zeros(2048, dtype=torch.bfloat16, device="cuda")
    ptr, stream = x.data_ptr(), torch.cuda.current_stream().cuda_stream
    timing = {}
    calls = (
        ("detcoll_all_reduce_4KiB", lambda: comm.all_reduce(x)),  # the Python wrapper (tensor read)
        ("extension_call_4KiB", lambda: comm.raw.call("all_reduce", ptr, 2048, "bf16", ptr, 2048, "bf16", stream)),
        ("torch_zero_4KiB", x.zero_),  # one torch kernel launch, for scale
    )
    for label, fn in calls:
        for _ in range(20):
            fn()
        comm.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        t1 = time.perf_counter()
        torch.cuda.current_stream().synchronize()
        t2 = time.perf_counter()
        timing[label] = {"host_us_per_call": (t1 - t0) / 200 * 1e6, "wall_us_per_call": (t2 - t0) / 200 * 1e6}
    comm.check()
    timing["route_4KiB"] = comm.route("all_reduce", 4096)
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(timing, f)


def graph(comm, out_dir):
    """all_reduce and all_gather captured into a CUDA graph, replayed on new inputs: once with
    capture_error_mode "thread_local" (what the Rust suites capture with), once with torch's
    default "global"."""
    r, w = comm.rank, comm.world_size
    res, errors = {}, {}
    for mode in ("thread_local", "global"):
        try:
            capture(comm, mode, r, w, res)
        except Exception as e:  # reported by the parent next to the other mode's results
            errors[mode] = f"{type(e).__name__}: {e}"
    torch.save({k: bits(v) for k, v in res.items()}, os.path.join(out_dir, f"rank{r}.pt"))
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(errors, f)


def capture(comm, mode, r, w, res):
    """One capture of both calls in `mode`, three replays on new inputs; results into `res`."""
    n = 4096
    xs = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    ys = torch.empty_like(xs)
    gs = torch.empty(w * n, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as torch recommends
        comm.all_reduce(xs, out=ys)
        comm.all_gather(xs, out=gs)
    torch.cuda.current_stream().wait_stream(side)
    comm.synchronize(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode=mode):
        comm.all_reduce(xs, out=ys)
        comm.all_gather(xs, out=gs)
    for replay in range(3):
        xs.copy_(contribution("bf16", r, n, seed=100 + replay).cuda())
        g.replay()
        torch.cuda.synchronize()
        comm.check()
        res[f"{mode}_ar_{replay}"] = ys.clone()
        res[f"{mode}_ag_{replay}"] = gs.clone()


# (rows, hidden, dtype) of the fused all_reduce + residual + RMSNorm checks: one row and 8 rows of
# the same tokens (batch invariance), a 2-launch shape (> 64 rows), a hidden that is not a
# multiple of 8 (the scalar path), f32, calls large enough for the RS+AG / bulk push routes
# and chunks of the 1 MiB staging, and at least 512 rows in one launch (bf16 and f32): on RS+AG
# one kernel whose norm reads the gathered sums in place.
NORM_SHAPES = ((1, 4096, "bf16"), (8, 4096, "bf16"), (64, 8192, "bf16"), (3, 2049, "f16"), (100, 512, "f32"),
               (300, 4096, "bf16"), (1024, 4096, "bf16"), (512, 512, "bf16"), (520, 384, "f32"))
NORM_EPS = 1e-6


def norm_inputs(rank, rows, hidden, name):
    """Rank ``rank``'s x, the shared residual and weight (CPU): seeded normals, the same tokens
    for every row count (row i is the same in the 1-row and the 8-row call)."""
    dt = DTYPES[name]

    def normal(seed, shape, scale=1.0):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=g) * scale).to(dt)

    x = normal(1000 + 17 * rank + hidden, (max(rows, 8), hidden))[:rows].contiguous()
    residual = normal(2000 + hidden, (max(rows, 8), hidden), 4.0)[:rows].contiguous()
    return x, residual, normal(3000 + hidden, (hidden,))


def fused_norm(comm, out_dir):
    """``all_reduce_residual_rmsnorm`` on CUDA tensors: in place (y into x) and with ``out=``;
    the bits of y and of the updated residual of every shape."""
    res = {}
    for rows, hidden, name in NORM_SHAPES:
        x, residual, weight = (t.cuda() for t in norm_inputs(comm.rank, rows, hidden, name))
        out = torch.empty_like(x)
        res_out = residual.clone()
        y, h = comm.all_reduce_residual_rmsnorm(x.clone(), res_out, weight, eps=NORM_EPS, out=out)
        assert y is out and h is res_out
        x2, res2 = x.clone(), residual.clone()
        y2, h2 = comm.all_reduce_residual_rmsnorm(x2, res2, weight, eps=NORM_EPS)
        assert y2 is x2 and h2 is res2
        key = f"{rows}x{hidden}_{name}"
        res[f"y_out_{key}"], res[f"h_out_{key}"] = y, h
        res[f"y_inplace_{key}"], res[f"h_inplace_{key}"] = y2, h2
    comm.synchronize()
    torch.save({k: bits(v) for k, v in res.items()}, os.path.join(out_dir, f"rank{comm.rank}.pt"))


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    comm = setup()
    if mode in standin_checks.MODES:  # compared on the rank: a report, no tensors
        report = standin_checks.MODES[mode](comm)
        with open(os.path.join(out_dir, f"rank{comm.rank}.json"), "w") as f:
            json.dump(report, f)
    else:
        {"ops": ops, "graph": graph, "fused_norm": fused_norm}[mode](comm, out_dir)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
