"""detcoll next to the collectives PyTorch stacks use today, in one run, under torchrun:

    torchrun --standalone --nproc-per-node 8 python/benchmarks/benchmark_collectives.py \
        --dtype bf16 --operations all_reduce all_gather reduce_scatter \
        --size-bytes 4096 65536 1048576 16777216 --warmup 10 --iterations 50 --samples 5 \
        --output bench-out/py_tp8.json
    # the deterministic competitor: NCCL pinned to Tree/Simple, merged into the same table
    NCCL_ALGO=Tree NCCL_PROTO=Simple torchrun --standalone --nproc-per-node 8 \
        python/benchmarks/benchmark_collectives.py ... --backends nccl --label "nccl[Tree/Simple]" \
        --merge bench-out/py_tp8.json --output bench-out/py_tp8_all.json

Rows per op and size for every backend that runs here: ``detcoll`` (the fixed tree),
``nccl`` (torch.distributed as configured: NOT deterministic across algorithms/channels),
``symm_mem`` (torch symmetric-memory one-shot all_reduce, where available) and ``vllm_ca``
(vLLM's custom all-reduce, when ``vllm`` imports and enables it). Per row: the slowest rank's
median/min/max latency over ``--samples`` samples of ``--iterations`` back-to-back calls (CUDA
events on the current stream), the host time per call (enqueue only), input bandwidth, the
route detcoll took, whether a repeat gave the same bits (and every rank the same bits),
whether the result is bitwise the canonical tree, and the max abs diff vs native NCCL and vs
the tree. Without CUDA the CPU twin runs next to gloo, so the command always does its job.
Output: JSON (``--output``), a markdown table next to it (``.md``) and on stdout.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

from detcoll.reference import tree

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "f16": torch.float16, "fp32": torch.float32,
          "f32": torch.float32}
OPS = ("all_reduce", "all_gather", "reduce_scatter")
BACKENDS = ("nccl", "detcoll", "symm_mem", "vllm_ca")
SCHEMA = 1


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--operations", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--size-bytes", nargs="+", type=int, default=[4096, 65536, 1048576, 16777216],
                    help="input bytes per rank")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--output", default=None, help="JSON report (a .md table is written next to it)")
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    ap.add_argument("--label", default=None, help="row label of the native backend (default: nccl plus NCCL_ALGO/PROTO)")
    ap.add_argument("--merge", nargs="*", default=[], help="reports of earlier invocations to merge into this one's table")
    ap.add_argument("--capacity", type=int, default=None, help="detcoll staging bytes (default: 2x the largest size)")
    return ap.parse_args(argv)


def native_label(args, cuda):
    if args.label:
        return args.label
    if not cuda:
        return "gloo"
    pins = [f"{k[5:]}={os.environ[k]}" for k in ("NCCL_ALGO", "NCCL_PROTO") if os.environ.get(k)]
    return "nccl" + (f"[{','.join(pins)}]" if pins else "")


class Ctx:
    """What every measurement needs: rank layout, device, groups."""

    def __init__(self):
        self.cuda = torch.cuda.is_available()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if self.cuda:
            torch.cuda.set_device(local % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        dist.init_process_group("nccl" if self.cuda else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.gloo = dist.new_group(backend="gloo")  # objects and the detcoll bootstrap
        uuid = str(getattr(torch.cuda.get_device_properties(self.device), "uuid", self.device)) if self.cuda else ""
        everyone = self.gather((socket.gethostname(), uuid))
        # NCCL refuses two ranks on one GPU.
        self.native_ok = (not self.cuda) or len(set(everyone)) == self.world

    def gather(self, obj):
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.gloo)
        return out

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def inputs(ctx, dtype, n, rank, seed):
    g = torch.Generator().manual_seed(seed * 100_003 + rank)
    return torch.randn(n, generator=g).to(dtype).to(ctx.device)


def ints(t):
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_bits(a, b):
    return a.shape == b.shape and bool(torch.equal(ints(a), ints(b)))


def fingerprint(t):
    """A position-weighted sum of the bit patterns (wrapping int64): equal outputs, equal prints."""
    v = ints(t).flatten().to(torch.int64)
    w = torch.arange(v.numel(), device=v.device, dtype=torch.int64) % 65521 + 1
    return (int((v * w).sum()), int(v.sum()), v.numel())


def max_abs_diff(a, b):
    if a is None or b is None or a.shape != b.shape:
        return None
    d = (a.double() - b.double()).abs()
    both_inf = torch.isinf(a.double()) & (a.double() == b.double())
    d = torch.where(both_inf, torch.zeros_like(d), d)
    return float(torch.nan_to_num(d, nan=float("inf")).max()) if d.numel() else 0.0


class Backend:
    """One implementation: ``call(op, x, out)`` enqueues one call on the current stream."""

    name = "?"
    note = ""

    def route(self, op, nbytes):
        return ""


class Detcoll(Backend):
    def __init__(self, ctx, capacity):
        import detcoll

        self.name = "detcoll"
        self.comm = detcoll.create_deterministic_collective(group=ctx.gloo, capacity=capacity, device=ctx.device)

    def call(self, op, x, out):
        getattr(self.comm, op)(x, out=out)

    def route(self, op, nbytes):
        return self.comm.route(op, nbytes)


class Native(Backend):
    def __init__(self, ctx, label):
        if not ctx.native_ok:
            raise RuntimeError("NCCL refuses two ranks on one GPU (ranks share a device here)")
        self.name = label

    def call(self, op, x, out):
        if op == "all_reduce":
            out.copy_(x)  # torch's all_reduce is in place; the copy is part of every native row
            dist.all_reduce(out)
        elif op == "all_gather":
            dist.all_gather_into_tensor(out, x)
        else:
            dist.reduce_scatter_tensor(out, x)


class SymmMem(Backend):
    """torch symmetric memory's one-shot all_reduce (reads every peer's buffer, sums)."""

    def __init__(self, ctx, capacity_elems, dtype):
        import torch.distributed._symmetric_memory as symm_mem

        if not ctx.cuda:
            raise RuntimeError("needs CUDA")
        self.name = "symm_mem_one_shot"
        self.group_name = dist.group.WORLD.group_name
        self.buf = symm_mem.empty(capacity_elems, dtype=dtype, device=ctx.device)
        symm_mem.rendezvous(self.buf, self.group_name)
        self.op = torch.ops.symm_mem.one_shot_all_reduce

    def call(self, op, x, out):
        if op != "all_reduce":
            raise NotImplementedError("one-shot all_reduce only")
        n = x.numel()
        self.buf[:n].copy_(x)
        out.copy_(self.op(self.buf[:n], "sum", self.group_name))


class VllmCustomAllreduce(Backend):
    def __init__(self, ctx, max_bytes):
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce

        self.name = "vllm_custom_ar"
        self.ca = CustomAllreduce(group=ctx.gloo, device=ctx.device, max_size=max_bytes)
        if getattr(self.ca, "disabled", True):
            raise RuntimeError(f"vLLM disabled its custom all-reduce here (world {ctx.world})")

    def call(self, op, x, out):
        if op != "all_reduce":
            raise NotImplementedError("all_reduce only")
        out.copy_(self.ca.custom_all_reduce(x))


def shapes(op, n, world):
    """(input elements, output elements) per rank for ``n`` input elements."""
    return n, {"all_reduce": n, "all_gather": n * world, "reduce_scatter": n // world}[op]


def measure(ctx, be, op, x, out, args):
    for _ in range(args.warmup):
        be.call(op, x, out)
    ctx.sync()
    lat, host = [], []
    for _ in range(args.samples):
        dist.barrier(group=ctx.gloo)
        ctx.sync()
        if ctx.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        h0 = time.perf_counter()
        for _ in range(args.iterations):
            be.call(op, x, out)
        h1 = time.perf_counter()
        if ctx.cuda:
            end.record()
            end.synchronize()
            lat.append(start.elapsed_time(end) * 1e3 / args.iterations)
        else:
            lat.append((h1 - h0) * 1e6 / args.iterations)
        host.append((h1 - h0) * 1e6 / args.iterations)
    if isinstance(be, Detcoll):
        be.comm.synchronize()
    every = ctx.gather((lat, host))
    slowest = [max(r[0][s] for r in every) for s in range(args.samples)]
    host_slowest = [max(r[1][s] for r in every) for s in range(args.samples)]
    return statistics.median(slowest), min(slowest), max(slowest), statistics.median(host_slowest)


def correctness(ctx, be, op, xs, x, out):
    """(output of one call, repeat bitwise, every rank bitwise, bitwise vs the tree, diff vs tree)."""
    results = []
    for _ in range(2):
        out.zero_()
        be.call(op, x, out)
        if isinstance(be, Detcoll):
            be.comm.synchronize()
        ctx.sync()
        results.append(out.clone())
    repeat = same_bits(results[0], results[1])
    if op == "all_gather":
        want = torch.cat(xs)
    else:
        full = tree(xs)
        want = full if op == "all_reduce" else full.chunk(ctx.world)[ctx.rank]
    digest = None if op == "reduce_scatter" else fingerprint(results[0])
    ranks = ctx.gather(digest)
    ranks_same = None if digest is None else len(set(ranks)) == 1
    vs_tree = same_bits(results[0], want)
    return results[0], repeat, ranks_same, vs_tree, max_abs_diff(results[0], want)


def make_backends(ctx, args, dtype, max_elems):
    backends, notes = [], []
    capacity = args.capacity or 2 * max(args.size_bytes)
    makers = {
        "nccl": lambda: Native(ctx, native_label(args, ctx.cuda)),
        "detcoll": lambda: Detcoll(ctx, capacity),
        "symm_mem": lambda: SymmMem(ctx, max_elems, dtype),
        "vllm_ca": lambda: VllmCustomAllreduce(ctx, capacity),
    }
    for name in args.backends:
        try:
            backends.append(makers[name]())
        except Exception as e:  # a backend this host lacks: a note in the report, not a failure
            notes.append(f"{name}: unavailable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return backends, notes


def run(args):
    ctx = Ctx()
    dtype = DTYPES[args.dtype]
    esize = torch.tensor([], dtype=dtype).element_size()
    max_elems = max(args.size_bytes) // esize
    backends, notes = make_backends(ctx, args, dtype, max_elems)
    rows = []
    for op in args.operations:
        for size in args.size_bytes:
            n = size // esize
            if op == "reduce_scatter":
                n -= n % ctx.world
            xs = [inputs(ctx, dtype, n, r, seed=size) for r in range(ctx.world)]
            x = xs[ctx.rank]
            native_out = None
            for be in backends:
                row = {"op": op, "size_bytes": size, "dtype": args.dtype, "world": ctx.world, "backend": be.name,
                       "strict": isinstance(be, Detcoll)}
                try:
                    _, m_out = shapes(op, n, ctx.world)
                    out = torch.empty(m_out, dtype=dtype, device=ctx.device)
                    med, lo, hi, host = measure(ctx, be, op, x, out, args)
                    res, repeat, ranks_same, vs_tree, d_tree = correctness(ctx, be, op, xs, x, out)
                    if isinstance(be, Native):
                        native_out = res
                    row.update(median_us=med, min_us=lo, max_us=hi, host_us=host,
                               bandwidth_gbps=size / med / 1e3 if med else None, route=be.route(op, size),
                               repeat_bitwise=repeat, ranks_bitwise=ranks_same, bitwise_vs_tree=vs_tree,
                               max_abs_diff_vs_tree=d_tree,
                               max_abs_diff_vs_native=None if isinstance(be, Native) else max_abs_diff(res, native_out))
                except NotImplementedError:
                    continue  # the backend has no such op: no row
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                if ctx.rank == 0:
                    print(f"{op:15s} {size:>9d} B {be.name:22s} "
                          + (f"{row['median_us']:9.2f} us" if "median_us" in row else row.get("error", "")),
                          file=sys.stderr, flush=True)
    for be in backends:
        if isinstance(be, Detcoll):
            be.comm.close()
    return ctx, rows, notes


def fmt(v, spec="{:.2f}"):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return spec.format(v) if isinstance(v, float) else str(v)


def table(rows):
    native = {}
    for r in rows:
        if r["backend"].startswith("nccl") and "[" not in r["backend"] and "median_us" in r:
            native[(r["op"], r["size_bytes"])] = r["median_us"]
    head = ("| op | bytes | backend | median us | min | max | host us/call | GB/s | route | repeat bitwise "
            "| ranks bitwise | bitwise vs tree | max abs diff vs native | vs tree | x native |")
    cols = head.count("|") - 1
    lines = [head, "|" + "---|" * cols]
    for r in sorted(rows, key=lambda r: (r["op"], r["size_bytes"], r["backend"])):
        if "error" in r:
            lines.append(f"| {r['op']} | {r['size_bytes']} | {r['backend']} | error: {r['error']} |" + " - |" * (cols - 4))
            continue
        ratio = r["median_us"] / native[(r["op"], r["size_bytes"])] if (r["op"], r["size_bytes"]) in native else None
        lines.append("| " + " | ".join([
            r["op"], str(r["size_bytes"]), r["backend"] + ("" if r.get("strict") else " (not strict)"),
            fmt(r["median_us"]), fmt(r["min_us"]), fmt(r["max_us"]), fmt(r["host_us"]), fmt(r["bandwidth_gbps"]),
            r.get("route") or "-", fmt(r["repeat_bitwise"]), fmt(r["ranks_bitwise"]), fmt(r["bitwise_vs_tree"]),
            fmt(r["max_abs_diff_vs_native"], "{:.3g}"), fmt(r["max_abs_diff_vs_tree"], "{:.3g}"), fmt(ratio),
        ]) + " |")
    return "\n".join(lines)


def main(argv=None):
    args = parse(argv)
    ctx, rows, notes = run(args)
    if ctx.rank == 0:
        env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_", "DETCOLL_"))}
        report = {"kind": "detcoll-python-bench", "schema_version": SCHEMA, "args": vars(args), "world": ctx.world,
                  "device": torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu",
                  "torch": torch.__version__, "env": env, "notes": notes, "rows": rows, "merged_from": []}
        for path in args.merge:
            with open(path) as f:
                other = json.load(f)
            report["rows"] = other["rows"] + report["rows"]
            report["notes"] = other.get("notes", []) + report["notes"]
            report["merged_from"].append({"path": path, "env": other.get("env", {})})
        md = table(report["rows"]) + "\n\n" + "\n".join(f"- {n}" for n in report["notes"])
        print(md)
        if args.output:
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            with open(args.output, "w") as f:
                json.dump(report, f, indent=1)
            with open(os.path.splitext(args.output)[0] + ".md", "w") as f:
                f.write(md + "\n")
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
