"""The rank side of the stand-in checks (``gpu_worker.py standins|standin_streams|standin_refusals
OUT_DIR``): torch CUDA tensors handed over as objects that offer one interface only
(tests/standins.py: ``__cuda_array_interface__`` alone, as CuPy; ``__dlpack__`` with or without
``__dlpack_device__``), as CuPy, Numba or JAX would hand them over. Each mode compares on the
rank and writes ``rank<r>.json``: ``checked`` (results compared), ``failures`` (what differed or
went wrong) and what it covered; test_gpu.py asserts on them.

* ``standins``: every op and form through each stand-in kind, bit for bit against the same calls
  on the plain torch tensors (bf16/f16/f32; a chunked size for bf16).
* ``standin_streams``: the stream a call goes on. The input is written on a stream behind a
  ~0.1 s sleep kernel and the results are copied on a stream right after the calls: a call on
  any other stream than the one checked reads the stale input or is read before it ran (torch's
  streams do not synchronise with each other), so the bits show the stream. Cases: the array
  interface's ``stream`` naming a side stream while torch's current stream is the default one;
  ``stream`` 1 (the legacy default stream) while torch's current stream is a side stream; no
  ``stream`` and ``stream: None`` (the default stream: torch's current one) on a side stream and
  on the default stream; DLPack on a side stream and on the default stream (and the stream the
  producer was asked for); a CUDA graph captured through each kind, replayed on new inputs.
* ``standin_refusals``: strided and misaligned stand-ins (each kind, as every argument of every
  op) raise ``NotContiguous`` / ``Misaligned`` (``InvalidArgument``s) and nothing is written;
  the collective keeps working.

``DEVICE = "cpu"`` (``DETCOLL_STANDIN_DEVICE=cpu``) runs the modes that need no CUDA stream on
the CPU twin with ``__array_interface__`` in place of ``__cuda_array_interface__``: a dry run of
this file where no GPU is.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import detcoll  # noqa: E402
from torch_reference import DTYPES, contribution  # noqa: E402  (puts tests/ on sys.path)
from standins import ArrayInterfaceOnly, CudaArrayInterfaceOnly, DLPackNoDevice, DLPackOnly  # noqa: E402

DEVICE = os.environ.get("DETCOLL_STANDIN_DEVICE", "cuda")
SMALL = 8 * 129
LARGE = 3 * (1 << 20) // 2 + 8 * 3  # bf16: 3 MiB through 1 MiB of staging (chunked)
SENTINEL = -7.25
SLEEP_CYCLES = 200_000_000  # ~0.1 s on an H200: the stream is still busy when the calls are enqueued
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def kinds():
    """The stand-in kinds (``torch``: the plain tensor, the reference)."""
    cai = CudaArrayInterfaceOnly if DEVICE == "cuda" else ArrayInterfaceOnly
    return {"torch": lambda t: t, "cai": cai, "dlpack": DLPackOnly, "dlpack_no_device": DLPackNoDevice}


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def differing(a, b):
    """Elements whose bits differ (the tensors compared where they are, as integers)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.numel(), b.numel())
    ints = _INT[a.element_size()]
    return int((a.contiguous().view(ints) != b.contiguous().view(ints)).sum())


def full(n, dtype, value=SENTINEL):
    return torch.full((n,), value, dtype=dtype, device=DEVICE)


# -- standins: bit-exact against plain torch tensors -------------------------------------------


def ops(comm, wrap, name, n):
    """Every op and form once, each tensor through ``wrap``; the torch tensors written."""
    r, w = comm.rank, comm.world_size
    x = contribution(name, r, n).to(DEVICE)
    dt = x.dtype
    res = {}
    y = x.clone()
    comm.all_reduce(wrap(y))
    res["all_reduce in place"] = y
    res["all_reduce"] = full(n, dt, 0.0)
    comm.all_reduce(wrap(x), out=wrap(res["all_reduce"]))
    res["all_gather"] = full(w * n, dt, 0.0)
    comm.all_gather(wrap(x), out=wrap(res["all_gather"]))
    g = full(w * n, dt, 0.0)
    g[r * n:(r + 1) * n].copy_(x)
    comm.all_gather(wrap(g[r * n:(r + 1) * n]), out=wrap(g))  # NCCL's in-place form
    res["all_gather in place"] = g
    res["reduce_scatter"] = full(n // w, dt, 0.0)
    comm.reduce_scatter(wrap(x), out=wrap(res["reduce_scatter"]))
    s = x.clone()
    ws = wrap(s)
    comm.reduce_scatter(ws, out=ws)  # in place: the shard lands at shard `rank`
    res["reduce_scatter in place"] = s[r * (n // w):(r + 1) * (n // w)]
    lanes = [contribution(name, r, 16 * w, seed=5).to(DEVICE), contribution(name, r, 64 * w, seed=6).to(DEVICE)]
    outs = [full(16, dt, 0.0), full(64, dt, 0.0)]
    comm.reduce_scatter_many([wrap(a) for a in lanes], outs=[wrap(o) for o in outs])
    res["reduce_scatter_many lane 0"], res["reduce_scatter_many lane 1"] = outs
    return res


def standins(comm):
    checked, failures = 0, []
    for name in DTYPES:
        for n in (SMALL, LARGE if name == "bf16" else SMALL * 8):
            results = {}
            for kind, wrap in kinds().items():
                try:
                    results[kind] = ops(comm, wrap, name, n)
                except Exception as e:  # reported; the other kinds still run (every rank raises alike)
                    failures.append(f"{kind} {name} n={n}: {type(e).__name__}: {e}")
            comm.synchronize()
            sync()
            want = results.get("torch", {})
            for kind, got in results.items():
                if kind == "torch":
                    continue
                for key, ref in want.items():
                    checked += 1
                    d = differing(got[key], ref)
                    if d:
                        failures.append(f"{kind} {name} n={n} {key}: {d} elements differ from the plain torch call")
    return {"checked": checked, "failures": failures, "kinds": [k for k in kinds() if k != "torch"],
            "dtypes": list(DTYPES), "sizes": [SMALL, SMALL * 8, LARGE]}


# -- standin_streams: the stream each call goes on ---------------------------------------------


class Recorder:
    """Wraps tensors with ``make`` and keeps the stand-ins (their ``calls``: DLPack)."""

    def __init__(self, make):
        self.make, self.made = make, []

    def __call__(self, t):
        s = self.make(t)
        self.made.append(s)
        return s

    def dlpack_streams(self):
        return sorted({repr(c.get("stream", "none")) for s in self.made for c in getattr(s, "calls", [])})


def three_calls(comm, wrap, x, outs, many=True):
    comm.all_reduce(wrap(x), out=wrap(outs[0]))
    comm.all_gather(wrap(x), out=wrap(outs[1]))
    if many:
        comm.reduce_scatter_many([wrap(x)], outs=[wrap(outs[2])])


def stream_case(comm, wrap, write_on, call_under, read_on, data, want):
    """``data`` written into a stale input on ``write_on`` behind a sleep; the calls made with
    torch's current stream ``call_under``; the outputs copied on ``read_on``: the bits that
    differ from ``want`` (the plain torch results of ``data``)."""
    n, w = data.numel(), comm.world_size
    x = full(n, data.dtype)
    outs = [full(n, data.dtype), full(w * n, data.dtype), full(n // w, data.dtype)]
    torch.cuda.synchronize()
    with torch.cuda.stream(write_on):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(data)
    with torch.cuda.stream(call_under):
        three_calls(comm, wrap, x, outs)
    with torch.cuda.stream(read_on):
        got = [o.clone() for o in outs]
    torch.cuda.synchronize()
    comm.check()
    labels = ("all_reduce", "all_gather", "reduce_scatter_many")
    return [f"{label}: {d} elements differ" for label, g, ref in zip(labels, got, want) for d in [differing(g, ref)] if d]


def graph_case(comm, make, data, want):
    """The calls captured in a CUDA graph through the stand-ins of ``make(capture stream)``,
    replayed on each of ``data``: the bits that differ from ``want`` (and a DLPack producer
    asked for another stream than the capture's)."""
    n, w = data[0].numel(), comm.world_size
    x = full(n, data[0].dtype, 0.0)
    outs = [full(n, x.dtype), full(w * n, x.dtype)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as torch recommends
        three_calls(comm, make(side.cuda_stream), x, outs, many=False)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        capture_stream = torch.cuda.current_stream().cuda_stream
        captured = make(capture_stream)
        three_calls(comm, captured, x, outs, many=False)
    bad = []
    for i, (d, ref) in enumerate(zip(data, want)):
        x.copy_(d)
        g.replay()
        torch.cuda.synchronize()
        comm.check()
        bad += [f"replay {i} {label}: {k} elements differ"
                for label, o, r in zip(("all_reduce", "all_gather"), outs, ref) for k in [differing(o, r)] if k]
    asked = captured.dlpack_streams()
    if asked and asked != [repr(capture_stream)]:
        bad.append(f"__dlpack__ was asked for streams {asked} in the capture, expected [{capture_stream}]")
    return bad


def standin_streams(comm):
    r, w = comm.rank, comm.world_size
    name, n = "bf16", 8192 * w
    default, side = torch.cuda.default_stream(), torch.cuda.Stream()
    data = [contribution(name, r, n, seed=300 + i).cuda() for i in range(12)]
    want = []
    for d in data:  # the plain torch calls on the default stream: the reference bits
        outs = [torch.empty_like(d), d.new_empty(w * n), d.new_empty(n // w)]
        three_calls(comm, lambda t: t, d, outs)
        want.append(outs)
    comm.synchronize()
    torch.cuda.synchronize()
    CAI = CudaArrayInterfaceOnly
    on_side = side.cuda_stream
    cases = {
        # name: (stand-in maker, write on, call under, read on, the DLPack streams asked for)
        "cai stream=side, torch current=default": (lambda t: CAI(t, stream=on_side), side, default, side, None),
        "cai stream=1 (legacy default), torch current=side": (lambda t: CAI(t, stream=1), default, side, default, None),
        "cai no stream entry, torch current=side": (lambda t: CAI(t), side, side, side, None),
        "cai stream=None, torch current=side": (lambda t: CAI(t, stream=None), side, side, side, None),
        "cai no stream entry, torch current=default": (lambda t: CAI(t), default, default, default, None),
        "dlpack, torch current=side": (DLPackOnly, side, side, side, [repr(side.cuda_stream)]),
        "dlpack, torch current=default": (DLPackOnly, default, default, default, [repr(1)]),
        "dlpack without __dlpack_device__, torch current=side": (DLPackNoDevice, side, side, side, [repr("none")]),
    }
    checked, failures, covered = 0, [], []
    for i, (label, (make, write_on, call_under, read_on, asked)) in enumerate(cases.items()):
        rec = Recorder(make)
        try:
            bad = stream_case(comm, rec, write_on, call_under, read_on, data[i], want[i])
        except Exception as e:
            bad = [f"{type(e).__name__}: {e}"]
        if asked is not None and rec.dlpack_streams() != asked:
            bad.append(f"__dlpack__ was asked for streams {rec.dlpack_streams()}, expected {asked}")
        checked += 1
        covered.append(label)
        failures += [f"{label}: {b}" for b in bad]
    graphs = {
        "graph: cai no stream entry": lambda s: Recorder(CAI),
        "graph: cai stream=capture stream": lambda s: Recorder(lambda t: CAI(t, stream=s)),
        "graph: dlpack": lambda s: Recorder(DLPackOnly),
    }
    for j, (label, make) in enumerate(graphs.items()):
        picks = [8 + j, (9 + j) % 12]
        try:
            bad = graph_case(comm, make, [data[k] for k in picks], [want[k][:2] for k in picks])
        except Exception as e:
            bad = [f"{type(e).__name__}: {e}"]
        checked += 1
        covered.append(label)
        failures += [f"{label}: {b}" for b in bad]
    return {"checked": checked, "failures": failures, "cases": covered}


# -- standin_refusals: strided and misaligned, typed, nothing written ---------------------------


ROLES = ("all_reduce x", "all_reduce out", "all_reduce in place", "all_gather x", "all_gather out",
         "reduce_scatter x", "reduce_scatter out", "reduce_scatter_many xs[1]", "reduce_scatter_many outs[1]")


def refusal(comm, make, defect, dt, role, n=64):
    """One refused call: what went wrong (None: refused with the right type, nothing written)."""
    w = comm.world_size
    op, arg = ("all_reduce", "in place") if role.endswith("in place") else role.rsplit(" ", 1)
    out_n = {"all_reduce": n, "all_gather": w * n, "reduce_scatter": n // w, "reduce_scatter_many": n // w}[op]
    bad_n = out_n if arg in ("out", "outs[1]") else n
    item = torch.empty(0, dtype=dt).element_size()
    if defect == "strided":
        base = full(2 * bad_n, dt)
        b = make(base[::2])
    else:  # the data pointer (array interface) or byte_offset (DLPack) half an element in
        base = full(bad_n + 1, dt)
        b = make(base[:bad_n], offset=item // 2)
    outs = [full(out_n, dt), full(out_n, dt)]
    x = make(full(n, dt, 1.0))
    sync()
    expected = detcoll.NotContiguous if defect == "strided" else detcoll.Misaligned
    try:
        if op == "reduce_scatter_many":
            xs = [x, b if arg == "xs[1]" else make(full(n, dt, 1.0))]
            comm.reduce_scatter_many(xs, outs=[make(outs[0]), b if arg == "outs[1]" else make(outs[1])])
        elif arg == "in place":
            comm.all_reduce(b)
        elif arg == "x":
            getattr(comm, op)(b, out=make(outs[0]))
        else:
            getattr(comm, op)(x, out=b)
        problem = f"not refused (expected {expected.__name__})"
    except detcoll.DetcollError as e:
        problem = None if isinstance(e, expected) and isinstance(e, detcoll.InvalidArgument) else \
            f"raised {type(e).__name__} ({e}), expected {expected.__name__}"
    except Exception as e:
        problem = f"raised an untyped {type(e).__name__}: {e}"
    sync()
    written = [i for i, a in enumerate([base] + outs) if differing(a, torch.full_like(a, SENTINEL))]
    if written:
        problem = (problem + "; " if problem else "") + f"arrays {written} were written"
    return problem


def standin_refusals(comm):
    checked, failures = 0, []
    for kind, make in kinds().items():
        if kind == "torch":
            continue
        for defect in ("strided", "misaligned"):
            for dt in (torch.float32, torch.bfloat16):
                for role in ROLES:
                    checked += 1
                    problem = refusal(comm, make, defect, dt, role)
                    if problem:
                        failures.append(f"{kind} {defect} {dt} {role}: {problem}")
    try:  # not poisoned: a call through each kind still gives the plain call's bits
        comm.check()
        r, w = comm.rank, comm.world_size
        x = contribution("f32", r, 8 * w, seed=9).to(DEVICE)
        ref = torch.empty_like(x)
        comm.all_reduce(x, out=ref)
        for kind, make in kinds().items():
            out = torch.empty_like(x)
            comm.all_reduce(make(x), out=make(out))
            comm.synchronize()
            sync()
            checked += 1
            if differing(out, ref):
                failures.append(f"{kind}: a good call after the refusals differs from the plain torch call")
    except Exception as e:
        failures.append(f"a good call after the refusals failed: {type(e).__name__}: {e}")
    return {"checked": checked, "failures": failures}


MODES = {"standins": standins, "standin_streams": standin_streams, "standin_refusals": standin_refusals}
